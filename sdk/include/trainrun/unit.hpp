#pragma once
// Sharding units. LibTorch's C++ nn::Module has no forward hooks, so a model marks the
// granularity at which a strategy may gather/shard parameters (a transformer block, say) by
// running that part of its forward through a Unit. Follows the "unit" of PyTorch FSDP's
// auto-wrap policy and ZeRO-3's per-submodule parameter gathering.
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace trainrun::v1 {

class Unit;

/// Callbacks a strategy installs on units, e.g. to all-gather a unit's parameters before its
/// forward and release them after. Exceptions propagate to the model's forward.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void pre_forward(Unit& unit) = 0;
  virtual void post_forward(Unit& unit) = 0;
};

/// ABI 1.3 capability: UnitHooks that also see the unit's output tensor. A sharding strategy
/// uses it to register a gradient hook on the output, which runs just before the unit's own
/// backward (PyTorch FSDP's pre-backward hook), to gather the unit's parameters again. Found
/// with dynamic_cast on the installed UnitHooks; only outputs that are a single at::Tensor are
/// offered. Exceptions propagate to the model's forward.
class UnitOutputHooks {
 public:
  virtual ~UnitOutputHooks() = default;
  /// Called after post_forward with the unit's output (which the hook may replace, e.g. by a
  /// view carrying a hook; shape and value must not change).
  virtual void on_output(Unit& unit, at::Tensor& output) = 0;
};

/// Runs `forward(input)` so that its activations are recomputed during backward instead of
/// stored (activation checkpointing); returns forward(input)'s value. Installed on a unit by
/// the SDK's activation-checkpointing helper (trainrun/model/activation_checkpointing.hpp). The
/// function is called again during backward, after the model's forward has returned: it must
/// capture what it uses by value (the submodule's shared_ptr), never locals by reference.
/// Reference: Chen et al., "Training Deep Nets with Sublinear Memory Cost" (2016);
/// torch.utils.checkpoint.
using Checkpointer = std::function<at::Tensor(
    const at::Tensor& input, const std::function<at::Tensor(const at::Tensor&)>& forward)>;

/// A named submodule whose forward is bracketed by the installed hooks. The model keeps the
/// submodule registered as usual (so parameter names do not change); the Unit is a handle.
class Unit {
 public:
  Unit(std::string name, std::shared_ptr<torch::nn::Module> module)
      : name_(std::move(name)), module_(std::move(module)) {}

  const std::string& name() const { return name_; }
  torch::nn::Module& module() { return *module_; }
  std::shared_ptr<torch::nn::Module> module_ptr() const { return module_; }

  /// Installs hooks (nullptr removes them). The hooks object must outlive the unit's use.
  void set_hooks(UnitHooks* hooks) { hooks_ = hooks; }

  /// Installs (or, with an empty function, removes) activation checkpointing for this unit.
  /// Only run(input, fn) can checkpoint: recomputation needs the input explicitly.
  void set_checkpointer(Checkpointer checkpointer) { checkpointer_ = std::move(checkpointer); }
  bool checkpointing() const { return static_cast<bool>(checkpointer_); }

  /// Runs fn() (the unit's forward) between pre_forward and post_forward. A unit with
  /// checkpointing on throws NotSupported-style std::logic_error: use run(input, fn).
  template <class F>
  auto run(F&& fn) {
    if (checkpointer_)
      throw std::logic_error("unit '" + name_ + "': activation checkpointing needs the unit's "
                             "input; the model must call run(input, fn)");
    if (hooks_) hooks_->pre_forward(*this);
    auto out = fn();
    if (hooks_) {
      hooks_->post_forward(*this);
      if constexpr (std::is_same_v<std::decay_t<decltype(out)>, at::Tensor>)
        if (auto* h = dynamic_cast<UnitOutputHooks*>(hooks_)) h->on_output(*this, out);
    }
    return out;
  }

  /// Runs fn(input) (the unit's forward on one tensor) between pre_forward and post_forward,
  /// through the checkpointer when one is installed. Returns fn's output tensor. With a
  /// checkpointer, fn is kept and called again during backward: capture by value (Checkpointer).
  template <class F>
  at::Tensor run(const at::Tensor& input, F&& fn) {
    if (hooks_) hooks_->pre_forward(*this);
    at::Tensor out = checkpointer_
                         ? checkpointer_(input, std::function<at::Tensor(const at::Tensor&)>(fn))
                         : at::Tensor(fn(input));
    if (hooks_) {
      hooks_->post_forward(*this);
      if (auto* h = dynamic_cast<UnitOutputHooks*>(hooks_)) h->on_output(*this, out);
    }
    return out;
  }

 private:
  std::string name_;
  std::shared_ptr<torch::nn::Module> module_;
  UnitHooks* hooks_ = nullptr;
  Checkpointer checkpointer_;  // ABI 1.3: appended, so 1.2 code sees the same layout before it
};

/// For each parameter tensor (by TensorImpl) of `units`, the index of the one unit that holds
/// it, or -1 when several do (a tied weight): what a sharded strategy may give to one unit's
/// shard and what it must keep whole. Parameters outside every unit are absent.
inline std::map<const void*, int> unit_of_each_parameter(const std::vector<Unit*>& units) {
  std::map<const void*, int> owner;
  for (size_t u = 0; u < units.size(); ++u)
    for (const auto& t : units[u]->module().parameters(/*recurse=*/true)) {
      auto [it, fresh] = owner.emplace(t.unsafeGetTensorImpl(), static_cast<int>(u));
      if (!fresh && it->second != static_cast<int>(u)) it->second = -1;
    }
  return owner;
}

}  // namespace trainrun::v1
