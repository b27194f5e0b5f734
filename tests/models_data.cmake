# Unit tests of the models and data plugins. Plugins are MODULE libraries, so their component
# files (not the entry files) are compiled into the test executable.
find_package(doctest REQUIRED)

add_executable(unit_models_data
  ${CMAKE_CURRENT_LIST_DIR}/unit_models_data.cpp
  ${PROJECT_SOURCE_DIR}/plugins/models/models.cpp
  ${PROJECT_SOURCE_DIR}/plugins/data/data.cpp)
target_link_libraries(unit_models_data PRIVATE TrainrunSDK::sdk doctest::doctest z)
target_compile_definitions(unit_models_data PRIVATE
  TRAINRUN_BUILD_TORCH_VERSION="${Torch_VERSION}"
  TRAINRUN_BUILD_COMPILER_ID="${CMAKE_CXX_COMPILER_ID}-${CMAKE_CXX_COMPILER_VERSION}")
trainrun_use_pch(unit_models_data)

# One CTest entry per doctest suite, so a failure names the area.
foreach(suite idx text gpt classifiers determinism torchscript)
  add_test(NAME unit_models_data.${suite} COMMAND unit_models_data --test-suite=${suite})
  set_tests_properties(unit_models_data.${suite} PROPERTIES TIMEOUT 120
    ENVIRONMENT "OMP_NUM_THREADS=2")
endforeach()
