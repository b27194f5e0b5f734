// Objectives (ABI 1.8, trainrun/objective.hpp) with TRL 1.16's definitions, option names and
// defaults:
//   sft    next-token cross-entropy from the model's log-probabilities (what a run without an
//          [objective] computes inside the model, to rounding)
//   dpo    Direct Preference Optimization (Rafailov et al. 2023) and its loss variants as TRL's
//          DPOTrainer: sigmoid, hinge (SLiC), ipo (Azar et al. 2023, length-normalised as TRL),
//          robust (Chowdhury et al. 2024), exo_pair, nca_pair, bco_pair, sppo_hard, apo_zero,
//          apo_down, discopop, sigmoid_norm, sft
//   simpo  SimPO (Meng et al. 2024) as TRL's CPOTrainer with loss_type = "simpo": reference-free,
//          length-normalised log-probabilities, target margin gamma, optional NLL (cpo_alpha)
//   orpo   ORPO (Hong et al. 2024) as TRL's ORPOTrainer: NLL on chosen plus beta times the
//          log-sigmoid of the log odds ratio
// The preference objectives read the `preference` dataset's batches: rows 0..B-1 are prompt +
// chosen, rows B..2B-1 prompt + rejected of the same pairs, the prompt masked out of the targets,
// and Batch::num_targets = B (the loss is a mean over pairs).
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "trainrun/objective.hpp"
#include "trainrun/plugin.hpp"

namespace trainrun::objectives {

using v1::Batch;
using v1::ModelOutput;
using v1::ObjectiveForward;
using v1::ObjectiveMetric;
using v1::ObjectivePass;
using v1::Options;
using v1::OptionSchema;
using v1::RunContext;
using v1::Split;
using v1::TokenLogProbs;

namespace {

// (sum, count) per metric name, per split, until taken.
class MetricSums {
 public:
  void add(Split s, const std::string& name, double sum, double count) {
    auto& m = sums_[s == Split::Train ? 0 : 1][name];
    m.first += sum;
    m.second += count;
  }
  std::vector<ObjectiveMetric> take(Split s, const std::vector<std::string>& names) {
    auto& table = sums_[s == Split::Train ? 0 : 1];
    std::vector<ObjectiveMetric> out;
    // Every name on every call, in the same order on every rank (the core sums them).
    for (const auto& n : names) out.push_back({n, table[n].first, table[n].second});
    table.clear();
    return out;
  }

 private:
  std::map<std::string, std::pair<double, double>> sums_[2];
};

double sum_of(const at::Tensor& t) { return t.sum().item<double>(); }

std::string sample_list(const std::vector<int64_t>& idx, const std::vector<int64_t>& which) {
  std::ostringstream os;
  for (size_t i = 0; i < which.size() && i < 8; ++i) os << (i ? ", " : "") << idx.at(which[i]);
  if (which.size() > 8) os << ", ... (" << which.size() << " in all)";
  return os.str();
}

// The common part of the paired objectives: the batch layout, the rows without a target, the
// figures every one of them logs.
class PairedObjective : public v1::Objective {
 public:
  std::string task() const override { return "preference"; }
  uint32_t wanted_statistics() const override { return kEntropy | kMeanLogits | kTop1; }
  void begin_forward(const ObjectiveForward& f) override { fwd_ = f; }
  std::vector<ObjectiveMetric> take_metrics(Split s) override { return metrics_.take(s, names_); }

 protected:
  struct Pairs {
    int64_t B = 0;
    at::Tensor chosen_logps, rejected_logps;    // [B], differentiable
    at::Tensor chosen_tokens, rejected_tokens;  // [B] int64
    /// Mean log-probability per completion token (SimPO's and ORPO's length-normalised logps).
    at::Tensor chosen_mean() const { return chosen_logps / chosen_tokens.to(torch::kFloat); }
    at::Tensor rejected_mean() const { return rejected_logps / rejected_tokens.to(torch::kFloat); }
  };

  explicit PairedObjective(std::vector<std::string> extra_names) {
    names_ = {"entropy",         "logits/chosen",       "logits/rejected",    "logps/chosen",
              "logps/rejected",  "mean_token_accuracy", "rewards/accuracies", "rewards/chosen",
              "rewards/margins", "rewards/rejected"};
    names_.insert(names_.end(), extra_names.begin(), extra_names.end());
  }

