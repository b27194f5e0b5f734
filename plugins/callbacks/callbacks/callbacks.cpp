#include "callbacks.hpp"

#include <trainrun/plugin.hpp>

#include <nlohmann/json.hpp>

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace fs = std::filesystem;
// Keys in insertion order, so every line reads step, epoch, rank, ... rather than alphabetically.
using Json = nlohmann::ordered_json;

// --- metrics ---------------------------------------------------------------------------------

void MetricsCallback::declare_options(OptionSchema& schema) {
  schema.integer("every_n_steps", 1, "write a line every N optimizer steps (and at the last)",
                 1.0);
  schema.string("filename", "metrics.jsonl", "file name, relative to the run directory");
  schema.boolean("all_ranks", false,
                 "every rank writes its own file (name gets \"-rank-N\"); otherwise rank 0 only");
}

MetricsCallback::MetricsCallback(const Options& options, const RunContext& ctx)
    : every_n_steps_(options.get_int("every_n_steps")) {
  TR_CHECK_TYPED(ConfigError, every_n_steps_ >= 1, options.context(),
                 ": every_n_steps must be >= 1, got ", every_n_steps_);
  const std::string& filename = options.get_string("filename");
  TR_CHECK_TYPED(ConfigError, !filename.empty(), options.context(),
                 ": filename must not be empty");
  const bool all_ranks = options.get_bool("all_ranks");
  if (!all_ranks && ctx.rank != 0) return;
  fs::path name(filename);
  if (all_ranks) {
    // metrics.jsonl -> metrics-rank-3.jsonl: the extension stays last, so tools still see JSONL.
    name.replace_filename(name.stem().string() + "-rank-" + std::to_string(ctx.rank) +
                          name.extension().string());
  }
  path_ = (fs::path(ctx.run_dir) / name).string();
}

void MetricsCallback::on_train_start(const TrainPlan&) {
  if (path_.empty() || out_.is_open()) return;
  const fs::path parent = fs::path(path_).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  out_.open(path_, std::ios::out | std::ios::app);
  TR_CHECK(out_.is_open(), "metrics: cannot open '", path_, "' for appending: ",
           std::strerror(errno));
}

void MetricsCallback::move_superseded(int64_t step) {
  first_line_ = false;
  if (out_.is_open()) out_.close();
  std::ifstream in(path_);
  if (!in) return;
  std::string kept, superseded;
  for (std::string line; std::getline(in, line);) {
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool later = j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                       j["step"].get<int64_t>() >= step;
    (later ? superseded : kept) += line + '\n';
  }
  in.close();
  if (superseded.empty()) return;
  {
    std::ofstream side(path_ + ".superseded", std::ios::out | std::ios::app);
    side << superseded;
    side.flush();
    TR_CHECK(side.good(), "metrics: writing '", path_, ".superseded' failed: ", std::strerror(errno));
  }
  // The rewritten file replaces the old one only once complete (rename is atomic).
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::out | std::ios::trunc);
    out << kept;
    out.flush();
    TR_CHECK(out.good(), "metrics: writing '", tmp, "' failed: ", std::strerror(errno));
  }
  fs::rename(tmp, path_);
}

void MetricsCallback::write_line(const std::string& line) {
  if (!out_.is_open()) on_train_start(TrainPlan{});
  out_ << line << '\n';
  out_.flush();
  TR_CHECK(out_.good(), "metrics: writing '", path_, "' failed: ", std::strerror(errno));
}

void MetricsCallback::on_step_end(const StepMetrics& m) {
  if (path_.empty()) return;
  const bool last = m.total_steps > 0 && m.step == m.total_steps;
  if (m.step % every_n_steps_ != 0 && !last) return;
  if (first_line_) move_superseded(m.step);
  Json j;
  j["step"] = m.step;
  j["epoch"] = m.epoch;
  j["rank"] = m.rank;
  j["loss"] = m.loss;
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;
  j["step_time_s"] = m.step_time_s;
  j["elapsed_s"] = m.elapsed_s;
  j["samples_per_s"] = m.samples_per_s;
  if (m.tokens_per_s > 0) j["tokens_per_s"] = m.tokens_per_s;
  for (const auto& [key, value] : m.extra) {
    // A plugin's figure must not silently replace a standard column.
    j[j.contains(key) ? "extra." + key : key] = value;
  }
  write_line(j.dump());
}

