#include "tensorboard.hpp"

#include <trainrun/plugin.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace trainrun::plugins {

namespace fs = std::filesystem;
using namespace trainrun::v1;

namespace tensorboard {

std::vector<Scalar> step_scalars(const StepMetrics& m, bool global,
                                 const std::string& rank_prefix) {
  // The keys and the collision rule of metrics.jsonl (plugins/callbacks/callbacks), so that a
  // figure has the same name in both places.
  std::vector<Scalar> out;
  const std::string own = rank_prefix.empty() ? std::string("train/") : rank_prefix;
  auto add = [&](const std::string& prefix, const std::string& key, double v) {
    out.push_back({prefix + key, static_cast<float>(v)});
  };
  if (global) {
    add("train/", "epoch", static_cast<double>(m.epoch));
    add("train/", "loss", m.loss);
    add("train/", "lr", m.lr);
    add("train/", "grad_norm", m.grad_norm);
  }
  add(own, "step_time_s", m.step_time_s);
  if (global) {
    add("train/", "elapsed_s", m.elapsed_s);
    add("train/", "samples_per_s", m.samples_per_s);
    if (m.tokens_per_s > 0) add("train/", "tokens_per_s", m.tokens_per_s);
  }
  static const std::set<std::string> standard = {
      "step", "epoch", "rank", "loss", "lr", "grad_norm", "step_time_s", "elapsed_s",
      "samples_per_s", "tokens_per_s"};
  for (const auto& [key, value] : m.extra) {
    const bool collides = standard.count(key) > 0 && (key != "tokens_per_s" || m.tokens_per_s > 0);
    add(own, collides ? "extra." + key : key, value);
  }
  return out;
}

std::vector<Scalar> eval_scalars(const EvalMetrics& m) {
  std::vector<Scalar> out;
  out.push_back({"eval/loss", static_cast<float>(m.loss)});
  if (m.accuracy >= 0) out.push_back({"eval/accuracy", static_cast<float>(m.accuracy)});
  out.push_back({"eval/samples", static_cast<float>(m.samples)});
  out.push_back({"eval/targets", static_cast<float>(m.targets)});
  out.push_back({"eval/time_s", static_cast<float>(m.time_s)});
  // ABI 1.8: the objective's held-out figures ("eval/rewards/accuracies").
  for (const auto& [key, value] : m.extra)
    out.push_back({"eval/" + key, static_cast<float>(value)});
  return out;
}

}  // namespace tensorboard

void TensorBoardCallback::declare_options(OptionSchema& schema) {
  schema.boolean("enabled", true,
                 "write TensorBoard event files; false turns off the callback the core adds by "
                 "default");
  schema.string("dir", "tb", "directory of the event files, relative to the run directory");
  schema.integer("every_n_steps", 1,
                 "write a step's scalars every N optimizer steps (and at the last)", 1.0);
  schema.boolean("all_ranks", false,
                 "every rank writes its own figures (step time, memory, ...) as rank_N/<key>; "
                 "otherwise rank 0 only");
}

TensorBoardCallback::TensorBoardCallback(const Options& options, const RunContext& ctx)
    : every_n_steps_(options.get_int("every_n_steps")),
      all_ranks_(options.get_bool("all_ranks")),
      rank_(ctx.rank) {
  TR_CHECK_TYPED(ConfigError, every_n_steps_ >= 1, options.context(),
                 ": every_n_steps must be >= 1, got ", every_n_steps_);
  const std::string& dir = options.get_string("dir");
  TR_CHECK_TYPED(ConfigError, !dir.empty(), options.context(), ": dir must not be empty");
  if (!options.get_bool("enabled")) return;
  if (!all_ranks_ && ctx.rank != 0) return;
  dir_ = (fs::path(ctx.run_dir) / dir).string();
  job_file_ = (fs::path(ctx.run_dir) / "job.toml").string();
}

void TensorBoardCallback::open() {
  writer_ = std::make_unique<tensorboard::EventFileWriter>(dir_);
  if (rank_ != 0) return;
  std::ifstream in(job_file_, std::ios::binary);
  if (!in) return;  // a callback built outside the trainer (tests) has no job.toml
  std::ostringstream job;
  job << in.rdbuf();
  // The text plugin renders Markdown: a fence keeps the TOML as written.
  writer_->write(tensorboard::text_event(tensorboard::wall_time_now(), 0, "job",
                                         "```toml\n" + job.str() + "```\n"));
}

void TensorBoardCallback::on_train_start(const TrainPlan&) {
  if (!dir_.empty() && !writer_) open();
}

void TensorBoardCallback::on_step_end(const StepMetrics& m) {
  if (dir_.empty()) return;
  const bool last = m.total_steps > 0 && m.step == m.total_steps;
  if (m.step % every_n_steps_ != 0 && !last) return;
  if (!writer_) open();
  const bool global = rank_ == 0;
  const std::string prefix = all_ranks_ ? "rank_" + std::to_string(rank_) + "/" : "";
  writer_->write(tensorboard::scalars_event(tensorboard::wall_time_now(), m.step,
                                            tensorboard::step_scalars(m, global, prefix)));
}

void TensorBoardCallback::on_eval_end(const EvalMetrics& m) {
  if (dir_.empty() || rank_ != 0) return;
  if (!writer_) open();
  writer_->write(tensorboard::scalars_event(tensorboard::wall_time_now(), m.step,
                                            tensorboard::eval_scalars(m)));
}

void TensorBoardCallback::on_train_end(const TrainSummary&) { writer_.reset(); }

}  // namespace trainrun::plugins
