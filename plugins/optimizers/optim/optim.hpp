#pragma once
// Optimizer components `sgd` and `adamw`. The update rules are written out on the tensors rather
// than wrapping torch::optim, because torch::optim owns its parameter list and state layout,
// while a ZeRO strategy needs to step a flat shard it owns and checkpoint the state by name.
#include <trainrun/interfaces.hpp>
#include <trainrun/optim/lr_schedule.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace trainrun::plugins {

/// What both rules keep per parameter. State tensors are allocated in init() and never
/// reallocated, so state() hands out the live tensors: a checkpoint reader can restore them in
/// place with copy_(). `step` counts this parameter's updates (a parameter without a gradient is
/// skipped and does not advance, as in torch.optim); it is a CPU int64 scalar so reading it
/// never synchronises a device.
struct ParamSlot {
  std::string name;
  at::Tensor param;
  at::Tensor step;
  std::vector<at::Tensor> buffers;  ///< rule-specific, named by the rule's buffer_names
  /// float32 master copy of a bfloat16/float16 parameter (precision bf16-true), undefined for a
  /// float32 one. The rule steps the master with the gradient converted to float32, its
  /// buffers are float32, and the parameter receives the rounded result after every update, so
  /// updates smaller than the parameter's own resolution still accumulate (mixed-precision
  /// training's master weights, Micikevicius et al., ICLR 2018). In state() as "<name>.master".
  at::Tensor master;
  /// The tensor the rule updates: the master when there is one, else the parameter.
  at::Tensor& weights() { return master.defined() ? master : param; }
};

/// Shared plumbing: the schedule, the parameter slots and the named state.
class ScheduledOptimizer : public v1::Optimizer {
 public:
  void init(const std::vector<v1::NamedTensor>& params, const v1::TrainPlan& plan) override;
  double lr(int64_t step) const override;
  std::vector<v1::NamedTensor> state() override;

 protected:
  ScheduledOptimizer(const v1::Options& options, double peak_lr,
                     std::vector<std::string> buffer_names);
  /// Whether this rule needs per-parameter buffers at all (SGD without momentum does not).
  virtual bool needs_state() const { return !buffer_names_.empty(); }
  void check_initialized(const char* what) const;
  /// The rule's update of one parameter: its slot, its gradient (checked, and in the dtype of
  /// `weights`), slot.weights() and the step's learning rate.
  using Update =
      std::function<void(ParamSlot& slot, const at::Tensor& grad, at::Tensor& weights, double lr)>;
  /// One optimizer step: `update` for every parameter that has a gradient (one without is
  /// skipped, as in torch.optim), at step `step`'s learning rate, without autograd; then a
  /// parameter with a master copy takes its rounded value.
  void update_each(int64_t step, const Update& update);

  std::string context_;
  v1::LrSchedule schedule_;
  std::vector<std::string> buffer_names_;
  std::vector<ParamSlot> slots_;
  bool initialized_ = false;
};

/// torch.optim.SGD (PyTorch 1.13) with momentum, dampening, Nesterov and coupled L2 weight
/// decay:  g += wd * p;  b = g (first step) or momentum * b + (1 - dampening) * g;
///         g = g + momentum * b (Nesterov) or b;  p -= lr * g.
class Sgd final : public ScheduledOptimizer, public v1::OptimizerStateBytes {
 public:
  static void declare_options(v1::OptionSchema& schema);
  Sgd(const v1::Options& options, const v1::RunContext& ctx);
  void step(int64_t step) override;
  /// The momentum buffer (4 bytes per parameter), none without momentum.
  double state_bytes_per_param() const override { return momentum_ != 0 ? 4 : 0; }

 protected:
  bool needs_state() const override { return momentum_ != 0; }

 private:
  double momentum_;
  double dampening_;
  double weight_decay_;
  bool nesterov_;
};

/// torch.optim.AdamW (PyTorch 1.13, amsgrad off): Adam with decoupled weight decay
/// (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019):
///   p *= 1 - lr * wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
///   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
/// With no_decay_1d, parameters of dim < 2 (biases, norm weights) get no decay, as in the
/// parameter grouping of GPT-2/BERT training code. The dimension is the parameter's shape as
/// the model created it (ParameterShapesAware), so the 1-D pieces a ZeRO/FSDP strategy hands
/// over are decayed exactly as the unsharded parameters would be.
class AdamW final : public ScheduledOptimizer, public v1::ParameterShapesAware, public v1::OptimizerStateBytes {
 public:
  static void declare_options(v1::OptionSchema& schema);
  AdamW(const v1::Options& options, const v1::RunContext& ctx);
  void step(int64_t step) override;
  /// exp_avg and exp_avg_sq in float32.
  double state_bytes_per_param() const override { return 8; }
  void set_parameter_shapes(const std::map<std::string, std::vector<int64_t>>& shapes) override;

 private:
  double beta1_;
  double beta2_;
  double eps_;
  double weight_decay_;
  bool no_decay_1d_;
  std::map<std::string, std::vector<int64_t>> shapes_;
};

}  // namespace trainrun::plugins
