# Unit tests of the policy plugins (optim, cpu, single, precision, callbacks). The test links
# the plugins' component objects (<plugin>-objects, compiled once for plugin and tests alike);
# the entry symbols stay in the plugins.
find_package(doctest REQUIRED)

add_executable(unit_policies ${CMAKE_CURRENT_SOURCE_DIR}/unit/unit_policies.cpp)
target_include_directories(unit_policies PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(unit_policies PRIVATE optim-objects cpu-objects single-objects
  precision-objects callbacks-objects doctest::doctest)
trainrun_use_pch(unit_policies)

# One CTest entry per doctest suite, so a failure names the plugin.
foreach(suite optim schedule cpu single precision callbacks)
  add_test(NAME unit_policies.${suite} COMMAND unit_policies --test-suite=${suite})
  set_tests_properties(unit_policies.${suite} PROPERTIES TIMEOUT 120)
endforeach()
