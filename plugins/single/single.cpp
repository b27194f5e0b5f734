#include "single.hpp"

#include <trainrun/plugin.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

namespace trainrun::plugins {

void SingleStrategy::declare_options(OptionSchema&) {}

SingleStrategy::SingleStrategy(const Options&, const RunContext& ctx) {
  TR_CHECK_TYPED(ConfigError, ctx.world_size == 1, "strategy 'single' runs one process; this job "
                 "has world_size ", ctx.world_size, " (use a data-parallel strategy)");
}

void SingleStrategy::setup(Model& model, Accelerator& accelerator, const TrainPlan&) {
  TR_CHECK(model_ == nullptr, "strategy 'single': setup() called twice");
  model_ = &model;
  device_ = accelerator.device();
  if (!device_.is_cpu()) {
    // Parameters are created on the CPU; only an nn::Module can be moved without the model's
    // help (to() keeps the parameter objects, so names and optimizer identity survive).
    torch::nn::Module* m = model.module();
    TR_CHECK(m != nullptr, "strategy 'single': the model is not a torch::nn::Module, so it "
             "cannot be moved to ", device_);
    m->to(device_);
  }
  params_ = model.named_parameters();
  trainable_.clear();
  for (const auto& p : params_)
    if (p.tensor.requires_grad()) trainable_.push_back(p);
  TR_CHECK(!trainable_.empty(), "strategy 'single': the model has no parameter with "
           "requires_grad (", params_.size(), " parameters, all frozen)");
}

std::vector<NamedTensor> SingleStrategy::optimizer_parameters() {
  check_setup("optimizer_parameters");
  return trainable_;
}

ModelOutput SingleStrategy::forward(const Batch& batch) {
  check_setup("forward");
  if (device_.is_cpu()) return model_->forward(batch);
  Batch moved = batch;
  if (moved.input.defined()) moved.input = moved.input.to(device_, /*non_blocking=*/true);
  if (moved.target.defined()) moved.target = moved.target.to(device_, /*non_blocking=*/true);
  return model_->forward(moved);
}

double SingleStrategy::grad_norm() {
  check_setup("grad_norm");
  // Per-tensor norms in the gradient's dtype (a float64 copy of every gradient cost 5x more),
  // combined in float64 on the device, so a device run pays one synchronisation per step.
  std::vector<at::Tensor> norms;
  norms.reserve(trainable_.size());
  for (const auto& p : trainable_) {
    const at::Tensor& g = p.tensor.grad();
    if (g.defined())
      norms.push_back(at::linalg_vector_norm(g, 2).to(at::kDouble));
  }
  if (norms.empty()) return 0.0;
  return at::stack(norms).norm().item<double>();
}

void SingleStrategy::zero_grad() {
  check_setup("zero_grad");
  // Undefined rather than zeroed: the next backward writes instead of accumulating, and a
  // parameter unused by that step shows up as having no gradient (the optimizer skips it).
  for (auto& p : params_) p.tensor.mutable_grad() = at::Tensor();
}

std::vector<NamedTensor> SingleStrategy::full_state_dict() {
  check_setup("full_state_dict");
  std::vector<NamedTensor> out;
  for (const auto& p : params_) out.push_back({p.name, p.tensor.detach()});
  for (auto& b : model_->named_buffers()) out.push_back({b.name, b.tensor.detach()});
  return out;
}

void SingleStrategy::check_setup(const char* what) const {
  TR_CHECK(model_ != nullptr, "strategy 'single': ", what, "() called before setup()");
}

}  // namespace trainrun::plugins

// The unit tests compile this file into one binary with the other plugins; each plugin's entry
// symbol has the same name, so the tests leave it out.
#ifndef TRAINRUN_NO_PLUGIN_ENTRY
TRAINRUN_PLUGIN("single", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy,
                                        trainrun::plugins::SingleStrategy>(
                    "single", "one process, whole model, no communication"))
#endif
