# Quantization and adapters (issue 9): doctest units of the quant plugin's kernels (NF4, double
# quantization, int8), the SDK's trainrun::v1::Linear and the lora plugin, compiled from the
# plugins' sources as the other unit tests do.
find_package(doctest REQUIRED)
find_package(nlohmann_json 3 REQUIRED)

add_executable(unit_quant ${CMAKE_CURRENT_LIST_DIR}/unit_quant.cpp
  ${PROJECT_SOURCE_DIR}/plugins/quant/quant.cpp
  ${PROJECT_SOURCE_DIR}/plugins/lora/lora.cpp)
target_include_directories(unit_quant PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(unit_quant PRIVATE TrainrunSDK::sdk doctest::doctest nlohmann_json::nlohmann_json)
target_compile_definitions(unit_quant PRIVATE TRAINRUN_NO_PLUGIN_ENTRY
  TRAINRUN_BUILD_TORCH_VERSION="${Torch_VERSION}"
  TRAINRUN_BUILD_COMPILER_ID="${CMAKE_CXX_COMPILER_ID}-${CMAKE_CXX_COMPILER_VERSION}")
trainrun_use_pch(unit_quant)
foreach(suite nf4 int8 linear lora)
  add_test(NAME unit_quant.${suite} COMMAND unit_quant --test-suite=${suite})
  set_tests_properties(unit_quant.${suite} PROPERTIES TIMEOUT 120
    ENVIRONMENT "OMP_NUM_THREADS=2")
endforeach()
