// Objective `reward` (ABI 1.9): a reward model trained on preference pairs with the
// Bradley-Terry loss (Bradley & Terry 1952; Ouyang et al. 2022, InstructGPT's reward model), as
// TRL 1.16's RewardTrainer computes it:
//   loss = mean over pairs of -log sigmoid(r_chosen - r_rejected)
//          + center_rewards_coefficient * mean over pairs of (r_chosen + r_rejected)^2
// (the second term as Eisenstein et al. 2023 propose, to keep rewards centred on 0); when the
// pairs have a "margin" (the dataset's per-sample value, ABI 1.10 SampleValues), the first term is
// -log sigmoid(r_chosen - r_rejected - margin), as TRL's with a margin column. A reward r
// is the model's score head at the last non-padding token of prompt + completion
// (TokenLogProbs::scores, one label). The batch is the `preference` dataset's with
// trainer = "reward": rows 0..B-1 prompt + chosen, rows B..2B-1 prompt + rejected, whole sequences;
// Batch::num_targets = B.
//
// Logged as TRL does: accuracy (pairs with r_chosen > r_rejected), margin (mean r_chosen -
// r_rejected), mean_reward over every score, and min_reward / max_reward, the extremes of each
// micro-batch's scores over all ranks averaged over the micro-batches (ObjectiveExtremes).
#include <torch/types.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "trainrun/objective.hpp"
#include "trainrun/plugin.hpp"

namespace trainrun::reward {

using v1::Batch;
using v1::ModelOutput;
using v1::ObjectiveExtreme;
using v1::ObjectiveForward;
using v1::ObjectiveMetric;
using v1::Options;
using v1::OptionSchema;
using v1::RunContext;
using v1::Split;
using v1::TokenLogProbs;

/// Bradley-Terry reward modelling (TRL RewardTrainer).
class RewardObjective final : public v1::Objective, public v1::ObjectiveExtremes {
 public:
  static void declare_options(OptionSchema& s) {
    s.real("center_rewards_coefficient", 0.0,
           "weight of mean((r_chosen + r_rejected)^2) added to the loss, which keeps rewards "
           "centred on 0 (TRL's center_rewards_coefficient; 0 = off, TRL's None)",
           0.0);
  }
  RewardObjective(const Options& o, const RunContext&)
      : center_(o.get_double("center_rewards_coefficient")) {}

  std::string task() const override { return "reward"; }
  uint32_t wanted_statistics() const override { return kScores; }
  void begin_forward(const ObjectiveForward& f) override { fwd_ = f; }

  ModelOutput compute(const TokenLogProbs& lp, const Batch& batch) override {
    const at::Tensor& scores = lp.scores;
    TR_CHECK(scores.defined() && scores.dim() == 2 && scores.size(1) == 1,
             "reward: the model's score head must have one label (num_labels = 1), got scores ",
             scores.defined() ? scores.sizes() : c10::IntArrayRef{});
    const int64_t rows = scores.size(0), pairs = batch.num_targets;
    TR_CHECK(rows == 2 * pairs, "reward: a batch of ", pairs, " pairs must have ", 2 * pairs,
             " rows (chosen, then rejected), got ", rows);
    const at::Tensor r = scores.squeeze(1).to(at::kFloat);
    const at::Tensor chosen = r.slice(0, 0, pairs), rejected = r.slice(0, pairs, rows);
    const at::Tensor margin = chosen - rejected;
    at::Tensor loss = -at::log_sigmoid(margin - wanted_margin(pairs, r.device()));
    if (center_ > 0) loss = loss + center_ * (chosen + rejected).pow(2);
    ModelOutput out;
    out.loss_sum = loss.sum();
    const at::Tensor d = margin.detach();
    out.num_correct = d.gt(0).sum().item<int64_t>();
    const Split s = fwd_.split;
    const at::Tensor all = r.detach();
    auto& m = sums_[s == Split::Train ? 0 : 1];
    auto& e = extremes_[s == Split::Train ? 0 : 1];
    if (fwd_.filler) {
      e[0].push_back(std::numeric_limits<double>::infinity());
      e[1].push_back(-std::numeric_limits<double>::infinity());
      return out;
    }
    m[0] += static_cast<double>(out.num_correct);
    m[1] += d.sum().item<double>();
    m[2] += all.sum().item<double>();
    m[3] += static_cast<double>(pairs);
    e[0].push_back(all.min().item<double>());
    e[1].push_back(all.max().item<double>());
    return out;
  }

  std::vector<ObjectiveMetric> take_metrics(Split s) override {
    auto& m = sums_[s == Split::Train ? 0 : 1];
    std::vector<ObjectiveMetric> out = {
        {"accuracy", m[0], m[3]}, {"margin", m[1], m[3]}, {"mean_reward", m[2], 2 * m[3]}};
    m = {0, 0, 0, 0};
    return out;
  }

  std::vector<ObjectiveExtreme> take_extremes(Split s) override {
    auto& e = extremes_[s == Split::Train ? 0 : 1];
    std::vector<ObjectiveExtreme> out = {{"min_reward", false, e[0]}, {"max_reward", true, e[1]}};
    e[0].clear();
    e[1].clear();
    return out;
  }

 private:
  // The pairs' "margin" values as float32 [pairs], or 0 when the data has none.
  at::Tensor wanted_margin(int64_t pairs, c10::Device device) const {
    const auto& names = fwd_.sample_value_names;
    const auto it = std::find(names.begin(), names.end(), "margin");
    if (it == names.end()) return torch::zeros({}, torch::TensorOptions(device));
    const at::Tensor& v = fwd_.sample_values;
    TR_CHECK(v.defined() && v.dim() == 2 && v.size(0) == pairs &&
                 v.size(1) == static_cast<int64_t>(names.size()),
             "reward: the dataset gave sample values of shape ",
             v.defined() ? v.sizes() : c10::IntArrayRef{}, " for ", pairs, " pairs and ",
             names.size(), " names");
    return v.select(1, it - names.begin()).to(device, at::kFloat);
  }

  double center_ = 0;
  ObjectiveForward fwd_;
  std::array<double, 4> sums_[2] = {};  ///< per split: correct pairs, Σ margin, Σ rewards, pairs
  std::vector<double> extremes_[2][2];  ///< per split: per micro-batch minima, maxima
};

extern const trainrun_component_v1 kComponents[1] = {
    v1::component<v1::Objective, RewardObjective>(
        "reward",
        "Bradley-Terry reward modelling on preference pairs (TRL RewardTrainer): "
        "-log sigmoid(r_chosen - r_rejected), on a model with a score head"),
};

}  // namespace trainrun::reward
