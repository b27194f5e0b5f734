# Unit tests of the models and data plugins. Plugins are MODULE libraries, so the test links
# their component objects (<plugin>-objects, compiled once for plugin and test), not the entry
# files.
find_package(doctest REQUIRED)

add_executable(unit_models_data ${CMAKE_CURRENT_LIST_DIR}/unit/unit_models_data.cpp)
target_link_libraries(unit_models_data PRIVATE models-objects data-objects doctest::doctest)
trainrun_use_pch(unit_models_data)

# One CTest entry per doctest suite, so a failure names the area.
foreach(suite idx text gpt classifiers determinism torchscript)
  add_test(NAME unit_models_data.${suite} COMMAND unit_models_data --test-suite=${suite})
  set_tests_properties(unit_models_data.${suite} PROPERTIES TIMEOUT 120
    ENVIRONMENT "OMP_NUM_THREADS=2")
endforeach()
