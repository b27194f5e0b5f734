# The docs checked against the tree: every folder docs/map-of-the-code.md names exists.
add_test(NAME docs_map COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/docs_map.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(docs_map PROPERTIES TIMEOUT 30 LABELS docs)

# Every job snippet and trainrun command of README.md and docs/*.md against the binary, and every
# option of every shipped component documented (docs/contributing.md, "Documentation").
add_test(NAME docs_snippets
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/e2e/docs_snippets.py ${CMAKE_SOURCE_DIR}
                 $<TARGET_FILE:trainrun> ${CMAKE_CURRENT_BINARY_DIR}/docs_snippets)
set_tests_properties(docs_snippets PROPERTIES TIMEOUT 900 LABELS docs)
