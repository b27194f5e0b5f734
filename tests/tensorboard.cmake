# The tensorboard callback: unit tests of its encoder (CRC-32C, TFRecord framing, protobuf bytes)
# and an end-to-end run whose event files TensorBoard's own reader (EventAccumulator, from the
# reference venv) reads back, value by value against metrics.jsonl.
find_package(doctest REQUIRED)
add_executable(unit_tensorboard ${CMAKE_CURRENT_SOURCE_DIR}/unit/unit_tensorboard.cpp)
target_include_directories(unit_tensorboard PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(unit_tensorboard PRIVATE tensorboard-objects doctest::doctest)
trainrun_use_pch(unit_tensorboard)
add_test(NAME unit_tensorboard COMMAND unit_tensorboard)
set_tests_properties(unit_tensorboard PROPERTIES TIMEOUT 60)

add_test(NAME tensorboard_e2e
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/tensorboard_e2e.sh $<TARGET_FILE:trainrun>
          ${CMAKE_CURRENT_SOURCE_DIR}/e2e ${CMAKE_CURRENT_BINARY_DIR}/work/tensorboard ${TRAINRUN_REF_PYTHON})
set_tests_properties(tensorboard_e2e PROPERTIES TIMEOUT 300
  ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
