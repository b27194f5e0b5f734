// Objectives (ABI 1.8, trainrun/objective.hpp) with TRL 1.16's definitions, option names and
// defaults:
//   sft    next-token cross-entropy from the model's log-probabilities (what a run without an
//          [objective] computes inside the model, to rounding)
//   dpo    Direct Preference Optimization (Rafailov et al. 2023) and its loss variants as TRL's
//          DPOTrainer: sigmoid, hinge (SLiC), ipo (Azar et al. 2023, length-normalised as TRL),
//          robust (Chowdhury et al. 2024), exo_pair, nca_pair, bco_pair, sppo_hard, apo_zero,
//          apo_down, discopop, sigmoid_norm, sft
//   simpo  SimPO (Meng et al. 2024) as TRL's CPOTrainer with loss_type = "simpo": reference-free,
//          length-normalised log-probabilities, target margin gamma, optional NLL (cpo_alpha);
//          TRL's numbers with the dataset's trainer = "cpo"
//   orpo   ORPO (Hong et al. 2024) as TRL's ORPOTrainer: NLL on chosen plus beta times the
//          log-sigmoid of the log odds ratio; needs the dataset's trainer = "orpo"
//   kto    KTO (Ethayarajh et al. 2024) as TRL's KTOTrainer: unpaired desirable / undesirable
//          examples (the `unpaired` dataset, its own layout: see KtoObjective), the batch KL
//          estimate; loss_type kto or apo_zero_unpaired
// The preference objectives read the `preference` dataset's batches: rows 0..B-1 are prompt +
// chosen, rows B..2B-1 prompt + rejected of the same pairs, the prompt masked out of the targets,
// and Batch::num_targets = B (the loss is a mean over pairs). For orpo, rows 2B..3B-1 repeat the
// chosen rows with their prompt tokens as the targets.
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
             ": use the `preference` dataset (its [data] trainer = \"orpo\" rows are for orpo "
             "only)");
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

  /// TRL's CPOTrainer with loss_type "simpo" on the `preference` dataset's rows (trainer = "cpo"
  /// tokenizes as CPOTrainer does): -log sigma(beta (l_c - l_r) - gamma) per pair, l the mean
  /// log-probability per completion token, plus cpo_alpha times the chosen completions' NLL per
  /// token of the micro-batch. nll_loss is logged as TRL does: 0 when cpo_alpha is 0.
  ModelOutput compute(const TokenLogProbs& lp, const Batch& b) override {
    TR_CHECK(lp.logps.size(0) != 3 * static_cast<int64_t>(fwd_.indices.size()),
             "simpo: the batch has 3 rows per pair ([data] trainer = \"orpo\", the preference "
             "dataset's layout for orpo); set [data] trainer = \"cpo\" (TRL CPOTrainer's "
             "tokenization) for simpo");
    const Pairs p = pairs(lp, b);
    // Average log-probability per completion token (reference-free rewards).
    const at::Tensor chosen = p.chosen_mean(), rejected = p.rejected_mean();
    const at::Tensor z = beta_ * (chosen - rejected - gamma_ / beta_);
    at::Tensor losses = -torch::log_sigmoid(z) * (1 - ls_) - torch::log_sigmoid(-z) * ls_;
    double nll_value = 0;  // TRL: the constant 0 when cpo_alpha is 0
    if (alpha_ > 0) {
      const at::Tensor nll = chosen_nll_mean(lp, p);
      losses = losses + alpha_ * nll;
      nll_value = nll.item<double>();
    }
    const at::Tensor chosen_rewards = beta_ * chosen.detach();
    const at::Tensor rejected_rewards = beta_ * rejected.detach();
    if (!fwd_.filler)
      metrics_.add(fwd_.split, "nll_loss", nll_value * p.B, static_cast<double>(p.B));
    // TRL's CPOTrainer logs logps/chosen and logps/rejected as the means per completion token.
    Pairs shown = p;
    shown.chosen_logps = chosen.detach();
    shown.rejected_logps = rejected.detach();
    return finish(lp, shown, losses, chosen_rewards, rejected_rewards);
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

  /// TRL's ORPOTrainer on the `preference` dataset's rows with trainer = "orpo": 3B rows, the
  /// chosen and rejected completions' targets in rows 0..2B-1 and the chosen prompts' targets in
  /// rows 2B..3B-1. Loss per pair: NLL - beta log sigma(log odds), the NLL per token over every
  /// token of the micro-batch's chosen sequences but the first (prompt and completion, as TRL),
  /// the log odds from the mean log-probabilities per completion token.
  ModelOutput compute(const TokenLogProbs& all, const Batch& b) override {
    const int64_t B = static_cast<int64_t>(fwd_.indices.size());
    TR_CHECK(all.logps.size(0) == 3 * B, "orpo: a batch of ", B, " pairs must have ", 3 * B,
             " rows (chosen, rejected, chosen again with its prompt as targets), got ",
             all.logps.size(0),
             ": set the preference dataset's [data] trainer = \"orpo\" (TRL "
             "ORPOTrainer's tokenization; its NLL counts the prompt tokens)");
    // The pairs proper: rows 0..2B-1.
    TokenLogProbs lp;
    lp.token_logps = all.token_logps.slice(0, 0, 2 * B);
    lp.logps = all.logps.slice(0, 0, 2 * B);
    lp.num_tokens = all.num_tokens.slice(0, 0, 2 * B);
    for (auto [from, to] :
         {std::pair{&all.entropy, &lp.entropy}, std::pair{&all.mean_logits, &lp.mean_logits},
          std::pair{&all.is_top1, &lp.is_top1}})
      if (from->defined()) *to = from->slice(0, 0, 2 * B);
    const Pairs p = pairs(lp, b);
    const at::Tensor chosen = p.chosen_mean(), rejected = p.rejected_mean();
    // log odds(y) = log p - log(1 - p), with p the mean per-token probability's log above;
    // log(1 - e^x) as TRL's log1mexp, branching at -ln 2.
    auto log1mexp = [](const at::Tensor& x) {
      return torch::where(x < -0.6931471805599453, torch::log1p(-torch::exp(x)),
                          torch::log(-torch::expm1(x)));
    };
    const at::Tensor log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected));
    const at::Tensor ratio = torch::log_sigmoid(log_odds);
    // The chosen sequences' NLL per token: completion targets (rows 0..B-1) and prompt targets
    // (rows 2B..3B-1) together.
    const at::Tensor prompt_logps = all.token_logps.slice(0, 2 * B, 3 * B).sum();
    const at::Tensor prompt_tokens = all.num_tokens.slice(0, 2 * B, 3 * B).sum();
    const at::Tensor nll = -(lp.token_logps.slice(0, 0, B).sum() + prompt_logps) /
                           (p.chosen_tokens.sum() + prompt_tokens).to(torch::kFloat);
    const at::Tensor losses = nll - beta_ * ratio;
    const at::Tensor chosen_rewards = beta_ * chosen.detach();
    const at::Tensor rejected_rewards = beta_ * rejected.detach();
    if (!fwd_.filler) {
      const double n = static_cast<double>(p.B);
      metrics_.add(fwd_.split, "log_odds_ratio", sum_of(ratio.detach().to(torch::kDouble)), n);
      metrics_.add(fwd_.split, "log_odds_chosen", sum_of(log_odds.detach().to(torch::kDouble)), n);
      metrics_.add(fwd_.split, "nll_loss", nll.item<double>() * n, n);
    }
    // TRL's ORPOTrainer logs logps/chosen and logps/rejected as the means per completion token.
    Pairs shown = p;
    shown.chosen_logps = chosen.detach();
    shown.rejected_logps = rejected.detach();
    return finish(lp, shown, losses, chosen_rewards, rejected_rewards);
  }

 private:
  double beta_;
};

