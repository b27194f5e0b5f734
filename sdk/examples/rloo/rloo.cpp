// The "rloo" online objective: REINFORCE with the leave-one-out baseline (Ahmadian et al. 2024).
// The loss of a completion is -advantage x (sum of its token log-probabilities) / its tokens;
// Batch::num_targets counts completions, so the core's division makes it a mean over them.
#include <torch/torch.h>
#include <trainrun/trainrun.hpp>

#include <cmath>
#include <string>
#include <vector>

namespace {

using trainrun::v1::Batch;
using trainrun::v1::ModelOutput;
using trainrun::v1::ObjectiveForward;
using trainrun::v1::ObjectiveMetric;
using trainrun::v1::ObjectivePass;
using trainrun::v1::Options;
using trainrun::v1::OptionSchema;
using trainrun::v1::RolloutScores;
using trainrun::v1::RolloutSpec;
using trainrun::v1::RunContext;
using trainrun::v1::Split;
using trainrun::v1::TokenLogProbs;

class Rloo : public trainrun::v1::Objective, public trainrun::v1::OnlineObjective {
 public:
  static void declare_options(OptionSchema& s) {
    s.integer("num_generations", 4, "completions per prompt (the leave-one-out group)", 2, 1024);
    s.integer("max_completion_length", 64, "new tokens per completion at most", 1, 1 << 20);
    s.real("temperature", 1.0, "sampling temperature (the loss uses the plain log-probabilities)",
           1e-6, 1e6);
  }
  Rloo(const Options& o, const RunContext&) {
    spec_.num_generations = o.get_int("num_generations");
    spec_.max_completion_length = o.get_int("max_completion_length");
    spec_.temperature = o.get_double("temperature");
  }

  // What the core needs to know before the run: how to generate (no old or reference passes).
  std::string task() const override { return "prompts"; }
  RolloutSpec rollout_spec() const override { return spec_; }
  void begin_forward(const ObjectiveForward& f) override { fwd_ = f; }

  // After each rollout: the leave-one-out advantages of this rank's completions (a prompt's
  // completions are always on one rank, consecutive).
  void begin_rollout(const RolloutScores& s, trainrun::v1::Communicator*) override {
    const int64_t N = s.rewards.size(0), G = s.num_generations;
    const at::Tensor r = s.rewards.to(torch::kDouble).view({N / G, G});
    const at::Tensor others = (r.sum(1, true) - r) / static_cast<double>(G - 1);
    advantages_ = (r - others).reshape({N});
    reward_sum_ += s.rewards.sum().item<double>();
    reward_count_ += static_cast<double>(N);
  }

  ModelOutput compute(const TokenLogProbs& lp, const Batch&) override {
    TR_CHECK(fwd_.pass == ObjectivePass::Policy, "rloo: needs no old or reference passes");
    const at::Tensor idx = torch::tensor(fwd_.indices, torch::kLong);
    const at::Tensor adv = advantages_.index_select(0, idx).to(torch::kFloat);
    const at::Tensor per_token = lp.logps / lp.num_tokens.clamp_min(1).to(torch::kFloat);
    ModelOutput out;
    out.loss_sum = -(adv * per_token).sum();
    return out;
  }

  // The mean reward of the rollouts since the last call, under TRL's name.
  std::vector<ObjectiveMetric> take_metrics(Split s) override {
    std::vector<ObjectiveMetric> out{
        {"reward", s == Split::Train ? reward_sum_ : 0.0, s == Split::Train ? reward_count_ : 0.0}};
    if (s == Split::Train) reward_sum_ = reward_count_ = 0;
    return out;
  }

 private:
  RolloutSpec spec_;
  ObjectiveForward fwd_;
  at::Tensor advantages_;
  double reward_sum_ = 0, reward_count_ = 0;
};

}  // namespace

TRAINRUN_PLUGIN("rloo", "1.0.0",
                trainrun::v1::component<trainrun::v1::Objective, Rloo>(
                    "rloo",
                    "REINFORCE with a leave-one-out baseline on the model's own "
                    "completions (an example online objective)"))