  // Checks the layout and splits the rows into chosen and rejected.
  Pairs pairs(const TokenLogProbs& lp, const Batch& b) const {
    const int64_t R = lp.logps.size(0);
    TR_CHECK(R % 2 == 0 && R / 2 == static_cast<int64_t>(fwd_.indices.size()),
             "preference objective: a batch of ", fwd_.indices.size(), " pairs must have ",
             2 * fwd_.indices.size(), " rows (chosen, then rejected), got ", R,
             ": use the `preference` dataset");
    const at::Tensor empty = lp.num_tokens.eq(0).nonzero().squeeze(1);
    if (empty.numel() > 0 && !fwd_.filler) {
      std::vector<int64_t> which;
      for (int64_t i = 0; i < empty.numel(); ++i)
        which.push_back(empty[i].item<int64_t>() % (R / 2));
      TR_CHECK(false, "preference objective: ", split_name(), " pairs ",
               sample_list(fwd_.indices, which),
               " have a chosen or rejected completion without a counted token (all masked or "
               "truncated away); nothing would train on them");
    }
    (void)b;
    Pairs p;
    p.B = R / 2;
    p.chosen_logps = lp.logps.slice(0, 0, p.B);
    p.rejected_logps = lp.logps.slice(0, p.B, R);
    p.chosen_tokens = lp.num_tokens.slice(0, 0, p.B);
    p.rejected_tokens = lp.num_tokens.slice(0, p.B, R);
    return p;
  }

  // Reference pass: records (chosen, rejected) log-probabilities.
  ModelOutput record_reference(const Pairs& p) {
    reference_ =
        torch::stack({p.chosen_logps.detach(), p.rejected_logps.detach()}, 1).to(torch::kDouble);
    ModelOutput out;
    out.loss_sum = torch::zeros({}, torch::kFloat);
    return out;
  }

  // The figures TRL logs for every preference trainer, from the per-token statistics: entropy
  // over every completion token, the mean logit and the top-1 accuracy (chosen) token-weighted,
  // the log-probabilities and rewards as means over pairs.
  void log_common(const TokenLogProbs& lp, const Pairs& p, const at::Tensor& chosen_rewards,
                  const at::Tensor& rejected_rewards) {
    if (fwd_.filler) return;
    const Split s = fwd_.split;
    const double B = static_cast<double>(p.B);
    const double tokens = sum_of(lp.num_tokens.to(torch::kDouble));
    const double chosen_tokens = sum_of(p.chosen_tokens.to(torch::kDouble));
    const double rejected_tokens = sum_of(p.rejected_tokens.to(torch::kDouble));
    const int64_t R = 2 * p.B;
    metrics_.add(s, "entropy", sum_of(lp.entropy.to(torch::kDouble)), tokens);
    metrics_.add(s, "logits/chosen", sum_of(lp.mean_logits.slice(0, 0, p.B).to(torch::kDouble)),
                 chosen_tokens);
    metrics_.add(s, "logits/rejected", sum_of(lp.mean_logits.slice(0, p.B, R).to(torch::kDouble)),
                 rejected_tokens);
    metrics_.add(s, "mean_token_accuracy", sum_of(lp.is_top1.slice(0, 0, p.B).to(torch::kDouble)),
                 chosen_tokens);
    metrics_.add(s, "logps/chosen", sum_of(p.chosen_logps.detach().to(torch::kDouble)), B);
    metrics_.add(s, "logps/rejected", sum_of(p.rejected_logps.detach().to(torch::kDouble)), B);
    const at::Tensor c = chosen_rewards.detach().to(torch::kDouble);
    const at::Tensor r = rejected_rewards.detach().to(torch::kDouble);
    metrics_.add(s, "rewards/chosen", sum_of(c), B);
    metrics_.add(s, "rewards/rejected", sum_of(r), B);
    metrics_.add(s, "rewards/accuracies", sum_of(c.gt(r).to(torch::kDouble)), B);
    metrics_.add(s, "rewards/margins", sum_of(c - r), B);
  }

  // The end of every paired objective's policy pass: its figures logged, the loss summed over
  // the pairs, the pairs whose chosen reward is higher counted (the evaluation's accuracy).
  ModelOutput finish(const TokenLogProbs& lp, const Pairs& p, const at::Tensor& losses,
                     const at::Tensor& chosen_rewards, const at::Tensor& rejected_rewards) {
    log_common(lp, p, chosen_rewards, rejected_rewards);
    ModelOutput out;
    out.loss_sum = losses.sum();
    out.num_correct = chosen_rewards.gt(rejected_rewards).sum().item<int64_t>();
    return out;
  }

