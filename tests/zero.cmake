# The zero strategy (ZeRO stages 1-3) and the SDK's sharding engine: doctest units for the flat
# parameter layout (sizes not divisible by the world size, parameters smaller than it), storage
# release, and the strategy in one process (stage 3 frees unit parameters between uses and its
# gradients equal the unsharded model's; stage "auto"). The equivalence suite lines (stages 1-3
# at world 1, 2, 4 with accumulation 1 and 4, tied weights, an odd parameter count) are in
# tests/equivalence.cmake.
find_package(doctest REQUIRED)

add_executable(unit_zero ${CMAKE_CURRENT_SOURCE_DIR}/unit_zero.cpp
                         ${PROJECT_SOURCE_DIR}/plugins/zero/zero.cpp)
target_include_directories(unit_zero PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(unit_zero PRIVATE TrainrunSDK::sdk torch doctest::doctest)
target_compile_definitions(unit_zero PRIVATE
  TRAINRUN_NO_PLUGIN_ENTRY
  TRAINRUN_BUILD_TORCH_VERSION="${Torch_VERSION}"
  TRAINRUN_BUILD_COMPILER_ID="x")
trainrun_use_pch(unit_zero)
foreach(suite sharding_layout sharding_engine zero_strategy)
  add_test(NAME unit_zero.${suite} COMMAND unit_zero --test-suite=${suite})
  set_tests_properties(unit_zero.${suite} PROPERTIES TIMEOUT 60)
endforeach()
