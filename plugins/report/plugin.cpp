// Entry symbol of the "report" plugin (its component is compiled into report-objects).
#include "report.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("report", "0.1.0",
                trainrun::v1::component<trainrun::v1::Callback, trainrun::plugins::ReportCallback>(
                    "report",
                    "writes <run_dir>/report.html at the end of a run (trainrun report RUN_DIR)"))
