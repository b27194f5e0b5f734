# The docs checked against the tree: every folder docs/map-of-the-code.md names exists.
add_test(NAME docs_map COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/docs_map.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(docs_map PROPERTIES TIMEOUT 30 LABELS docs)
