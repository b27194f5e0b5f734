#pragma once
// Callback component `tensorboard`: the run's metrics as TensorBoard scalars, and the resolved
// job as a text summary, in <run_dir>/tb/ (event files written by event_file.hpp).
#include <trainrun/interfaces.hpp>

#include <memory>
#include <string>
#include <vector>

#include "event_file.hpp"

namespace trainrun::plugins {

/// Writes <run_dir>/<dir>/events.out.tfevents.* with one scalar per figure that the `metrics`
/// callback writes to metrics.jsonl, at the same steps: a step's figures under "train/<key>"
/// (loss, lr, grad_norm, epoch, step_time_s, elapsed_s, samples_per_s, tokens_per_s and every
/// figure a plugin adds, e.g. mem_peak_bytes), an evaluation's under "eval/<key>" (loss,
/// accuracy, samples, targets, time_s), as float32 (NaN stays NaN). The text summary "job" holds
/// <run_dir>/job.toml. Rank 0 only, unless all_ranks: then every rank writes its own file in the
/// same directory, and the figures that are a rank's own (step_time_s and the plugins' figures)
/// are tagged "rank_N/<key>" on every rank, the global ones "train/<key>" by rank 0 alone.
/// Every event is flushed as written, so a crash loses nothing logged. Each process starts a new
/// file (the core moves an earlier run's tb/ to previous-N/ with its other files). enabled =
/// false writes nothing.
/// The core adds this callback with its defaults to a job that lists none.
class TensorBoardCallback final : public v1::Callback {
 public:
  static void declare_options(v1::OptionSchema& schema);
  TensorBoardCallback(const v1::Options& options, const v1::RunContext& ctx);

  void on_train_start(const v1::TrainPlan& plan) override;
  void on_step_end(const v1::StepMetrics& m) override;
  void on_eval_end(const v1::EvalMetrics& m) override;
  void on_train_end(const v1::TrainSummary& summary) override;

  /// The directory this rank writes to, or "" when it writes nothing.
  const std::string& dir() const { return dir_; }
  /// The event file this rank writes, or "" before on_train_start (or when it writes nothing).
  std::string path() const { return writer_ ? writer_->path() : std::string(); }

 private:
  void open();

  int64_t every_n_steps_;
  bool all_ranks_;
  int rank_;
  std::string dir_;
  std::string job_file_;  ///< <run_dir>/job.toml, written by the core before any callback exists
  std::unique_ptr<tensorboard::EventFileWriter> writer_;
};

namespace tensorboard {

/// The scalars of one step, tagged as TensorBoardCallback describes; `global` selects the
/// figures describing the whole run (rank 0 writes them), `rank_prefix` ("" or "rank_N/")
/// tags the rank's own figures ("" puts them under "train/").
std::vector<Scalar> step_scalars(const v1::StepMetrics& m, bool global,
                                 const std::string& rank_prefix);

/// The scalars of one evaluation: "eval/loss", "eval/accuracy" (when >= 0), "eval/samples",
/// "eval/targets", "eval/time_s".
std::vector<Scalar> eval_scalars(const v1::EvalMetrics& m);

}  // namespace tensorboard

}  // namespace trainrun::plugins
