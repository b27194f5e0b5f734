// The "rpo" objective: DPO's sigmoid loss plus alpha x the chosen completion's NLL per token
// (Pang et al. 2024). Reads the `preference` dataset's batches: rows 0..B-1 prompt + chosen,
// rows B..2B-1 prompt + rejected, prompt tokens masked (kIgnoreIndex), num_targets = B pairs.
#include <torch/torch.h>
#include <trainrun/trainrun.hpp>

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
using trainrun::v1::RunContext;
using trainrun::v1::Split;
using trainrun::v1::TokenLogProbs;

class Rpo : public trainrun::v1::Objective {
 public:
  static void declare_options(OptionSchema& s) {
    s.real("beta", 0.1, "DPO's beta: deviation from the reference model", 0.0, 1e6);
    s.real("alpha", 1.0, "weight of the chosen completion's NLL per token", 0.0, 1e6);
  }
  Rpo(const Options& o, const RunContext&)
      : beta_(o.get_double("beta")), alpha_(o.get_double("alpha")) {}

  std::string task() const override { return "preference"; }
  // Two reference values per pair: log p_ref(chosen), log p_ref(rejected).
  int64_t reference_width() const override { return 2; }
  void begin_forward(const ObjectiveForward& f) override { fwd_ = f; }

  ModelOutput compute(const TokenLogProbs& lp, const Batch&) override {
    const int64_t B = lp.logps.size(0) / 2;
    TR_CHECK(2 * B == lp.logps.size(0) && B == static_cast<int64_t>(fwd_.indices.size()),
             "rpo: expects the preference dataset's rows (chosen, then rejected)");
    const at::Tensor chosen = lp.logps.slice(0, 0, B), rejected = lp.logps.slice(0, B);
    ModelOutput out;
    if (fwd_.pass == ObjectivePass::Reference) {
      reference_ = torch::stack({chosen, rejected}, 1).detach().to(torch::kDouble).cpu();
      out.loss_sum = torch::zeros({}, torch::kFloat);
      return out;
    }
    const at::Tensor ref = fwd_.reference.to(chosen.device()).to(torch::kFloat);
    const at::Tensor margin = (chosen - ref.select(1, 0)) - (rejected - ref.select(1, 1));
    const at::Tensor nll = -chosen / lp.num_tokens.slice(0, 0, B).clamp_min(1).to(torch::kFloat);
    const at::Tensor losses = -torch::log_sigmoid(beta_ * margin) + alpha_ * nll;
    if (!fwd_.filler) {
      const double n = static_cast<double>(B);
      sums_[0] += (beta_ * margin).sum().item<double>();
      sums_[1] += margin.gt(0).sum().item<double>();
      sums_[2] += nll.sum().item<double>();
      count_ += n;
    }
    out.loss_sum = losses.sum();
    out.num_correct = margin.gt(0).sum().item<int64_t>();
    return out;
  }
  at::Tensor take_reference() override { return reference_; }
  // One set of sums serves both splits: the core takes the training figures after each step's
  // forwards and the held-out ones after an evaluation, which never interleave.
  std::vector<ObjectiveMetric> take_metrics(Split) override {
    std::vector<ObjectiveMetric> m = {{"rewards/margins", sums_[0], count_},
                                      {"rewards/accuracies", sums_[1], count_},
                                      {"nll_loss", sums_[2], count_}};
    sums_[0] = sums_[1] = sums_[2] = count_ = 0;
    return m;
  }

 private:
  double beta_, alpha_;
  ObjectiveForward fwd_;
  at::Tensor reference_;
  double sums_[3] = {0, 0, 0}, count_ = 0;
};

}  // namespace

TRAINRUN_PLUGIN("rpo", "1.0.0",
                trainrun::v1::component<trainrun::v1::Objective, Rpo>(
                    "rpo", "DPO sigmoid loss + alpha x NLL of the chosen completion (RPO)"))
