#pragma once
// A run directory as one self-contained HTML page: `trainrun report` and the `report` callback.
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace trainrun::report {

/// What the memory chart compares the measured model state with: `trainrun check`'s ZeRO
/// estimate for the run's job (computed by the caller, which has the core and the plugins).
struct Estimate {
  std::vector<std::pair<std::string, double>> series;  ///< label, model-state bytes per rank
  /// label, peak bytes per rank: the stage's total plus one micro-batch's activations (the
  /// model's v1::ActivationMemory estimate), drawn on the peak chart; empty when unknown
  std::vector<std::pair<std::string, double>> peak_series;
  std::vector<std::string> lines;                      ///< `trainrun check`'s estimate table
  std::string note;        ///< which stage is shown, or why there is no estimate
  std::string components;  ///< "model cnn | data idx | ...": the banner's first line when the
                           ///< run kept no banner of its own ("" = none)
};

/// Writes one HTML page for `run_dirs` (the first is the run, the others are overlaid) to
/// `output`, through `output`.tmp and a rename. Reads each directory's metrics.jsonl (or
/// metrics-rank-N.jsonl), job.toml, runtime/rank-N.json and logs/rank-0.log; `estimate` is
/// called once per directory. Chart.js (Debian's libjs-chart.js build) and the data are inlined:
/// the page fetches nothing. The page's data is also window.trainrunReport: charts[].datasets[]
/// with label, run (index), file, kind ("train" | "eval") and points [[step, value|null]], one
/// point per line of that kind in that file.
/// Throws std::invalid_argument naming the directory when it is missing or holds no metrics
/// file, std::runtime_error when the page cannot be written.
void write_report(const std::vector<std::string>& run_dirs, const std::string& output,
                  const std::function<Estimate(const std::string& run_dir)>& estimate);

}  // namespace trainrun::report
