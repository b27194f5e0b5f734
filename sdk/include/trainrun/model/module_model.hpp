#pragma once
// Helpers for models built from a torch::nn::Module: the Model plumbing (parameters, buffers,
// train/eval, module()) and the classification / next-token loss every shipped model uses.
#include <ATen/ops/cross_entropy_loss.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/types.hpp"

namespace trainrun::v1 {

/// Cross-entropy summed over every target, plus the number of correct arg-max predictions.
///
/// logits: floating point [N, C] or [B, T, C] (any floating dtype; the loss is computed in
///         float32 so a bfloat16 forward still yields a float32 loss).
/// target: int64 [N] or [B, T] (same leading shape as logits), values in [0, C), or kIgnoreIndex
///         (-100) for positions that do not count (they add nothing to loss_sum or num_correct).
/// Returns ModelOutput{loss_sum: float32 scalar = sum of -log p(target) in nats, num_correct:
/// number of targets whose arg-max prediction equals the target, counted only when autograd is
/// off (evaluation) and -1 otherwise: training reports no accuracy, and the arg-max is a full
/// extra pass over the logits (about 5% of a small gpt's step).}
/// Throws Error when the shapes disagree; LibTorch throws c10::Error on a target out of range.
inline ModelOutput cross_entropy_sum(const at::Tensor& logits, const at::Tensor& target) {
  TR_CHECK(logits.dim() >= 2, "cross_entropy_sum: logits must be [N, C] or [B, T, C], got ",
           logits.sizes());
  TR_CHECK(target.dim() == logits.dim() - 1,
           "cross_entropy_sum: target must have one dimension fewer than logits (logits ",
           logits.sizes(), ", target ", target.sizes(), ")");
  for (int64_t d = 0; d < target.dim(); ++d)
    TR_CHECK(target.size(d) == logits.size(d), "cross_entropy_sum: logits ", logits.sizes(),
             " and target ", target.sizes(), " disagree in dimension ", d);
  const int64_t classes = logits.size(-1);
  // Flattening to [N, C] keeps one code path for classification and language modelling.
  const at::Tensor flat_logits = logits.reshape({-1, classes}).to(at::kFloat);
  const at::Tensor flat_target = target.reshape({-1});
  ModelOutput out;
  out.loss_sum = at::cross_entropy_loss(flat_logits, flat_target, /*weight=*/{},
                                        at::Reduction::Sum, kIgnoreIndex);
  if (!c10::GradMode::is_enabled())
    out.num_correct = flat_logits.argmax(-1).eq(flat_target).sum().item<int64_t>();
  return out;
}

/// Base class for a Model that wraps one torch::nn::Module. Implements named_parameters(),
/// named_buffers(), train() and module() from that module; a subclass implements forward() and
/// describe() (and units() if it has sharding units).
///
/// Parameter names are the module's state-dict names ("blocks.0.attn.c_attn.weight"), in
/// registration order. A parameter shared by two submodules appears once per registration, so
/// tie weights by reusing the tensor in forward() rather than by registering it twice.
class ModuleModel : public Model {
 public:
  /// The module is set later with set_module() (typical when the subclass builds it from options
  /// in its constructor body).
  ModuleModel() = default;
  /// Wraps `module` (must not be null; throws Error otherwise).
  explicit ModuleModel(std::shared_ptr<torch::nn::Module> module) { set_module(std::move(module)); }

  /// Parameters of the module and all its submodules, recursively, in registration order.
  std::vector<NamedTensor> named_parameters() override {
    std::vector<NamedTensor> out;
    for (const auto& item : checked().named_parameters(/*recurse=*/true))
      out.push_back({item.key(), item.value()});
    return out;
  }
  /// Registered buffers, recursively (e.g. running statistics).
  std::vector<NamedTensor> named_buffers() override {
    std::vector<NamedTensor> out;
    for (const auto& item : checked().named_buffers(/*recurse=*/true))
      out.push_back({item.key(), item.value()});
    return out;
  }
  /// Training mode (dropout active) when on, evaluation mode otherwise; applies recursively.
  void train(bool on) override { checked().train(on); }
  /// The wrapped module (never null once set).
  torch::nn::Module* module() override { return module_.get(); }

 protected:
  /// Sets the wrapped module. Throws Error when `module` is null.
  void set_module(std::shared_ptr<torch::nn::Module> module) {
    TR_CHECK(module != nullptr, "ModuleModel: module must not be null");
    module_ = std::move(module);
  }
  /// The wrapped module; throws Error when set_module() has not been called yet.
  torch::nn::Module& checked() {
    TR_CHECK(module_ != nullptr, "ModuleModel: set_module() was not called");
    return *module_;
  }

  /// The wrapped module (null until set_module()).
  std::shared_ptr<torch::nn::Module> module_;
};

}  // namespace trainrun::v1
