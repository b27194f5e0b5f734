#pragma once
// Gradient-ready notification, as PyTorch's DDP reducer does it: a post-hook on each
// parameter's gradient accumulator (torch/csrc/distributed/c10d/reducer.cpp). A post-hook runs
// after the accumulator added this backward's gradient to .grad, so .grad is final for this
// backward when it fires (a tensor hook would run before). ddp, ring and the sharding engine
// all install their hooks through this one class.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/types.hpp"

namespace trainrun::v1 {

/// The post-hooks of a list of parameters' gradient accumulators. The accumulators are kept
/// alive (a parameter only holds a weak_ptr to its own), as PyTorch's reducer does, so the hooks
/// survive between backwards. remove() (or the destructor) takes every hook off again: call it
/// before the object the callback points at goes away, since the model may outlive it.
class GradientHooks {
 public:
  GradientHooks() = default;
  GradientHooks(const GradientHooks&) = delete;
  GradientHooks& operator=(const GradientHooks&) = delete;
  ~GradientHooks() { remove(); }

  /// Adds a hook to each of `params` (in order) that calls `on_ready(i)` with the parameter's
  /// index in `params` once its gradient of the running backward is accumulated. Throws Error
  /// naming `who` and the parameter when one has no gradient accumulator (not a leaf that
  /// requires grad).
  void install(const std::vector<NamedTensor>& params, const std::string& who,
               std::function<void(size_t)> on_ready) {
    for (size_t i = 0; i < params.size(); ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(params[i].tensor);
      TR_CHECK(acc != nullptr, who, ": parameter '", params[i].name,
               "' has no gradient accumulator");
      keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [on_ready, i](const torch::autograd::variable_list& outputs,
                        const torch::autograd::variable_list&) {
            on_ready(i);
            return outputs;
          })));
      accumulators_.push_back(std::move(acc));
    }
  }

  /// Takes every installed hook off its accumulator (idempotent).
  void remove() {
    for (size_t i = 0; i < accumulators_.size() && i < keys_.size(); ++i)
      accumulators_[i]->del_post_hook(keys_[i]);
    accumulators_.clear();
    keys_.clear();
  }

 private:
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> keys_;
};

}  // namespace trainrun::v1