// ---------------------------------------------------------------------------------------------

// KTO (Ethayarajh et al. 2024) as TRL 1.16's KTOTrainer, on the `unpaired` dataset's batches
// (plugins/data/unpaired/unpaired.cpp): rows 0..B-1 prompt + completion of the B examples, rows
// B..2B-1 (when the dataset makes them) prompt + KL completion of the same examples, and one last
// input column whose value is the row's kind (1 desirable, 0 undesirable, 2 KL row) and whose
// target is ignored. Batch::num_targets = B: the loss is a mean over the examples.
//
// loss_type "kto": KL = clamp(mean over the KL rows of (logp - ref logp), min 0), detached;
//   desirable rows 1 - sigmoid(beta (delta - KL)), undesirable 1 - sigmoid(beta (KL - delta)),
//   delta = logp - ref logp of the completion (summed over its tokens).
// loss_type "apo_zero_unpaired": 1 - sigmoid(beta delta) and sigmoid(beta delta), no KL.
// Each weighted by desirable_weight or undesirable_weight, summed (the core divides by B).
// At world > 1 (ObjectiveForward::comm, ABI 1.9) the KL estimate is TRL's: each rank's mean over
// its micro-batch's KL rows, averaged over the ranks (accelerate's gather_for_metrics(kl).mean()),
// then clamped; a rank's filler batch takes part in that all-reduce without a value. With as many
// KL rows on every rank (training: each rank's micro-batch has micro_batch_size examples) it is
// the mean over all the ranks' KL rows, so W ranks of B / W examples compute one process's B.
// rewards/margins is likewise the difference of the label means over all the ranks, as TRL's.
class KtoObjective final : public v1::Objective {
 public:
  static void declare_options(OptionSchema& s) {
    s.real("beta", 0.1, "deviation from the reference model (higher = closer; TRL KTOConfig.beta)",
           0.0, 1e6);
    s.choice("loss_type", "kto", {"kto", "apo_zero_unpaired"},
             "TRL KTOConfig.loss_type: kto (with the batch KL estimate; the data needs KL rows) or "
             "apo_zero_unpaired (no KL term)");
    s.real("desirable_weight", 1.0,
           "weight of the desirable examples' losses (to balance unequal numbers of desirable "
           "and undesirable examples, KTO paper Eq. 8)",
           0.0, 1e6);
    s.real("undesirable_weight", 1.0, "weight of the undesirable examples' losses", 0.0, 1e6);
  }

