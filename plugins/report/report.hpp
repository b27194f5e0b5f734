#pragma once
// Callback component `report`: `trainrun report` on the run directory once training ends, so
// every run leaves report.html (its curves, memory against the estimate, runtime, job) behind.
#include <trainrun/interfaces.hpp>

#include <string>
#include <vector>

namespace trainrun::plugins {

/// At on_train_end, rank 0 runs `<trainrun> report <run_dir> --output <run_dir>/<output>` as a
/// child process and waits for it. <trainrun> is the executable of this process when it is the
/// trainrun binary (the page is drawn by the CLI, which links the core for the memory estimate;
/// a plugin cannot); in any other host process, the callback says so once and writes nothing.
/// A report that fails is a warning, never a failed run: the run's own files are complete by
/// then. enabled = false writes nothing. The core adds this callback with its defaults to a job
/// that lists none.
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

namespace report {

/// The command line that writes the report: {exe, "report", run_dir, "--output", output}.
std::vector<std::string> command(const std::string& exe, const std::string& run_dir,
                                 const std::string& output);

/// This process's executable when its file name is "trainrun", else "" (a test binary or
/// another host that loaded the plugin).
std::string trainrun_executable();

}  // namespace report

}  // namespace trainrun::plugins
