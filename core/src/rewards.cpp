// The job's rewards (ABI 1.10): creation, field checks and TRL's weighted nansum.
#include "trainrun/core/rewards.hpp"

#include <nlohmann/json.hpp>

#include "trainrun/core/run_dir.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace trainrun::core {

RewardSet::RewardSet(const JobConfig& job, const Registry& registry, const v1::RunContext& ctx) {
  for (const auto& r : job.rewards) {
    Entry e;
    e.name = r.name;
    e.weight = r.weight;
    e.label = r.component.section + " '" + r.name + "' (plugin " + r.component.plugin + ")";
    // A constructor's refusal comes back as a PluginError naming the component and, through
    // its Options::context(), the entry ("[[rewards]][1] (job.toml): option 'pattern': ...").
    e.reward = registry.create<v1::Reward>(*r.component.info, r.component.options, ctx);
    e.required = guarded(e.label, "required_fields", [&] { return e.reward->required_fields(); });
    entries_.push_back(std::move(e));
  }
}

RewardSet::~RewardSet() = default;
RewardSet::RewardSet(RewardSet&&) noexcept = default;

namespace {
std::string row_name(const v1::RewardSample& s, size_t position) {
  return s.row_index >= 0 ? "row " + std::to_string(s.row_index)
                          : "sample " + std::to_string(position);
}
}  // namespace

void RewardSet::check_rows(const std::vector<v1::RewardSample>& samples) const {
  // Rows are parsed once, and only when some reward names fields.
  const bool any_required = std::any_of(entries_.begin(), entries_.end(),
                                        [](const Entry& e) { return !e.required.empty(); });
  if (!any_required) return;
  for (size_t s = 0; s < samples.size(); ++s) {
    const nlohmann::json row =
        nlohmann::json::parse(samples[s].row, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object())
      throw v1::ConfigError(row_name(samples[s], s) + ": the prompt's row is not a JSON object");
    for (const auto& e : entries_)
      for (const auto& field : e.required)
        if (!row.contains(field))
          throw v1::ConfigError(e.label + ": " + row_name(samples[s], s) + " has no field '" +
                                field + "', which this reward compares with");
  }
}

std::vector<std::vector<double>> RewardSet::score(const std::vector<v1::RewardSample>& samples) {
  check_rows(samples);
  std::vector<std::vector<double>> out;
  for (auto& e : entries_) {
    std::vector<double> scores =
        guarded(e.label, "score", [&] { return e.reward->score(samples); });
    if (scores.size() != samples.size())
      throw v1::PluginError(e.label + ": score() returned " + std::to_string(scores.size()) +
                            " scores for " + std::to_string(samples.size()) + " completions");
    out.push_back(std::move(scores));
  }
  return out;
}

std::vector<double> RewardSet::combine(const std::vector<std::vector<double>>& scores) const {
  const size_t n = scores.empty() ? 0 : scores[0].size();
  std::vector<double> total(n, 0.0);
  for (size_t i = 0; i < scores.size() && i < entries_.size(); ++i)
    for (size_t s = 0; s < n; ++s)
      if (!std::isnan(scores[i][s])) total[s] += entries_[i].weight * scores[i][s];
  return total;
}

v1::RunContext offline_reward_context(const JobConfig& job) {
  v1::RunContext ctx;
  ctx.seed = static_cast<uint64_t>(job.trainer.get_int("seed"));
  ctx.job_file = job.file;
  ctx.run_dir = run_dir_of(job);
  return ctx;
}

}  // namespace trainrun::core