  // Negative log-likelihood of the chosen completions, as a mean over their tokens in the
  // micro-batch (TRL's cross-entropy on the chosen half): a micro-batch figure, so the loss sum
  // counts it once per pair.
  static at::Tensor chosen_nll_mean(const TokenLogProbs& lp, const Pairs& p) {
    return -lp.token_logps.slice(0, 0, p.B).sum() / p.chosen_tokens.sum().to(torch::kFloat);
  }

  const char* split_name() const { return fwd_.split == Split::Train ? "train" : "eval"; }

  ObjectiveForward fwd_;
  at::Tensor reference_;
  MetricSums metrics_;
  std::vector<std::string> names_;
};

// ---------------------------------------------------------------------------------------------

class DpoObjective final : public PairedObjective {
 public:
  static void declare_options(OptionSchema& s) {
    s.real("beta", 0.1, "deviation from the reference model (higher = closer); IPO's tau", 0.0,
           1e6);
    s.choice("loss_type", "sigmoid",
             {"sigmoid", "hinge", "ipo", "robust", "exo_pair", "nca_pair", "bco_pair", "sppo_hard",
              "apo_zero", "apo_down", "discopop", "sigmoid_norm", "sft"},
             "TRL DPOConfig.loss_type (one; TRL's weighted combinations are not supported)");
    s.real("label_smoothing", 0.0,
           "robust: probability that a preference label is flipped, in [0, 0.5); exo_pair: epsilon",
           0.0, 0.5);
    s.real("discopop_tau", 0.05, "discopop: temperature of the log-ratio modulation", 0.0, 1e6);
    s.real("sft_weight", 0.0,
           "adds this weight times the chosen completion's NLL per token to the loss (TRL: "
           "loss_type = [\"<loss_type>\", \"sft\"], loss_weights = [1, sft_weight]; RPO, Pang et "
           "al. 2024): keeps the chosen likelihood from falling with the rejected one",
           0.0, 1e6);
  }

  DpoObjective(const Options& o, const RunContext&)
      : PairedObjective({}),
        beta_(o.get_double("beta")),
        label_smoothing_(o.get_double("label_smoothing")),
        tau_(o.get_double("discopop_tau")),
        sft_weight_(o.get_double("sft_weight")),
        loss_type_(o.get_string("loss_type")) {
    TR_CHECK_TYPED(v1::ConfigError, beta_ > 0, o.context(), ": beta must be > 0");
    TR_CHECK_TYPED(v1::ConfigError, label_smoothing_ < 0.5 || loss_type_ != "robust", o.context(),
                   ": label_smoothing must be < 0.5 for the robust loss");
    TR_CHECK_TYPED(v1::ConfigError, label_smoothing_ > 0 || loss_type_ != "exo_pair", o.context(),
                   ": exo_pair needs label_smoothing > 0 (its epsilon; the paper suggests 1e-3)");
  }

  int64_t reference_width() const override { return 2; }
  at::Tensor take_reference() override { return reference_; }