  KtoObjective(const Options& o, const RunContext&)
      : beta_(o.get_double("beta")),
        desirable_weight_(o.get_double("desirable_weight")),
        undesirable_weight_(o.get_double("undesirable_weight")),
        kl_(o.get_string("loss_type") == "kto") {
    TR_CHECK_TYPED(v1::ConfigError, beta_ > 0, o.context(), ": beta must be > 0");
  }

  std::string task() const override { return "unpaired-preference"; }
  uint32_t wanted_statistics() const override { return kEntropy | kMeanLogits; }
  /// Per example: the reference log-probability of its completion and of its KL row (0 without).
  int64_t reference_width() const override { return 2; }
  at::Tensor take_reference() override { return reference_; }
  void begin_forward(const ObjectiveForward& f) override { fwd_ = f; }
  std::vector<ObjectiveMetric> take_metrics(Split s) override {
    return metrics_.take(
        s, {"entropy", "kl", "logits/chosen", "logits/rejected", "logps/chosen", "logps/rejected",
            "rewards/chosen", "rewards/margins", "rewards/rejected"});
  }

  ModelOutput compute(const TokenLogProbs& lp, const Batch& b) override {
    const int64_t B = static_cast<int64_t>(fwd_.indices.size());
    const int64_t R = lp.logps.size(0);
    TR_CHECK(B > 0 && (R == B || R == 2 * B) && b.input.dim() == 2 && b.input.size(0) == R,
             "kto: a batch of ", B, " examples must have ", B, " rows (", 2 * B,
             " with KL rows), got ", R, ": use the `unpaired` dataset");
    const at::Tensor kind = b.input.select(1, b.input.size(1) - 1).to(torch::kCPU);
    const at::Tensor head = kind.slice(0, 0, B);
    TR_CHECK(head.le(1).logical_and(head.ge(0)).all().item<bool>() &&
                 (R == B || kind.slice(0, B, R).eq(2).all().item<bool>()),
             "kto: the batch's last input column does not hold the `unpaired` dataset's row kinds "
             "(0/1 per example, 2 per KL row): use the `unpaired` dataset");
    TR_CHECK(R == 2 * B || !kl_,
             "kto: loss_type \"kto\" estimates the KL term from the dataset's KL rows, and this "
             "batch has none ([data] kl_block_size = 0): set kl_block_size >= 2 (TRL: "
             "per_device_train_batch_size), or loss_type = \"apo_zero_unpaired\"");
    const at::Tensor tokens = lp.num_tokens.slice(0, 0, B);
    if (!fwd_.filler) {
      const at::Tensor empty = tokens.eq(0).nonzero().squeeze(1).to(torch::kCPU);
      if (empty.numel() > 0) {
        std::vector<int64_t> which(empty.data_ptr<int64_t>(),
                                   empty.data_ptr<int64_t>() + empty.numel());
        TR_CHECK(false, "kto: ", fwd_.split == Split::Train ? "train" : "eval", " examples ",
                 sample_list(fwd_.indices, which),
                 " have a completion without a counted token (all masked or truncated away); "
                 "nothing would train on them");
      }
    }
    const at::Tensor logps = lp.logps.slice(0, 0, B);
    const at::Tensor kl_logps =
        R == 2 * B ? lp.logps.slice(0, B, R).detach() : torch::zeros_like(logps).detach();
    if (fwd_.pass == ObjectivePass::Reference) {
      reference_ = torch::stack({logps.detach(), kl_logps}, 1).to(torch::kDouble).cpu();
      ModelOutput out;
      out.loss_sum = torch::zeros({}, torch::kFloat);
      return out;
    }
    TR_CHECK(fwd_.reference.defined() && fwd_.reference.size(0) == B,
             "kto: no reference values for this micro-batch");
    const at::Tensor ref = fwd_.reference.to(torch::kFloat).to(logps.device());
    const at::Tensor delta = logps - ref.select(1, 0);
    const at::Tensor desirable = head.eq(1).to(logps.device());
    const at::Tensor rewards = beta_ * delta.detach();
    // TRL: (KL_logps - ref_KL_logps).mean(), gathered over the ranks and averaged, clamp(min=0).
    at::Tensor kl =
        kl_ ? (kl_logps - ref.select(1, 1)).mean().detach() : torch::zeros({}, logps.options());
    const LabelSums here = label_sums(desirable, rewards);
    LabelSums everywhere = here;
    double share = 1;  // this rank's weight in the micro-batch-wide figures' (kl, margins) sums
    if (fwd_.comm != nullptr) kl = across_ranks(kl, everywhere, share);
    kl = kl.clamp_min(0);
    at::Tensor chosen_losses, rejected_losses;
    if (kl_) {
      chosen_losses = 1 - torch::sigmoid(beta_ * (delta - kl));
      rejected_losses = 1 - torch::sigmoid(beta_ * (kl - delta));
    } else {
      chosen_losses = 1 - torch::sigmoid(beta_ * delta);
      rejected_losses = torch::sigmoid(beta_ * delta);
    }
    const at::Tensor losses = torch::where(desirable, desirable_weight_ * chosen_losses,
                                           undesirable_weight_ * rejected_losses);
    if (!fwd_.filler) log(lp, B, desirable, logps.detach(), kl, here, everywhere, share);
    ModelOutput out;
    out.loss_sum = losses.sum();
    return out;  // num_correct -1: KTO judges no pair
  }

