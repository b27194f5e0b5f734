#include "single.hpp"

#include <trainrun/plugin.hpp>
#include <trainrun/strategy/strategy_helpers.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

namespace trainrun::plugins {

using namespace trainrun::v1;

void SingleStrategy::declare_options(OptionSchema&) {}

SingleStrategy::SingleStrategy(const Options&, const RunContext& ctx) {
  TR_CHECK_TYPED(ConfigError, ctx.world_size == 1, "strategy 'single' runs one process; this job "
                 "has world_size ", ctx.world_size,
                 " (use a data-parallel strategy: [strategy] plugin = \"ddp\")");
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
  return model_->forward(batch_to_device(batch, device_));
}

double SingleStrategy::grad_norm() {
  check_setup("grad_norm");
  return local_grad_norm(trainable_);
}

void SingleStrategy::zero_grad() {
  check_setup("zero_grad");
  drop_grads(params_);
}

std::vector<CheckpointPiece> SingleStrategy::optimizer_parameter_pieces() {
  check_setup("optimizer_parameter_pieces");
  return replicated_optimizer_pieces(trainable_, 0);
}

std::vector<CheckpointPiece> SingleStrategy::model_checkpoint_pieces() {
  check_setup("model_checkpoint_pieces");
  return replicated_checkpoint_pieces(params_, *model_, 0);
}

std::vector<NamedTensor> SingleStrategy::full_state_dict() {
  check_setup("full_state_dict");
  return replicated_state_dict(params_, *model_);
}

void SingleStrategy::check_setup(const char* what) const {
  TR_CHECK(model_ != nullptr, "strategy 'single': ", what, "() called before setup()");
}

}  // namespace trainrun::plugins
