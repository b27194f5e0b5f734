# The ring strategy (Horovod-style negotiated, fused ring all-reduce): doctest units for the
# fusion plan and the timeline file name, end-to-end runs launched by trainrun itself on
# gloo-cpu over loopback (tests/e2e/ring_e2e.sh), and the timeline of a 2-rank gpt run validated
# against the Chrome Trace Event Format (tests/e2e/ring_timeline_check.py). The equivalence suite
# line is in tests/equivalence.cmake.
find_package(doctest REQUIRED)

add_executable(unit_ring ${CMAKE_CURRENT_SOURCE_DIR}/unit/unit_ring.cpp)
target_include_directories(unit_ring PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(unit_ring PRIVATE ring-objects doctest::doctest)
trainrun_use_pch(unit_ring)
add_test(NAME unit_ring COMMAND unit_ring)
set_tests_properties(unit_ring PROPERTIES TIMEOUT 60)

# The test models of tests/ddp.cmake (rank-dependent width, an unused layer, a gated layer).
set(_ring_test_plugins ${CMAKE_BINARY_DIR}/test-plugins/ddp-test-models)
foreach(case equivalence variants compression hierarchical shape_mismatch unused_error stall
             unused_ok)
  add_test(NAME ring_e2e.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/ring_e2e.sh $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/jobs ${CMAKE_CURRENT_BINARY_DIR}/work/ring-${case}
            ${_ring_test_plugins} ${case})
  set_tests_properties(ring_e2e.${case} PROPERTIES TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()

# Done-when: a trace from a 2-rank gpt run loads in Perfetto's format, every tensor every phase.
add_test(NAME ring_timeline
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/ring_e2e.sh $<TARGET_FILE:trainrun>
          ${CMAKE_CURRENT_SOURCE_DIR}/e2e/jobs ${CMAKE_CURRENT_BINARY_DIR}/work/ring-timeline
          ${_ring_test_plugins} timeline ${CMAKE_CURRENT_SOURCE_DIR}/e2e/equivalence/gpt.toml)
set_tests_properties(ring_timeline PROPERTIES TIMEOUT 180
  ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