void MetricsCallback::on_eval_end(const EvalMetrics& m) {
  if (path_.empty()) return;
  // An evaluation before the first step (of a resumed run: at its checkpoint's step) is kept.
  if (first_line_) move_superseded(m.step + 1);
  Json j;
  j["step"] = m.step;
  j["rank"] = m.rank;
  j["eval_loss"] = m.loss;
  if (m.accuracy >= 0) j["eval_accuracy"] = m.accuracy;
  j["eval_samples"] = m.samples;
  j["eval_targets"] = m.targets;
  j["eval_time_s"] = m.time_s;
  // ABI 1.8: the objective's held-out figures, named as TRL logs them ("eval_rewards/margins").
  for (const auto& [key, value] : m.extra) j["eval_" + key] = value;
  write_line(j.dump());
}

void MetricsCallback::on_train_end(const TrainSummary&) {
  if (out_.is_open()) out_.close();
}

// --- progress --------------------------------------------------------------------------------

namespace {

std::string format_duration(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "--:--";
  const auto total = static_cast<int64_t>(std::llround(s));
  const int64_t h = total / 3600, m = (total / 60) % 60, sec = total % 60;
  char buf[32];
  if (h > 0)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(h),
                  static_cast<long long>(m), static_cast<long long>(sec));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(m),
                  static_cast<long long>(sec));
  return buf;
}

int terminal_columns() {
  winsize ws{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  // Under the launcher stderr is a pipe; the launcher passes its terminal's width.
  if (const char* c = std::getenv("COLUMNS")) {
    const int n = std::atoi(c);
    if (n > 0) return n;
  }
  return 80;
}

// The launcher sets TRAINRUN_TTY=1 for rank 0 when its own stderr is a terminal: the bar is then
// drawn into the pipe, and the launcher passes it through to the terminal.
bool stderr_is_terminal() {
  if (isatty(STDERR_FILENO) == 1) return true;
  const char* v = std::getenv("TRAINRUN_TTY");
  return v && std::strcmp(v, "1") == 0;
}

}  // namespace

std::string format_progress(int64_t step, int64_t total, double loss, double samples_per_s,
                            double eta_s, int width) {
  const double frac =
      total > 0 ? std::clamp(static_cast<double>(step) / static_cast<double>(total), 0.0, 1.0)
                : 0.0;
  char pct[8], tail[160];
  std::snprintf(pct, sizeof pct, "%3d%%", static_cast<int>(frac * 100.0));
  std::snprintf(tail, sizeof tail, " %lld/%lld loss %.4g %.1f samples/s ETA %s",
                static_cast<long long>(step), static_cast<long long>(total), loss, samples_per_s,
                format_duration(eta_s).c_str());
  std::string text = pct;
  const int bar = width - static_cast<int>(text.size() + std::strlen(tail)) - 3;  // " [" "]"
  if (bar >= 10) {
    const int filled = static_cast<int>(frac * bar);
    text += " [";
    text.append(filled, '=');
    if (filled < bar) {
      text += '>';
      text.append(bar - filled - 1, ' ');
    }
    text += ']';
  }
  text += tail;
  // A line longer than the terminal wraps, and '\r' then redraws only its last row.
  if (width > 0 && static_cast<int>(text.size()) > width) text.resize(width);
  return text;
}

void ProgressCallback::declare_options(OptionSchema& schema) {
  schema.duration("refresh_s", 0.2, "minimum time between redraws of the progress line", 0.0);
}

ProgressCallback::ProgressCallback(const Options& options, const RunContext& ctx)
    : active_(ctx.rank == 0 && stderr_is_terminal()),
      refresh_s_(options.get_seconds("refresh_s")) {}

