#pragma once
// The job's [[rewards]] (ABI 1.10), created and combined as TRL's GRPOTrainer combines its
// reward_funcs with reward_weights: `trainrun check` creates them (so a constructor's refusal
// exits 2 before a run), `trainrun reward` scores JSONL rows with them, and the rollouts of an
// online objective (core/src/run/rollout_phase.cpp) score every completion with them.
#include <trainrun/reward.hpp>
#include <trainrun/types.hpp>

#include <memory>
#include <string>
#include <vector>

#include "trainrun/core/config.hpp"
#include "trainrun/core/registry.hpp"

namespace trainrun::core {

/// Every reward of a job, created once, with its weight and name.
class RewardSet {
 public:
  /// Creates each [[rewards]] component in the job's order. Throws PluginError naming the
  /// component and the entry ("reward 'format' (plugin rewards, FILE): create failed:
  /// [[rewards]][1] (job.toml): option 'pattern': ...") when a constructor refuses its options.
  RewardSet(const JobConfig& job, const Registry& registry, const v1::RunContext& ctx);
  ~RewardSet();
  RewardSet(RewardSet&&) noexcept;

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  /// The reward's name in metrics (RewardConfig::name) and its weight.
  const std::string& name(size_t i) const { return entries_[i].name; }
  double weight(size_t i) const { return entries_[i].weight; }
  /// The reward's entry for messages: "[[rewards]][0] 'answer' (plugin accuracy)".
  const std::string& label(size_t i) const { return entries_[i].label; }

  /// result[i][s]: reward i's score of samples[s] (NaN: none). Before asking reward i, checks
  /// that every sample's row (a JSON object) has the fields it requires (ConfigError naming the
  /// reward, the row and the field); afterwards that it returned one score per sample. Every
  /// error escaping a reward becomes a PluginError naming its entry.
  std::vector<std::vector<double>> score(const std::vector<v1::RewardSample>& samples);

  /// The check score() starts with, alone: every sample's row is a JSON object holding every
  /// field a reward requires (ConfigError naming the reward, the row and the field). A run checks
  /// all its prompts' rows this way before anything is generated.
  void check_rows(const std::vector<v1::RewardSample>& samples) const;

  /// TRL's combination: for each sample the sum over the rewards of weight * score with the NaN
  /// scores left out (torch.nansum), so a sample no reward scored gets 0, as in TRL.
  std::vector<double> combine(const std::vector<std::vector<double>>& scores) const;

 private:
  struct Entry {
    std::string name, label;
    double weight = 1;
    std::unique_ptr<v1::Reward> reward;
    std::vector<std::string> required;
  };
  std::vector<Entry> entries_;
};

/// The context rewards get outside a run (`trainrun check`, `trainrun reward`): rank 0 of one,
/// the job's seed and file, its run directory's path (not created).
v1::RunContext offline_reward_context(const JobConfig& job);

}  // namespace trainrun::core
