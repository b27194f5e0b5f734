// Entry symbol of the "report" plugin. Compiled into report-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "report.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("report", "0.1.0",
                trainrun::v1::component<trainrun::v1::Callback, trainrun::plugins::ReportCallback>(
                    "report",
                    "writes <run_dir>/report.html at the end of a run (trainrun report RUN_DIR)"))