  ModelOutput compute(const TokenLogProbs& lp, const Batch& b) override {
    const Pairs p = pairs(lp, b);
    if (fwd_.pass == ObjectivePass::Reference) return record_reference(p);
    TR_CHECK(fwd_.reference.defined() && fwd_.reference.size(0) == p.B,
             "dpo: no reference values for this micro-batch");
    const at::Tensor ref = fwd_.reference.to(torch::kFloat).to(p.chosen_logps.device());
    const at::Tensor chosen_ratio = p.chosen_logps - ref.select(1, 0);
    const at::Tensor rejected_ratio = p.rejected_logps - ref.select(1, 1);
    const at::Tensor delta = chosen_ratio - rejected_ratio;
    const double beta = beta_, ls = label_smoothing_;
    at::Tensor losses;
    if (loss_type_ == "sigmoid") {
      losses = -torch::log_sigmoid(beta * delta);
    } else if (loss_type_ == "hinge") {
      losses = torch::relu(1 - beta * delta);
    } else if (loss_type_ == "ipo" || loss_type_ == "sigmoid_norm") {
      // Per-token averages of the log-ratios (TRL normalises IPO by the completion lengths).
      const at::Tensor d = chosen_ratio / p.chosen_tokens.clamp_min(1).to(torch::kFloat) -
                           rejected_ratio / p.rejected_tokens.clamp_min(1).to(torch::kFloat);
      losses = loss_type_ == "ipo" ? (d - 1 / (2 * beta)).pow(2) : -torch::log_sigmoid(beta * d);
    } else if (loss_type_ == "robust") {
      losses =
          (-(1 - ls) * torch::log_sigmoid(beta * delta) + ls * torch::log_sigmoid(-beta * delta)) /
          (1 - 2 * ls);
    } else if (loss_type_ == "exo_pair") {
      const at::Tensor z = beta * delta;
      losses = torch::sigmoid(z) * (torch::log_sigmoid(z) - std::log1p(-ls)) +
               torch::sigmoid(-z) * (torch::log_sigmoid(-z) - std::log(ls));
    } else if (loss_type_ == "nca_pair") {
      const at::Tensor c = beta * chosen_ratio, r = beta * rejected_ratio;
      losses = -torch::log_sigmoid(c) - 0.5 * torch::log_sigmoid(-c) - 0.5 * torch::log_sigmoid(-r);
    } else if (loss_type_ == "bco_pair") {
      losses =
          -torch::log_sigmoid(beta * chosen_ratio) - torch::log_sigmoid(-beta * rejected_ratio);
    } else if (loss_type_ == "sppo_hard") {
      losses = (chosen_ratio - 0.5 / beta).pow(2) + (rejected_ratio + 0.5 / beta).pow(2);
    } else if (loss_type_ == "apo_zero") {
      losses = 1 - torch::sigmoid(beta * chosen_ratio) + torch::sigmoid(beta * rejected_ratio);
    } else if (loss_type_ == "apo_down") {
      losses = torch::sigmoid(beta * chosen_ratio) + 1 - torch::sigmoid(beta * delta);
    } else if (loss_type_ == "discopop") {
      const at::Tensor z = beta * delta;
      const at::Tensor mix = torch::sigmoid(z / tau_);
      losses = -torch::log_sigmoid(z) * (1 - mix) + torch::exp(-z) * mix;
    } else {  // sft
      losses = chosen_nll_mean(lp, p).expand({p.B});
    }
    if (sft_weight_ > 0) losses = losses + sft_weight_ * chosen_nll_mean(lp, p);
    const at::Tensor chosen_rewards = beta * chosen_ratio.detach();
    const at::Tensor rejected_rewards = beta * rejected_ratio.detach();
    return finish(lp, p, losses, chosen_rewards, rejected_rewards);
  }

 private:
  double beta_, label_smoothing_, tau_, sft_weight_;
  std::string loss_type_;
};

// ---------------------------------------------------------------------------------------------

class SimpoObjective final : public PairedObjective {
 public:
  static void declare_options(OptionSchema& s) {
    s.real("beta", 0.1,
           "scale of the length-normalised rewards (TRL CPOConfig.beta; the SimPO "
           "paper uses 2.0-2.5)",
           0.0, 1e6);
    s.real("simpo_gamma", 0.5, "target reward margin (TRL CPOConfig.simpo_gamma)", 0.0, 1e6);
    s.real("cpo_alpha", 0.0,
           "weight of the NLL on chosen (CPO-SimPO); TRL's CPOConfig default "
           "1.0 is CPO's, 0 is SimPO's",
           0.0, 1e6);
    s.real("label_smoothing", 0.0, "conservative smoothing of the sigmoid loss, in [0, 0.5)", 0.0,
           0.5);
  }
  SimpoObjective(const Options& o, const RunContext&)
      : PairedObjective({"nll_loss"}),
        beta_(o.get_double("beta")),
        gamma_(o.get_double("simpo_gamma")),
        alpha_(o.get_double("cpo_alpha")),
        ls_(o.get_double("label_smoothing")) {
    TR_CHECK_TYPED(v1::ConfigError, beta_ > 0, o.context(), ": beta must be > 0");
  }

  ModelOutput compute(const TokenLogProbs& lp, const Batch& b) override {
    const Pairs p = pairs(lp, b);
    // Average log-probability per completion token (reference-free rewards).
    const at::Tensor chosen = p.chosen_mean(), rejected = p.rejected_mean();
    const at::Tensor z = beta_ * (chosen - rejected - gamma_ / beta_);
    at::Tensor losses = -torch::log_sigmoid(z) * (1 - ls_) - torch::log_sigmoid(-z) * ls_;
    const at::Tensor nll = chosen_nll_mean(lp, p);
    if (alpha_ > 0) losses = losses + alpha_ * nll;
    const at::Tensor chosen_rewards = beta_ * chosen.detach();
    const at::Tensor rejected_rewards = beta_ * rejected.detach();
    if (!fwd_.filler)
      metrics_.add(fwd_.split, "nll_loss", nll.item<double>() * p.B, static_cast<double>(p.B));
    return finish(lp, p, losses, chosen_rewards, rejected_rewards);
  }

