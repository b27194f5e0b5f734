#pragma once

namespace trainrun::app {

/// `trainrun report RUN_DIR [--compare OTHER_RUN_DIR]... [--output FILE]`: one self-contained
/// HTML page (Chart.js inlined, nothing fetched at view time) with a run's curves read from its
/// run directory (metrics.jsonl and metrics-rank-N.jsonl, job.toml, runtime/rank-N.json,
/// logs/rank-0.log), the memory estimate of `trainrun check` beside the measured memory, the
/// runtime banner and the resolved job; --compare overlays further runs. Default output
/// RUN_DIR/report.html. Exit 0, or 2 for a missing run directory or metrics file.
int run_report_command(int argc, char** argv);

}  // namespace trainrun::app
