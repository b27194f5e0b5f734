# The multi-process launcher: unit tests of worker-environment detection and [launch]
# validation, the agent's supervision with small shell workers, and end-to-end launches of the
# trainrun binary on loopback (one CTest entry per case, so a failure names it).
find_package(doctest REQUIRED)

add_executable(unit_launcher unit/unit_launcher.cpp)
target_link_libraries(unit_launcher PRIVATE trainrun_core doctest::doctest)
target_compile_definitions(unit_launcher PRIVATE TRAINRUN_TEST_PLUGIN_DIR="${TRAINRUN_PLUGIN_OUTPUT_DIR}")
trainrun_use_pch(unit_launcher)
foreach(suite environment launch)
  add_test(NAME unit_launcher.${suite} COMMAND unit_launcher --test-suite=${suite})
  set_tests_properties(unit_launcher.${suite} PROPERTIES TIMEOUT 60)
endforeach()

foreach(case kill9 term_ignored sigint saving save_stuck blame store_listen stray_child launcher_killed progress mpiexec_fail mpiexec_sigint)
  add_test(NAME launcher_supervision.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/launcher_supervision.sh $<TARGET_FILE:unit_launcher>
            ${CMAKE_CURRENT_BINARY_DIR}/work/launcher-sup-${case} ${case})
  set_tests_properties(launcher_supervision.${case} PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)
endforeach()

# Each worker loads LibTorch and the plugins (about a second on 2 cores); one thread each, as
# for the other end-to-end tests.
foreach(case single_fails port_in_use two_agents node_missing sigint_rendezvous mpiexec check_no_launch run_dir_lock first_cause)
  add_test(NAME launcher_e2e.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/launcher_e2e.sh $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/jobs ${CMAKE_CURRENT_BINARY_DIR}/work/launcher-e2e-${case} ${case})
  set_tests_properties(launcher_e2e.${case} PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