 private:
  double beta_, gamma_, alpha_, ls_;
};

// ---------------------------------------------------------------------------------------------

class OrpoObjective final : public PairedObjective {
 public:
  static void declare_options(OptionSchema& s) {
    s.real("beta", 0.1, "weight of the odds-ratio term (ORPO's lambda; TRL ORPOConfig.beta)", 0.0,
           1e6);
  }
  OrpoObjective(const Options& o, const RunContext&)
      : PairedObjective({"log_odds_chosen", "log_odds_ratio", "nll_loss"}),
        beta_(o.get_double("beta")) {}

  ModelOutput compute(const TokenLogProbs& lp, const Batch& b) override {
    const Pairs p = pairs(lp, b);
    const at::Tensor chosen = p.chosen_mean(), rejected = p.rejected_mean();
    // log odds(y) = log p - log(1 - p), with p the mean per-token probability's log above.
    const at::Tensor log_odds = (chosen - rejected) - (torch::log1p(-torch::exp(chosen)) -
                                                       torch::log1p(-torch::exp(rejected)));
    const at::Tensor ratio = torch::log_sigmoid(log_odds);
    const at::Tensor nll = chosen_nll_mean(lp, p);
    const at::Tensor losses = nll - beta_ * ratio;
    const at::Tensor chosen_rewards = beta_ * chosen.detach();
    const at::Tensor rejected_rewards = beta_ * rejected.detach();
    if (!fwd_.filler) {
      const double B = static_cast<double>(p.B);
      metrics_.add(fwd_.split, "log_odds_ratio", sum_of(ratio.detach().to(torch::kDouble)), B);
      metrics_.add(fwd_.split, "log_odds_chosen", sum_of(log_odds.detach().to(torch::kDouble)), B);
      metrics_.add(fwd_.split, "nll_loss", nll.item<double>() * B, B);
    }
    return finish(lp, p, losses, chosen_rewards, rejected_rewards);
  }

 private:
  double beta_;
};

// ---------------------------------------------------------------------------------------------

// Next-token cross-entropy from the log-probabilities: -sum log p(target) over the counted
// targets, normalised by the core over the global batch's targets.
class SftObjective final : public v1::Objective {
 public:
  static void declare_options(OptionSchema&) {}
  SftObjective(const Options&, const RunContext&) {}
  std::string task() const override { return "language_modeling"; }
  uint32_t wanted_statistics() const override { return kTop1; }
  void begin_forward(const ObjectiveForward& f) override { fwd_ = f; }
  ModelOutput compute(const TokenLogProbs& lp, const Batch&) override {
    ModelOutput out;
    out.loss_sum = -lp.token_logps.sum();
    if (!c10::GradMode::is_enabled()) out.num_correct = lp.is_top1.sum().item<int64_t>();
    if (!fwd_.filler) {
      const double tokens = lp.num_tokens.sum().item<double>();
      metrics_.add(fwd_.split, "mean_token_accuracy", lp.is_top1.sum().item<double>(), tokens);
    }
    return out;
  }
  std::vector<ObjectiveMetric> take_metrics(Split s) override {
    return metrics_.take(s, {"mean_token_accuracy"});
  }

 private:
  ObjectiveForward fwd_;
  MetricSums metrics_;
};

}  // namespace

extern const trainrun_component_v1 kComponents[4] = {
    v1::component<v1::Objective, SftObjective>(
        "sft",
        "next-token cross-entropy from the model's log-probabilities (the default without "
        "an [objective], computed inside the model)"),
    v1::component<v1::Objective, DpoObjective>(
        "dpo",
        "Direct Preference Optimization and its loss variants (TRL DPOTrainer: sigmoid, "
        "hinge, ipo, robust, ...), reference = adapters off or precomputed"),
    v1::component<v1::Objective, SimpoObjective>(
        "simpo",
        "SimPO: reference-free, length-normalised preference loss with a target margin "
        "(TRL CPOTrainer loss_type simpo)"),
    v1::component<v1::Objective, OrpoObjective>(
        "orpo",
        "ORPO: NLL on chosen plus the log odds ratio of chosen over rejected (TRL "
        "ORPOTrainer), no reference model"),
};

}  // namespace trainrun::objectives
