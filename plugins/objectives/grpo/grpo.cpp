// GRPO (Shao et al. 2024, "DeepSeekMath") as TRL 1.16's GRPOTrainer computes it, with its loss
// variants: grpo (a mean over completions of each completion's token mean), bnpo (a token mean
// per micro-batch), dr_grpo (Liu et al. 2025: a constant normaliser, micro-batch x
// max_completion_length) and dapo (Yu et al. 2025: a token mean over the whole generation batch;
// TRL's default), the clipped importance ratio (epsilon, and epsilon_high for DAPO's clip-higher;
// delta for two-sided clipping), token- or sequence-level importance weights (GSPO), the k3 KL
// estimate to the reference (beta), group-normalised advantages (scale_rewards group / batch /
// none; unscorable completions get advantage 0) and masking of truncated completions.
//
// An online objective (rollout.hpp): the core generates num_generations completions per prompt,
// scores them with the [[rewards]] and calls begin_rollout, where the advantages are computed and
// the rollout's metrics recorded; Old and Reference passes record per-token log-probabilities;
// policy passes compute the loss. The loss convention is the core's: compute returns the loss
// SUMMED over the micro-batch's completions (Batch::num_targets = rows), scaled so that the
// core's division by the global batch's completions gives TRL's gradient:
//   grpo    sum over rows of (sum_t loss * mask) / max(1, sum_t mask)
//   bnpo    rows x (sum loss * mask) / max(1, sum mask)
//   dr_grpo (sum loss * mask) / max_completion_length
//   dapo    (sum loss * mask) x (completions of this rank's rollout x world size) / (completion
//           tokens of the whole rollout over every rank), TRL's num_items_in_batch.
// Metrics under TRL's names: per micro-batch, token means over every rank (kl, entropy,
// clip_ratio/*), as TRL's global_masked_mean; per rollout, reward statistics and completion
// lengths over every rank.
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "trainrun/interfaces.hpp"
#include "trainrun/objective.hpp"
#include "trainrun/plugin.hpp"
#include "trainrun/rollout.hpp"

