#pragma once
// Sharding units. LibTorch's C++ nn::Module has no forward hooks, so a model marks the
// granularity at which a strategy may gather/shard parameters (a transformer block, say) by
// running that part of its forward through a Unit. Follows the "unit" of PyTorch FSDP's
// auto-wrap policy and ZeRO-3's per-submodule parameter gathering.
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

  /// Runs fn() (the unit's forward) between pre_forward and post_forward.
  template <class F>
  auto run(F&& fn) {
    if (hooks_) hooks_->pre_forward(*this);
    auto out = fn();
    if (hooks_) hooks_->post_forward(*this);
    return out;
  }

 private:
  std::string name_;
  std::shared_ptr<torch::nn::Module> module_;
  UnitHooks* hooks_ = nullptr;
};

}  // namespace trainrun::v1
