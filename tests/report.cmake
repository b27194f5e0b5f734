# trainrun report: pages written at the end of real runs and by the CLI, loaded in headless
# chromium (no console message, every chart's point count equal to the metrics' lines);
# screenshots are left in the build dir as artifacts (tests/e2e/report_browser.py).
add_test(NAME report_browser
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/e2e/report_browser.py $<TARGET_FILE:trainrun>
                 ${CMAKE_CURRENT_BINARY_DIR}/report_browser)
set_tests_properties(report_browser PROPERTIES TIMEOUT 600 LABELS report)
