# The ddp strategy: doctest units (bucket assignment; the reducer in one process through a fake
# two-rank communicator), and end-to-end runs launched by trainrun itself with 2 ranks on
# gloo-cpu over loopback, against `single` (docs/design.md, invariant 1) and with bad input.
find_package(doctest REQUIRED)

add_executable(unit_ddp ${CMAKE_CURRENT_SOURCE_DIR}/unit/unit_ddp.cpp)
target_include_directories(unit_ddp PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(unit_ddp PRIVATE ddp-objects doctest::doctest)
trainrun_use_pch(unit_ddp)
foreach(suite ddp_buckets ddp_reducer)
  add_test(NAME unit_ddp.${suite} COMMAND unit_ddp --test-suite=${suite})
  set_tests_properties(unit_ddp.${suite} PROPERTIES TIMEOUT 60)
endforeach()

# Test-only models (rank-dependent shapes, an unused layer, a layer used on some ranks only),
# in a directory of their own for --plugin-path.
set(_ddp_test_plugins ${CMAKE_BINARY_DIR}/test-plugins/ddp-test-models)
trainrun_add_plugin(ddp-test-models SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_plugins/test_models.cpp
                    NO_INSTALL)
set_target_properties(ddp-test-models PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${_ddp_test_plugins})

# Each case starts 2 ranks (and a single-process reference where it compares), one thread each.
foreach(case equivalence variants compression shape_mismatch unused_error unused_ok)
  add_test(NAME ddp_e2e.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/ddp_e2e.sh $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/jobs ${CMAKE_CURRENT_BINARY_DIR}/work/ddp-${case}
            ${_ddp_test_plugins} ${case})
  set_tests_properties(ddp_e2e.${case} PROPERTIES TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