 private:
  /// Reward sums and example counts of the two labels in a micro-batch (all ranks' after
  /// across_ranks).
  struct LabelSums {
    double chosen_rewards = 0, n_chosen = 0, rejected_rewards = 0, n_rejected = 0;
  };

  static LabelSums label_sums(const at::Tensor& desirable, const at::Tensor& rewards) {
    const at::Tensor r64 = rewards.to(torch::kDouble);
    LabelSums l;
    l.chosen_rewards = sum_of(r64.masked_select(desirable));
    l.rejected_rewards = sum_of(r64.masked_select(desirable.logical_not()));
    l.n_chosen = sum_of(desirable.to(torch::kDouble));
    l.n_rejected = static_cast<double>(desirable.numel()) - l.n_chosen;
    return l;
  }

  /// World > 1: what TRL gathers within the step, in one all-reduce (sum) over the ranks of this
  /// rank's KL mean and 1 (a filler batch: 0 and 0, so it changes nothing), and of its LabelSums
  /// (a filler's: zeros). Returns the mean over the ranks of their KL means, not yet clamped, as a
  /// float32 scalar on kl's device, leaves the ranks' total LabelSums in `labels` and 1 / the
  /// number of ranks with a value in `share`. Every rank calls it in every policy pass
  /// (ObjectiveForward::comm), so the collectives meet.
  at::Tensor across_ranks(const at::Tensor& kl, LabelSums& labels, double& share) const {
    std::vector<double> mine = {kl.item<double>(),       1.0,
                                labels.chosen_rewards,   labels.n_chosen,
                                labels.rejected_rewards, labels.n_rejected};
    if (fwd_.filler) mine.assign(mine.size(), 0.0);
    // The communicator wants tensors on the accelerator's device, where the model's outputs are.
    at::Tensor t = torch::tensor(mine, torch::kDouble).to(kl.device());
    fwd_.comm->all_reduce(t)->wait();
    t = t.to(torch::kCPU);
    const double* r = t.data_ptr<double>();
    // Rank 0 has the most evaluation examples (core/src/sampler.cpp eval_shard) and no rank runs a
    // filler in training, so at least one rank has a value.
    TR_CHECK(r[1] >= 1, "kto: no rank contributed a KL estimate to this micro-batch's all-reduce");
    labels = {r[2], r[3], r[4], r[5]};
    share = 1 / r[1];
    return torch::full({}, r[0] / r[1], kl.options());
  }

