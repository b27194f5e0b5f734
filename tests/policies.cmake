# Unit tests of the policy plugins (optim, cpu, single, precision, callbacks). The plugin
# sources are compiled into the test binary directly; TRAINRUN_NO_PLUGIN_ENTRY leaves out each
# plugin's entry symbol, which has the same name in every plugin.
find_package(doctest REQUIRED)
find_package(nlohmann_json 3 REQUIRED)

set(_policy_plugins optim cpu single precision callbacks)
set(_policy_sources ${CMAKE_CURRENT_SOURCE_DIR}/unit_policies.cpp)
foreach(p ${_policy_plugins})
  list(APPEND _policy_sources ${PROJECT_SOURCE_DIR}/plugins/${p}/${p}.cpp)
endforeach()

add_executable(unit_policies ${_policy_sources})
target_include_directories(unit_policies PRIVATE ${PROJECT_SOURCE_DIR}/plugins ${PROJECT_SOURCE_DIR}/plugins/comm-common)
target_link_libraries(unit_policies PRIVATE TrainrunSDK::sdk torch doctest::doctest
  nlohmann_json::nlohmann_json)
target_compile_definitions(unit_policies PRIVATE
  TRAINRUN_NO_PLUGIN_ENTRY
  TRAINRUN_BUILD_TORCH_VERSION="${Torch_VERSION}"
  TRAINRUN_BUILD_COMPILER_ID="x")
trainrun_use_pch(unit_policies)

# One CTest entry per doctest suite, so a failure names the plugin.
foreach(suite optim schedule cpu single precision callbacks)
  add_test(NAME unit_policies.${suite} COMMAND unit_policies --test-suite=${suite})
  set_tests_properties(unit_policies.${suite} PROPERTIES TIMEOUT 120)
endforeach()
