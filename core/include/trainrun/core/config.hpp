#pragma once
// Job files: parsing (toml++), --set overrides, and validation of every table against the core's
// and the plugins' option schemas before anything runs.
#include <trainrun/options.hpp>

#include <memory>
#include <string>
#include <vector>

#include "trainrun/core/registry.hpp"
#include "trainrun/core/spelling.hpp"

namespace trainrun::core {

/// "25MiB" -> 26214400. Accepts B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB (decimal for KB/MB/..,
/// binary for KiB/MiB/.. and for the bare K/M/G), case-insensitive; throws ConfigError-free
/// std::invalid_argument with the reason on malformed input.
int64_t parse_size(const std::string& text);
/// "90s" -> 90, "10min" -> 600, "1h30min" -> 5400, "250ms" -> 0.25; units ms, s, min, h, d.
double parse_duration(const std::string& text);

/// "[1, 1000000]" (integers without exponent), "[0, inf]"; for messages and `trainrun plugins`.
std::string range_text(const v1::OptionSpec& spec);

/// One component chosen by the job: the table it came from, the plugin, its validated options.
struct ComponentConfig {
  ComponentKind kind = ComponentKind::Model;
  std::string section;  ///< "[model]", "[[callbacks]][1]"
  std::string plugin;
  const ComponentInfo* info = nullptr;
  v1::Options options;
};

/// One [[rewards]] table (ABI 1.10): a Reward component, with the core's keys `weight` (TRL's
/// reward_weights: the reward's factor in the weighted sum) and `name` (its name in metrics and
/// messages; default the plugin's name, unique in the job).
struct RewardConfig {
  ComponentConfig component;
  double weight = 1.0;
  std::string name;
};

/// The callbacks every run has unless the job lists its own of the same plugin (metrics.jsonl,
/// TensorBoard event files, report.html). Validation appends them to JobConfig::callbacks with
/// their defaults, when their plugins are installed.
struct DefaultCallback {
  const char* plugin;
  const char* output;  ///< what it writes, for the warning when its plugin is missing
};
inline constexpr DefaultCallback kDefaultCallbacks[] = {
    {"metrics", "metrics.jsonl"}, {"tensorboard", "TensorBoard event files"}, {"report", "report.html"}};

/// A fully validated job.
struct JobConfig {
  std::string file;
  v1::Options trainer;
  v1::Options launch;
  v1::Options parallel;  ///< [parallel] (parallel_schema)
  v1::Options eval;      ///< [eval] (eval_schema): lm-eval tasks scored at each evaluation
  ComponentConfig model, data, strategy, accelerator, precision, optimizer;
  /// [objective] (ABI 1.8); plugin "" = none: the model's own loss.
  ComponentConfig objective;
  std::vector<ComponentConfig> callbacks;
  /// [[rewards]] (ABI 1.10), in the job's order; nothing in training reads them yet (rewards.hpp).
  std::vector<RewardConfig> rewards;
  std::string resolved_toml;  ///< the job with every default filled in, as TOML
};

/// A parsed job file with overrides applied, not yet validated.
class JobFile {
 public:
  /// Throws ConfigError with file:line:column on a syntax error or a bad override.
  static JobFile load(const std::string& path, const std::vector<std::string>& overrides);
  ~JobFile();
  JobFile(JobFile&&) noexcept;
  JobFile& operator=(JobFile&&) noexcept;

  const std::string& path() const;
  /// [plugins] path, validated.
  std::vector<std::string> plugin_paths() const;
  /// Validates every table; throws ConfigError naming file, line, column and key.
  JobConfig validate(const Registry& registry) const;

 private:
  struct Impl;
  explicit JobFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The launcher a validated job runs under: "trainrun" or "mpiexec" ([launch] launcher, with
/// auto resolved from the [accelerator] plugin: "mpi" means mpiexec).
std::string launcher_of(const JobConfig& job);

/// Core schemas of the [trainer], [launch] and [plugins] tables.
v1::OptionSchema trainer_schema();
v1::OptionSchema launch_schema();
v1::OptionSchema plugins_schema();
/// [parallel]: how the model is split over ranks besides data parallelism (ep).
v1::OptionSchema parallel_schema();
/// [eval]: lm-eval YAML tasks the run scores at each evaluation (core/src/run/eval_tasks.cpp).
v1::OptionSchema eval_schema();
/// The core's keys of a [[rewards]] table (weight, name), besides `plugin` and the plugin's own.
v1::OptionSchema reward_entry_schema();

}  // namespace trainrun::core
