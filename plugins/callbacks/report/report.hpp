#pragma once
// Callback component `report`: report.html at the end of a run, so every run leaves its curves
// behind as one page (trainrun/report/report.hpp draws it).
#include <trainrun/interfaces.hpp>

#include <string>

namespace trainrun::plugins {

/// At on_train_end, rank 0 writes <run_dir>/<output> from the run directory's files, in this
/// process (tens of milliseconds; the metrics callback has flushed every line by then). The page
/// written here has no memory estimate: that needs the core and the plugins, and building the
/// dataset and the model once more would cost every run seconds; `trainrun report RUN_DIR`
/// writes the same page with it, and the page says so. A report that fails is a warning, never
/// a failed run: the run's own files are complete by then. enabled = false writes nothing. The
/// core adds this callback with its defaults to a job that lists none.
class ReportCallback final : public v1::Callback {
 public:
  static void declare_options(v1::OptionSchema& schema);
  ReportCallback(const v1::Options& options, const v1::RunContext& ctx);

  void on_train_end(const v1::TrainSummary& summary) override;

  /// The page this rank writes, or "" when it writes none (other ranks, enabled = false).
  const std::string& output() const { return output_; }

 private:
  std::string run_dir_;
  std::string output_;
};

}  // namespace trainrun::plugins
