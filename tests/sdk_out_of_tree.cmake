# The plugin SDK used out of tree: install, build sdk/examples/loss-threshold against the
# install with find_package(TrainrunSDK), train with the installed trainrun (see the script).
add_test(NAME sdk_out_of_tree
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/sdk_out_of_tree.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}
          ${CMAKE_CURRENT_BINARY_DIR}/sdk_out_of_tree)
set_tests_properties(sdk_out_of_tree PROPERTIES TIMEOUT 600 LABELS sdk)
