# The CPU memory tracker and the ZeRO memory estimator: doctest units (the tracker installed as
# in trainrun's main, read through the SDK header as plugins read it; the estimator against the
# ZeRO paper's example) and end-to-end runs (metrics.jsonl, `trainrun check`).
find_package(doctest REQUIRED)

add_executable(unit_memory ${CMAKE_CURRENT_SOURCE_DIR}/unit/unit_memory.cpp)
target_link_libraries(unit_memory PRIVATE trainrun_core doctest::doctest)
target_compile_definitions(unit_memory PRIVATE TRAINRUN_TEST_PLUGIN_DIR="${TRAINRUN_PLUGIN_OUTPUT_DIR}")
trainrun_use_pch(unit_memory)
foreach(suite memory_tracker memory_estimate)
  add_test(NAME unit_memory.${suite} COMMAND unit_memory --test-suite=${suite})
  set_tests_properties(unit_memory.${suite} PROPERTIES TIMEOUT 60)
endforeach()

foreach(case single ddp check)
  add_test(NAME memory_e2e.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/memory_e2e.sh $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/jobs ${CMAKE_SOURCE_DIR}/configs/gpt-text.toml
            ${CMAKE_CURRENT_BINARY_DIR}/work/memory-${case} ${case})
  set_tests_properties(memory_e2e.${case} PROPERTIES TIMEOUT 180
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