namespace trainrun::grpo {

using v1::Batch;
using v1::ModelOutput;
using v1::ObjectiveForward;
using v1::ObjectiveMetric;
using v1::ObjectivePass;
using v1::Split;
using v1::TokenLogProbs;

namespace {

// All-reduces `values` (float64, in place) with `op` when there is a communicator.
void reduce(v1::Communicator* comm, at::Tensor& values, v1::ReduceOp op) {
  if (comm == nullptr) return;
  v1::AllReduceOptions o;
  o.op = op;
  comm->all_reduce(values, o)->wait();
}

// TRL's nanstd: the unbiased standard deviation of the values that are not NaN (NaN with fewer
// than two).
double nanstd(const std::vector<double>& v) {
  double n = 0, sum = 0;
  for (double x : v)
    if (!std::isnan(x)) n += 1, sum += x;
  if (n < 2) return std::numeric_limits<double>::quiet_NaN();
  const double mean = sum / n;
  double sq = 0;
  for (double x : v)
    if (!std::isnan(x)) sq += (x - mean) * (x - mean);
  return std::sqrt(sq / (n - 1));
}

double nanmean(const std::vector<double>& v) {
  double n = 0, sum = 0;
  for (double x : v)
    if (!std::isnan(x)) n += 1, sum += x;
  return n > 0 ? sum / n : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

class GrpoObjective final : public v1::Objective,
                            public v1::OnlineObjective,
                            public v1::LogitTemperature {
 public:
  static void declare_options(v1::OptionSchema& s) {
    s.integer("num_generations", 8,
              "completions per prompt (a group); global_batch_size counts completions and must "
              "be a multiple of num_generations x world_size",
              2, 1 << 16);
    s.integer("max_completion_length", 512, "new tokens per completion at most", 1, 1 << 20);
    s.real("temperature", 1.0,
           "sampling temperature; the log-probabilities are of logits / "
           "temperature, as TRL's",
           1e-6, 1e6);
    s.real("top_p", 1.0, "nucleus sampling: the smallest set of tokens reaching this probability",
           1e-9, 1.0);
    s.integer("top_k", 0, "sampling keeps the k most likely tokens (0: all)", 0, 1 << 24);
    s.integer("num_iterations", 1,
              "optimizer steps on each rollout (GRPO's mu); > 1 scores the rollout once more "
              "under no_grad for the importance ratio's denominator",
              1, 1 << 10);
    s.real("beta", 0.0,
           "weight of the KL term to the reference model (k3 estimator); 0 needs no "
           "reference model",
           0.0);
    s.real("epsilon", 0.2, "lower clipping range of the importance ratio (1 - epsilon)", 0.0);
    s.real("epsilon_high", -1.0,
           "upper clipping range (1 + epsilon_high), DAPO's clip-higher; < 0: epsilon");
    s.real("delta", 0.0,
           "two-sided clipping: the ratio's upper bound in the unclipped term "
           "(0: none; > 1 + epsilon_high when set)",
           0.0);
    s.choice("loss_type", "dapo", {"grpo", "bnpo", "dr_grpo", "dapo"},
             "loss aggregation: grpo (per-completion token means), bnpo (token mean per "
             "micro-batch), dr_grpo (sum / (micro-batch x max_completion_length)), dapo (token "
             "mean over the whole rollout)");
    s.choice("scale_rewards", "group", {"group", "batch", "none"},
             "advantages: reward minus the group's mean, divided by the group's standard "
             "deviation, the whole rollout's, or not divided (Dr. GRPO)");
    s.choice("importance_sampling_level", "token", {"token", "sequence"},
             "importance ratio per token, or one per completion (GSPO)");
    s.boolean("mask_truncated_completions", false,
              "completions cut at max_completion_length count in no loss (DAPO)");
    s.boolean("use_bias_correction_kl", true,
              "the KL term multiplied by the importance ratio (DeepSeek-V3.2's unbiased "
              "reverse-KL gradient; changes the gradient even where the ratio is 1)");
  }

  GrpoObjective(const v1::Options& o, const v1::RunContext& ctx) : world_(ctx.world_size) {
    spec_.num_generations = o.get_int("num_generations");
    spec_.max_completion_length = o.get_int("max_completion_length");
    spec_.temperature = o.get_double("temperature");
    spec_.top_p = o.get_double("top_p");
    spec_.top_k = o.get_int("top_k");
    spec_.num_iterations = o.get_int("num_iterations");
    beta_ = o.get_double("beta");
    epsilon_low_ = o.get_double("epsilon");
    const double high = o.get_double("epsilon_high");
    epsilon_high_ = high < 0 ? epsilon_low_ : high;
    delta_ = o.get_double("delta");
    TR_CHECK_TYPED(v1::ConfigError, delta_ == 0 || delta_ > 1 + epsilon_high_, o.context(),
                   ": delta = ", delta_, " must exceed 1 + epsilon_high = ", 1 + epsilon_high_,
                   " (or be 0: no two-sided clipping)");
    loss_type_ = o.get_string("loss_type");
    scale_rewards_ = o.get_string("scale_rewards");
    sequence_level_ = o.get_string("importance_sampling_level") == "sequence";
    mask_truncated_ = o.get_bool("mask_truncated_completions");
    bias_correction_kl_ = o.get_bool("use_bias_correction_kl");
    // TRL computes the old log-probabilities only when a rollout serves more than one optimizer
    // step; otherwise the ratio is 1 and the current ones, detached, stand in.
    spec_.old_logps = spec_.num_iterations > 1;
    spec_.reference = beta_ != 0.0;
    names_ = {"kl",
              "entropy",
              "clip_ratio/low_mean",
              "clip_ratio/low_min",
              "clip_ratio/high_mean",
              "clip_ratio/high_max",
              "clip_ratio/region_mean"};
  }

  std::string task() const override { return "prompts"; }
  uint32_t wanted_statistics() const override { return kEntropy; }
  v1::RolloutSpec rollout_spec() const override { return spec_; }
  double logit_temperature() const override { return spec_.temperature; }
  void begin_forward(const ObjectiveForward& f) override { fwd_ = f; }

  void begin_rollout(const v1::RolloutScores& s, v1::Communicator* comm) override {
    const int64_t N = s.rewards.size(0), G = s.num_generations;
    TR_CHECK(N % G == 0, "grpo: a rollout of ", N, " completions is not made of groups of ", G);
    const at::Tensor per = s.per_reward.to(torch::kDouble).contiguous();
    const int64_t K = per.size(1);
    std::vector<double> rewards(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) {
      bool scored = K == 0;
      for (int64_t k = 0; k < K; ++k) scored = scored || !std::isnan(per[i][k].item<double>());
      // TRL: a completion no reward scored is unscorable, left out of its group's statistics.
      rewards[static_cast<size_t>(i)] =
          scored ? s.rewards[i].item<double>() : std::numeric_limits<double>::quiet_NaN();
      TR_CHECK(!scored || std::isfinite(rewards[static_cast<size_t>(i)]), "grpo: completion ", i,
               " of this rank's rollout has the reward ", rewards[static_cast<size_t>(i)],
               " (every reward must be finite or NaN)");
    }
    // The whole rollout's figures in one sum over the ranks: the rewards' sums and squares for
    // the batch statistics, the lengths and the per-reward sums.
    const at::Tensor lengths = s.completion_lengths.to(torch::kDouble);
    const at::Tensor truncated = s.truncated.to(torch::kBool);
    double batch_std = std::numeric_limits<double>::quiet_NaN();
    {
      std::vector<double> sums = global_reward_moments(rewards, comm);
      const double n = sums[0], mean = n > 0 ? sums[1] / n : 0;
      if (n > 1) batch_std = std::sqrt(std::max(0.0, (sums[2] - n * mean * mean) / (n - 1)));
      rollout_metrics_["reward"] = n > 0 ? mean : std::numeric_limits<double>::quiet_NaN();
      rollout_metrics_["reward_std"] = batch_std;
    }
    advantages_.assign(static_cast<size_t>(N), 0.0);
    double zero_std = 0;
    for (int64_t g = 0; g < N / G; ++g) {
      std::vector<double> group(rewards.begin() + g * G, rewards.begin() + (g + 1) * G);
      const double mean = nanmean(group);
      const double std = scale_rewards_ == "batch" ? batch_std : nanstd(group);
      if (std::abs(std) <= 1e-8) zero_std += static_cast<double>(G);  // torch.isclose(std, 0)
      for (int64_t j = 0; j < G; ++j) {
        double a = group[static_cast<size_t>(j)] - mean;
        if (scale_rewards_ != "none") a /= std + 1e-4;
        advantages_[static_cast<size_t>(g * G + j)] = std::isnan(a) ? 0.0 : a;  // nan_to_num
      }
    }
    truncated_.assign(static_cast<size_t>(N), false);
    double tokens = 0;
    for (int64_t i = 0; i < N; ++i) {
      truncated_[static_cast<size_t>(i)] = truncated[i].item<bool>();
      if (!(mask_truncated_ && truncated_[static_cast<size_t>(i)]))
        tokens += lengths[i].item<double>();
    }
    log_rollout(s, rewards, lengths, truncated, zero_std, tokens, comm);
    rollout_size_ = N;
    old_.clear();
    ref_.clear();
  }

  ModelOutput compute(const TokenLogProbs& lp, const Batch& b) override {
    const int64_t R = lp.token_logps.size(0);
    TR_CHECK(R == static_cast<int64_t>(fwd_.indices.size()), "grpo: ", R, " rows for ",
             fwd_.indices.size(), " completions: a rollout batch holds one row per completion");
    TR_CHECK(fwd_.split == Split::Train, "grpo: evaluation runs rollouts, not loss passes");
    if (fwd_.pass != ObjectivePass::Policy) {
      auto& table = fwd_.pass == ObjectivePass::Old ? old_ : ref_;
      const at::Tensor logps = lp.token_logps.detach().clone();
      for (int64_t r = 0; r < R; ++r) table[fwd_.indices[static_cast<size_t>(r)]] = logps[r];
      ModelOutput out;
      out.loss_sum = torch::zeros({}, torch::kFloat);
      return out;
    }
    at::Tensor mask = b.target.ne(v1::kIgnoreIndex).to(torch::kFloat);
    std::vector<double> adv(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i = fwd_.indices[static_cast<size_t>(r)];
      TR_CHECK(i >= 0 && i < rollout_size_, "grpo: completion ", i, " outside the rollout's ",
               rollout_size_);
      adv[static_cast<size_t>(r)] = advantages_[static_cast<size_t>(i)];
      if (mask_truncated_ && truncated_[static_cast<size_t>(i)]) mask[r].zero_();
    }
    const at::Tensor advantages =
        torch::tensor(adv, torch::kDouble).to(torch::kFloat).unsqueeze(1);  // [R, 1]
    const at::Tensor logps = lp.token_logps;
    const at::Tensor old = spec_.old_logps ? stacked(old_, "old") : logps.detach();
    const at::Tensor log_ratio = logps - old;
    const at::Tensor tokens_per_row = mask.sum(-1);
    at::Tensor log_weights = log_ratio;
    if (sequence_level_)
      log_weights = ((log_ratio * mask).sum(-1) / tokens_per_row.clamp_min(1.0)).unsqueeze(-1);
    at::Tensor coef_1 = torch::exp(log_weights);
    const at::Tensor coef_2 = torch::clamp(coef_1, 1 - epsilon_low_, 1 + epsilon_high_);
    at::Tensor unclipped = coef_1;
    if (delta_ > 0) unclipped = torch::clamp(coef_1, c10::nullopt, delta_);
    at::Tensor per_token = -torch::min(unclipped * advantages, coef_2 * advantages);
    at::Tensor kl;
    if (beta_ != 0.0) {
      const at::Tensor ref = stacked(ref_, "reference");
      kl = torch::exp(ref - logps) - (ref - logps) - 1;
      if (bias_correction_kl_) kl = kl * coef_1;
      per_token = per_token + beta_ * kl;
    }
    const at::Tensor masked = (per_token * mask).sum();
    at::Tensor loss;
    if (loss_type_ == "grpo") {
      loss = ((per_token * mask).sum(-1) / tokens_per_row.clamp_min(1.0)).sum();
    } else if (loss_type_ == "bnpo") {
      loss = masked / mask.sum().clamp_min(1.0) * static_cast<double>(R);
    } else if (loss_type_ == "dr_grpo") {
      loss = masked / static_cast<double>(spec_.max_completion_length);
    } else {  // dapo: TRL's num_items_in_batch, the whole rollout's tokens over every rank
      loss =
          masked * (static_cast<double>(rollout_size_ * world_) / std::max(1.0, rollout_tokens_));
    }
    log_step(lp, mask, kl, coef_1, advantages);
    ModelOutput out;
    out.loss_sum = loss;
    return out;
  }

  std::vector<ObjectiveMetric> take_metrics(Split s) override {
    std::vector<ObjectiveMetric> out;
    for (const auto& n : names_) {
      auto& m = step_metrics_[n];
      out.push_back({n, s == Split::Train ? m.first : 0.0, s == Split::Train ? m.second : 0.0});
    }
    step_metrics_.clear();
    // A rollout's figures are logged at the step that made it, as TRL logs them: the same value
    // on every rank (already reduced), so each rank adds (value, 1).
    for (const auto& n : rollout_names_) {
      auto it = rollout_metrics_.find(n);
      const bool have =
          s == Split::Train && it != rollout_metrics_.end() && !std::isnan(it->second);
      out.push_back({n, have ? it->second : 0.0, have ? 1.0 : 0.0});
    }
    if (s == Split::Train) rollout_metrics_.clear();
    return out;
  }

 private:
  // [count, sum, sum of squares] of the rewards that are not NaN, over every rank.
  static std::vector<double> global_reward_moments(const std::vector<double>& rewards,
                                                   v1::Communicator* comm) {
    at::Tensor t = torch::zeros({3}, torch::kDouble);
    double* d = t.data_ptr<double>();
    for (double r : rewards)
      if (!std::isnan(r)) d[0] += 1, d[1] += r, d[2] += r * r;
    reduce(comm, t, v1::ReduceOp::Sum);
    return {d[0], d[1], d[2]};
  }

  // The per-token values a pass recorded for this micro-batch's completions, [R, T].
  at::Tensor stacked(const std::map<int64_t, at::Tensor>& table, const char* what) const {
    std::vector<at::Tensor> rows;
    for (int64_t i : fwd_.indices) {
      auto it = table.find(i);
      TR_CHECK(it != table.end(), "grpo: no ", what, " log-probabilities for completion ", i,
               " (the core runs that pass after each rollout)");
      rows.push_back(it->second);
    }
    return torch::stack(rows);
  }

  // TRL's rollout figures over every rank: per-reward means and standard deviations (NaN left
  // out), the completion lengths (all, and those that ended), the truncated fraction, the
  // fraction of completions in a group whose rewards do not vary.
  void log_rollout(const v1::RolloutScores& s, const std::vector<double>& rewards,
                   const at::Tensor& lengths, const at::Tensor& truncated, double zero_std,
                   double tokens, v1::Communicator* comm) {
    const int64_t N = static_cast<int64_t>(rewards.size()), K = s.per_reward.size(1);
    // Sums: N, length sum, truncated, zero_std, tokens, terminated count, terminated length
    // sum, then per reward: count, sum, sum of squares.
    at::Tensor sums = torch::zeros({7 + 3 * K}, torch::kDouble);
    double* d = sums.data_ptr<double>();
    at::Tensor mins = torch::full({2}, std::numeric_limits<double>::infinity(), torch::kDouble);
    at::Tensor maxs = torch::full({2}, -std::numeric_limits<double>::infinity(), torch::kDouble);
    double* lo = mins.data_ptr<double>();
    double* hi = maxs.data_ptr<double>();
    for (int64_t i = 0; i < N; ++i) {
      const double len = lengths[i].item<double>();
      const bool cut = truncated[i].item<bool>();
      d[0] += 1, d[1] += len, d[2] += cut ? 1 : 0;
      lo[0] = std::min(lo[0], len), hi[0] = std::max(hi[0], len);
      if (!cut) d[5] += 1, d[6] += len, lo[1] = std::min(lo[1], len), hi[1] = std::max(hi[1], len);
      for (int64_t k = 0; k < K; ++k) {
        const double v = s.per_reward[i][k].item<double>();
        if (!std::isnan(v)) d[7 + 3 * k] += 1, d[8 + 3 * k] += v, d[9 + 3 * k] += v * v;
      }
    }
    d[3] = zero_std, d[4] = tokens;
    reduce(comm, sums, v1::ReduceOp::Sum);
    reduce(comm, mins, v1::ReduceOp::Min);
    reduce(comm, maxs, v1::ReduceOp::Max);
    rollout_tokens_ = d[4];
    auto& m = rollout_metrics_;
    m["completions/mean_length"] = d[1] / d[0];
    m["completions/min_length"] = lo[0];
    m["completions/max_length"] = hi[0];
    m["completions/clipped_ratio"] = d[2] / d[0];
    // TRL: no completion ended: the terminated lengths are one 0.
    m["completions/mean_terminated_length"] = d[5] > 0 ? d[6] / d[5] : 0.0;
    m["completions/min_terminated_length"] = d[5] > 0 ? lo[1] : 0.0;
    m["completions/max_terminated_length"] = d[5] > 0 ? hi[1] : 0.0;
    m["frac_reward_zero_std"] = d[3] / d[0];
    rollout_names_ = {"completions/clipped_ratio",
                      "completions/max_length",
                      "completions/max_terminated_length",
                      "completions/mean_length",
                      "completions/mean_terminated_length",
                      "completions/min_length",
                      "completions/min_terminated_length",
                      "frac_reward_zero_std",
                      "reward",
                      "reward_std"};
    for (int64_t k = 0; k < K; ++k) {
      const std::string name = "rewards/" + s.reward_names[static_cast<size_t>(k)];
      const double n = d[7 + 3 * k], sum = d[8 + 3 * k], sq = d[9 + 3 * k];
      m[name + "/mean"] = n > 0 ? sum / n : std::numeric_limits<double>::quiet_NaN();
      m[name + "/std"] = n > 1 ? std::sqrt(std::max(0.0, (sq - sum * sum / n) / (n - 1)))
                               : std::numeric_limits<double>::quiet_NaN();
      rollout_names_.push_back(name + "/mean");
      rollout_names_.push_back(name + "/std");
    }
  }

  // TRL's per-micro-batch figures: token means over every rank (global_masked_mean), the
  // minimum / maximum over every completion of its clipped fraction.
  void log_step(const TokenLogProbs& lp, const at::Tensor& mask, const at::Tensor& kl,
                const at::Tensor& coef_1, const at::Tensor& advantages) {
    torch::NoGradGuard no_grad;
    const at::Tensor c = coef_1.detach();
    const at::Tensor low = (c < 1 - epsilon_low_).logical_and(advantages < 0).to(torch::kFloat);
    const at::Tensor high = (c > 1 + epsilon_high_).logical_and(advantages > 0).to(torch::kFloat);
    const at::Tensor region = low.logical_or(high).to(torch::kFloat);
    // Sequence-level weights are one per completion: their means count completions.
    auto masked_sum = [&](const at::Tensor& x) {
      return x.size(-1) == 1 ? x.sum().item<double>() : (x * mask).sum().item<double>();
    };
    const double rows = static_cast<double>(mask.size(0));
    const double tokens = mask.sum().item<double>();
    at::Tensor sums =
        torch::tensor({beta_ != 0.0 ? (kl.detach() * mask).sum().item<double>() : 0.0,
                       (lp.entropy * mask).sum().item<double>(), masked_sum(low), masked_sum(high),
                       masked_sum(region), tokens, sequence_level_ ? rows : tokens},
                      torch::kDouble);
    // Per completion: its clipped fraction (NaN without a counted token, left out).
    auto per_seq = [&](const at::Tensor& x) {
      return x.size(-1) == 1 ? x.squeeze(-1) : (x * mask).sum(-1) / mask.sum(-1);
    };
    const at::Tensor low_seq = per_seq(low), high_seq = per_seq(high);
    auto extreme = [&](const at::Tensor& v, bool maximum) {
      const at::Tensor ok = v.masked_select(~v.isnan());
      if (ok.numel() == 0)
        return maximum ? -std::numeric_limits<double>::infinity()
                       : std::numeric_limits<double>::infinity();
      return (maximum ? ok.max() : ok.min()).item<double>();
    };
    at::Tensor mins = torch::tensor({extreme(low_seq, false)}, torch::kDouble);
    at::Tensor maxs = torch::tensor({extreme(high_seq, true)}, torch::kDouble);
    reduce(fwd_.comm, sums, v1::ReduceOp::Sum);
    reduce(fwd_.comm, mins, v1::ReduceOp::Min);
    reduce(fwd_.comm, maxs, v1::ReduceOp::Max);
    const double* d = sums.data_ptr<double>();
    auto add = [&](const std::string& name, double v) {
      if (std::isnan(v) || std::isinf(v)) return;
      step_metrics_[name].first += v, step_metrics_[name].second += 1;
    };
    // Each rank adds the same reduced value once per micro-batch: sum / count is the mean over
    // micro-batches (TRL's mean of its per-micro-batch list).
    // TRL's global_masked_mean: a micro-batch without a counted token logs 0.
    auto add_mean = [&](const std::string& name, double sum, double count) {
      add(name, sum / std::max(count, 1.0));
    };
    if (beta_ != 0.0) add_mean("kl", d[0], d[5]);
    add_mean("entropy", d[1], d[5]);
    add_mean("clip_ratio/low_mean", d[2], d[6]);
    add_mean("clip_ratio/high_mean", d[3], d[6]);
    add_mean("clip_ratio/region_mean", d[4], d[6]);
    add("clip_ratio/low_min", mins.item<double>());
    add("clip_ratio/high_max", maxs.item<double>());
  }

  v1::RolloutSpec spec_;
  int world_ = 1;
  double beta_ = 0, epsilon_low_ = 0.2, epsilon_high_ = 0.2, delta_ = 0;
  std::string loss_type_, scale_rewards_;
  bool sequence_level_ = false, mask_truncated_ = false, bias_correction_kl_ = true;
  ObjectiveForward fwd_;
  // The current rollout: advantages and truncation per completion, its tokens over every rank.
  std::vector<double> advantages_;
  std::vector<bool> truncated_;
  int64_t rollout_size_ = 0;
  double rollout_tokens_ = 0;
  std::map<int64_t, at::Tensor> old_, ref_;  // per-token log-probabilities per completion
  std::vector<std::string> names_, rollout_names_;
  std::map<std::string, std::pair<double, double>> step_metrics_;
  std::map<std::string, double> rollout_metrics_;
};

/// The components of the "grpo" plugin.
extern const trainrun_component_v1 kComponents[] = {
    v1::component<v1::Objective, GrpoObjective>(
        "grpo",
        "GRPO and its variants (TRL GRPOTrainer: loss_type grpo, bnpo, dr_grpo, dapo; clip-higher, "
        "GSPO's sequence-level ratio, KL to the reference): online RL on the model's own "
        "completions scored by the [[rewards]]"),
};

}  // namespace trainrun::grpo
