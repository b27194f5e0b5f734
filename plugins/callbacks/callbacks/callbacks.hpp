#pragma once
// Callback components `metrics` (JSON-lines log of every logged step and evaluation),
// `progress` (a one-line progress bar on a terminal) and `checkpoint` (when to checkpoint; the
// core writes them).
#include <trainrun/interfaces.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

namespace trainrun::plugins {

/// Writes one JSON object per logged step, and one per evaluation, to <run_dir>/<filename>.
/// Lines are flushed as written, so a crashed run keeps everything it logged; the file is
/// appended to, so a resumed run continues it. Non-finite numbers (a NaN loss) are written as
/// null, since JSON has no NaN.
class MetricsCallback final : public v1::Callback {
 public:
  static void declare_options(v1::OptionSchema& schema);
  MetricsCallback(const v1::Options& options, const v1::RunContext& ctx);

  void on_train_start(const v1::TrainPlan& plan) override;
  void on_step_end(const v1::StepMetrics& m) override;
  void on_eval_end(const v1::EvalMetrics& m) override;
  void on_train_end(const v1::TrainSummary& summary) override;

  /// The file this rank writes, or "" when this rank writes none.
  const std::string& path() const { return path_; }

 private:
  void write_line(const std::string& line);
  // Before this process's first line: rows of `step` or later already in the file are those of
  // an attempt that failed after the checkpoint this run resumed from; they move to
  // <file>.superseded, so the file holds each step once (as TensorBoard's purge_step does).
  void move_superseded(int64_t step);

  int64_t every_n_steps_;
  bool first_line_ = true;
  std::string path_;
  std::ofstream out_;
};

/// The text of one progress-bar redraw, at most `width` columns (no '\r', no newline):
/// " 42% [=====>    ] 420/1000 loss 1.2345 1234.5 samples/s ETA 1:23". The bar is dropped
/// when the width leaves it fewer than 10 columns. eta_s < 0 prints "ETA --:--".
std::string format_progress(int64_t step, int64_t total, double loss, double samples_per_s,
                            double eta_s, int width);

/// Redraws a single progress line on stderr with '\r', at most every refresh_s seconds, and
/// ends it with a newline at the end of training. Only on rank 0, and only when stderr is a
/// terminal: otherwise it does nothing, and the core's plain log lines are the record.
class ProgressCallback final : public v1::Callback {
 public:
  static void declare_options(v1::OptionSchema& schema);
  ProgressCallback(const v1::Options& options, const v1::RunContext& ctx);

  void on_train_start(const v1::TrainPlan& plan) override;
  void on_step_end(const v1::StepMetrics& m) override;
  void on_train_end(const v1::TrainSummary& summary) override;

 private:
  using Clock = std::chrono::steady_clock;
  void draw(const v1::StepMetrics& m, Clock::time_point now);

  bool active_;
  double refresh_s_;
  int64_t total_steps_ = 0;
  bool have_start_ = false;
  int64_t start_step_ = 0;
  Clock::time_point start_;
  Clock::time_point last_draw_;
  bool drawn_ = false;
  v1::StepMetrics last_;
};

/// The `checkpoint` policy (capability CheckpointPolicy): when the core writes a checkpoint and
/// how many it keeps. Options: every_n_steps (0 = off), every_n_minutes (0 = off; wall clock of
/// rank 0), keep_last (0 = all), save_on_signal (SIGTERM/SIGINT: save, then exit), save_last
/// (at the end of training), dir ("" = <run_dir>/checkpoints).
class CheckpointCallback final : public v1::Callback, public v1::CheckpointPolicy {
 public:
  static void declare_options(v1::OptionSchema& schema);
  CheckpointCallback(const v1::Options& options, const v1::RunContext& ctx);

  v1::CheckpointSettings checkpoint_settings() const override { return settings_; }
  bool should_save(int64_t step, double elapsed_s, v1::CheckpointReason reason) override;

 private:
  int64_t every_n_steps_;
  double every_n_minutes_;
  bool save_on_signal_, save_last_;
  v1::CheckpointSettings settings_;
  double last_save_s_ = 0;
};

}  // namespace trainrun::plugins
