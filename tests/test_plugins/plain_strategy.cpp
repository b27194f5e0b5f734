// Test-only strategy (never installed) for the checkpoint tests: `plain-single`, one process,
// built against ABI 1.4 but WITHOUT the CheckpointableStrategy capability, as a third-party
// strategy written before checkpoints would be. A job that asks it for checkpoints must fail
// before training with a NotSupportedError naming it.
#include <torch/types.h>
#include <torch/utils.h>
#include <trainrun/trainrun.hpp>

namespace tr = trainrun::v1;

namespace {

class PlainSingle final : public tr::Strategy {
 public:
  static void declare_options(tr::OptionSchema&) {}
  PlainSingle(const tr::Options&, const tr::RunContext&) {}
  void setup(tr::Model& model, tr::Accelerator&, const tr::TrainPlan&) override {
    model_ = &model;
    for (auto& p : model.named_parameters())
      if (p.tensor.requires_grad()) params_.push_back(p);
  }
  std::vector<tr::NamedTensor> optimizer_parameters() override { return params_; }
  tr::ModelOutput forward(const tr::Batch& batch) override { return model_->forward(batch); }
  void finish_gradient_sync() override {}
  double grad_norm() override {
    double sq = 0;
    for (auto& p : params_)
      if (p.tensor.grad().defined()) sq += p.tensor.grad().pow(2).sum().item<double>();
    return std::sqrt(sq);
  }
  void zero_grad() override {
    for (auto& p : params_) p.tensor.mutable_grad() = at::Tensor();
  }

 private:
  tr::Model* model_ = nullptr;
  std::vector<tr::NamedTensor> params_;
};

}  // namespace

TRAINRUN_PLUGIN("ckpt-test-strategies", "0.0.1",
                tr::component<tr::Strategy, PlainSingle>(
                    "plain-single", "test strategy without the checkpoint capability"))