  // TRL's figures: kl per micro-batch; entropy over the examples' completion tokens; logits/*
  // token-weighted over the desirable (chosen) and undesirable (rejected) examples; logps/* and
  // rewards/* means over the examples of that label (sums of `here`, which the core adds over the
  // ranks); rewards/margins the difference of the two reward means over all the ranks
  // (`everywhere`), logged when they have both labels. kl and rewards/margins are the same on
  // every rank with a value; each logs them with weight `share` (1 / those ranks), so the core's
  // sum over the ranks counts a micro-batch once and the logged figure is the mean over the
  // micro-batches, as TRL's (also in an evaluation where some ranks run a filler batch).
  void log(const TokenLogProbs& lp, int64_t B, const at::Tensor& desirable, const at::Tensor& logps,
           const at::Tensor& kl, const LabelSums& here, const LabelSums& everywhere, double share) {
    const Split s = fwd_.split;
    auto rows_sum = [&](const at::Tensor& per_token, const at::Tensor& rows) {
      return sum_of(per_token.slice(0, 0, B).sum(1).to(torch::kDouble).masked_select(rows));
    };
    const at::Tensor undesirable = desirable.logical_not();
    const at::Tensor tok = lp.num_tokens.slice(0, 0, B).to(torch::kDouble);
    const double chosen_tokens = sum_of(tok.masked_select(desirable));
    const double rejected_tokens = sum_of(tok.masked_select(undesirable));
    metrics_.add(s, "kl", share * kl.item<double>(), share);
    metrics_.add(s, "entropy", sum_of(lp.entropy.slice(0, 0, B).to(torch::kDouble)),
                 chosen_tokens + rejected_tokens);
    metrics_.add(s, "logits/chosen", rows_sum(lp.mean_logits, desirable), chosen_tokens);
    metrics_.add(s, "logits/rejected", rows_sum(lp.mean_logits, undesirable), rejected_tokens);
    const at::Tensor lp64 = logps.to(torch::kDouble);
    metrics_.add(s, "logps/chosen", sum_of(lp64.masked_select(desirable)), here.n_chosen);
    metrics_.add(s, "logps/rejected", sum_of(lp64.masked_select(undesirable)), here.n_rejected);
    metrics_.add(s, "rewards/chosen", here.chosen_rewards, here.n_chosen);
    metrics_.add(s, "rewards/rejected", here.rejected_rewards, here.n_rejected);
    const LabelSums& e = everywhere;
    if (e.n_chosen > 0 && e.n_rejected > 0)
      metrics_.add(s, "rewards/margins",
                   share * (e.chosen_rewards / e.n_chosen - e.rejected_rewards / e.n_rejected),
                   share);
  }

  double beta_, desirable_weight_, undesirable_weight_;
  bool kl_;  // loss_type "kto": the KL estimate from the KL rows
  ObjectiveForward fwd_;
  at::Tensor reference_;
  MetricSums metrics_;
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

extern const trainrun_component_v1 kComponents[5] = {
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
    v1::component<v1::Objective, KtoObjective>(
        "kto",
        "KTO: unpaired desirable / undesirable examples against a reference, with the batch "
        "KL estimate (TRL KTOTrainer; the `unpaired` dataset)"),
};

}  // namespace trainrun::objectives