void ProgressCallback::on_train_start(const TrainPlan& plan) { total_steps_ = plan.total_steps; }

void ProgressCallback::on_step_end(const StepMetrics& m) {
  if (!active_) return;
  const auto now = Clock::now();
  if (!have_start_) {
    // Measure from the start of this process's first step, so a resumed run's ETA is based
    // on the steps this process ran, not on steps done before the restart.
    have_start_ = true;
    start_step_ = m.step - 1;
    start_ = now - std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double>(std::max(0.0, m.step_time_s)));
  }
  if (m.total_steps > 0) total_steps_ = m.total_steps;
  last_ = m;
  const bool final_step = total_steps_ > 0 && m.step >= total_steps_;
  if (drawn_ && !final_step &&
      std::chrono::duration<double>(now - last_draw_).count() < refresh_s_)
    return;
  draw(m, now);
}

void ProgressCallback::draw(const StepMetrics& m, Clock::time_point now) {
  const int64_t done = m.step - start_step_;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double eta = done > 0 && total_steps_ > 0
                         ? elapsed / static_cast<double>(done) *
                               static_cast<double>(std::max<int64_t>(0, total_steps_ - m.step))
                         : -1.0;
  const int width = terminal_columns() - 1;  // the last column would make some terminals wrap
  const std::string text =
      format_progress(m.step, total_steps_, m.loss, m.samples_per_s, eta, width);
  // \033[K clears what a longer previous line left to the right.
  std::fprintf(stderr, "\r%s\033[K", text.c_str());
  std::fflush(stderr);
  drawn_ = true;
  last_draw_ = now;
}

void ProgressCallback::on_train_end(const TrainSummary&) {
  if (!active_ || !drawn_) return;
  draw(last_, Clock::now());
  std::fputc('\n', stderr);
  std::fflush(stderr);
  drawn_ = false;
}

// --- checkpoint ------------------------------------------------------------------------------

void CheckpointCallback::declare_options(OptionSchema& schema) {
  schema.integer("every_n_steps", 0, "save after every N optimizer steps; 0 = off", 0.0);
  schema.real("every_n_minutes", 0.0,
              "save when this many minutes (wall clock, rank 0) passed since the last save or "
              "the start; 0 = off", 0.0);
  schema.integer("keep_last", 0,
                 "complete checkpoints kept; older ones are deleted once a new one is complete; "
                 "0 = keep all", 0.0);
  schema.boolean("save_on_signal", true,
                 "on SIGTERM/SIGINT: finish the step, save, then exit (code 130)");
  schema.boolean("save_last", true, "save after the last step");
  schema.string("dir", "", "where checkpoints go; \"\" = <run_dir>/checkpoints");
}

CheckpointCallback::CheckpointCallback(const Options& options, const RunContext& ctx)
    : every_n_steps_(options.get_int("every_n_steps")),
      every_n_minutes_(options.get_double("every_n_minutes")),
      save_on_signal_(options.get_bool("save_on_signal")),
      save_last_(options.get_bool("save_last")) {
  settings_.keep_last = options.get_int("keep_last");
  settings_.dir = options.get_string("dir");
  if (settings_.dir.empty()) settings_.dir = (fs::path(ctx.run_dir) / "checkpoints").string();
}

bool CheckpointCallback::should_save(int64_t step, double elapsed_s, CheckpointReason reason) {
  switch (reason) {
    case CheckpointReason::Signal: return save_on_signal_;
    case CheckpointReason::End: return save_last_;
    case CheckpointReason::Step: break;
  }
  const bool save = (every_n_steps_ > 0 && step % every_n_steps_ == 0) ||
                    (every_n_minutes_ > 0 && elapsed_s - last_save_s_ >= every_n_minutes_ * 60.0);
  // The clock restarts at every save, whichever rule triggered it.
  if (save) last_save_s_ = elapsed_s;
  return save;
}


}  // namespace trainrun::plugins
