#pragma once
// Reduced-precision components of the precision plugin, after Lightning's precision plugins
// (bf16-mixed, bf16-true, 16-mixed) and DeepSpeed's fp16/bf16 engines:
//
//   bf16-mixed  weights, gradients and optimizer state stay float32 (the model's own parameters
//               are the fp32 master weights); the forward runs under autocast to bfloat16, so
//               matmul-class ops (linear, matmul, conv, bmm, addmm) compute in bf16 and
//               precision-sensitive ones (softmax-cross-entropy, reductions) in fp32. No loss
//               scaling: bf16 has float32's exponent range (Lightning and DeepSpeed use none).
//   bf16-true   the model's floating parameters and buffers are cast to bfloat16 once; the
//               optimizer keeps fp32 master copies and its state in fp32 (plugins/optimizers/optim). The
//               forward also runs under bf16 autocast, so float32 inputs meet bf16 weights in a
//               bf16 matmul instead of a dtype error. Gradients are bf16.
//   fp16-mixed  float16 autocast where the device has it (CUDA builds); on CPU, LibTorch 1.13
//               has no float16 matmul kernels and CPU autocast only knows bfloat16, so the
//               compute stays float32. The dynamic loss scaler is fully active either way:
//               the loss is multiplied by the scale, the scaled gradients are checked on every
//               rank (and, with fp16_range_check, any |g| > 65504, float16's largest finite
//               value, counts as an overflow, as it would in a float16 backward), the step is
//               skipped on every rank on overflow, gradients are unscaled before clipping.
//   auto        bf16-mixed where the CPU computes bfloat16 natively (avx512_bf16 or amx_bf16)
//               and autocast works, else fp32; the choice is printed once by rank 0.
#include <trainrun/interfaces.hpp>

#include <memory>
#include <optional>

#include "loss_scaler.hpp"

namespace trainrun::plugins {

/// Autocast state of this thread, set for the life of the object and restored afterwards,
/// with the nesting count and cast cache handled as torch.autocast does (the cache is cleared
/// when the outermost autocast region ends).
class AutocastScope final : public v1::Scope {
 public:
  /// cpu_dtype / cuda_dtype: the autocast dtype per device type, nullopt = leave that device
  /// type's autocast off.
  AutocastScope(std::optional<at::ScalarType> cpu_dtype, std::optional<at::ScalarType> cuda_dtype);
  ~AutocastScope() override;
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool prev_cpu_, prev_cuda_;
  at::ScalarType prev_cpu_dtype_, prev_cuda_dtype_;
};

/// The settings that make one of the components below.
struct MixedConfig {
  std::string name;                             ///< component name, for messages
  std::optional<at::ScalarType> cpu_autocast;   ///< CPU autocast dtype (bf16) or none
  std::optional<at::ScalarType> cuda_autocast;  ///< CUDA autocast dtype or none
  std::optional<at::ScalarType> cast_weights;   ///< bf16-true: the dtype weights are cast to
  std::optional<LossScalerOptions> dynamic;     ///< dynamic loss scaling, or none
  double static_scale = 1.0;                    ///< constant loss scale when not dynamic
  bool fp16_range_check = false;                ///< |g| > 65504 counts as overflow
  /// bf16-mixed / bf16-true: the plugin name and this rank; rank 0 says at convert() when the
  /// model is on a CPU without native bfloat16 (emulated: correct, slower). -1: say nothing
  /// (`auto` says what it chose itself).
  std::string plugin;
  int rank = -1;
  /// bf16-mixed: keep frozen Linear weights in bf16 for the run (v1::FrozenWeightCopies).
  bool frozen_weight_copies = false;
};

/// bf16-mixed, bf16-true and fp16-mixed: one class, configured by MixedConfig.
class MixedPrecision : public v1::Precision,
                       public v1::PrecisionBytes,
                       public v1::StepMetricsSource,
                       public v1::CheckpointState,
                       public v1::FrozenWeightCopies {
 public:
  explicit MixedPrecision(MixedConfig config);

  /// bf16 for bf16-mixed with frozen_weight_copies (its default), else none.
  std::optional<at::ScalarType> frozen_weight_dtype() const override;

  void convert(v1::Model& model) override;
  std::unique_ptr<v1::Scope> autocast() override;
  at::Tensor scale_loss(const at::Tensor& loss) override;
  bool unscale_and_check(const std::vector<at::Tensor>& grads, v1::Communicator& comm) override;
  void update(bool skipped) override;
  double loss_scale() const override;

  double param_bytes() const override;
  double grad_bytes() const override;
  double master_bytes() const override;

  /// Adds loss_scale on every step when a loss scale is in use (the core adds it only when it
  /// differs from 1; a scaler at min_loss_scale = 1 still shows it).
  void add_step_metrics(std::map<std::string, double>& extra) override;

  /// The dynamic scaler's state (see DynamicLossScaler::checkpoint_state); empty without one.
  std::map<std::string, double> checkpoint_state() const override;
  void load_checkpoint_state(const std::map<std::string, double>& state) override;

  const MixedConfig& config() const { return config_; }
  const DynamicLossScaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }

 private:
  MixedConfig config_;
  std::optional<DynamicLossScaler> scaler_;
};

/// Scaled gradients that overflow: a non-finite element anywhere or, with fp16_range_check,
/// an element outside [-65504, 65504]. On this rank only.
bool overflow_local(const std::vector<at::Tensor>& grads, bool fp16_range_check);

/// `bf16-mixed`: frozen_weight_copies (default true: see v1::FrozenWeightCopies).
class Bf16Mixed final : public MixedPrecision {
 public:
  static void declare_options(v1::OptionSchema& schema);
  Bf16Mixed(const v1::Options& options, const v1::RunContext& ctx);
};

/// `bf16-true`: no options.
class Bf16True final : public MixedPrecision {
 public:
  static void declare_options(v1::OptionSchema& schema);
  Bf16True(const v1::Options& options, const v1::RunContext& ctx);
};

/// `fp16-mixed`: the loss scaler's options, DeepSpeed's names and defaults (loss_scale,
/// initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale),
/// plus raise_error_at_min_scale and fp16_range_check.
class Fp16Mixed final : public MixedPrecision {
 public:
  static void declare_options(v1::OptionSchema& schema);
  Fp16Mixed(const v1::Options& options, const v1::RunContext& ctx);
  /// The MixedConfig the options describe (throws ConfigError naming a bad key).
  static MixedConfig config_from(const v1::Options& options);
};

/// Whether this CPU computes bfloat16 natively: /proc/cpuinfo lists avx512_bf16 or amx_bf16.
/// `why` receives a short reason either way.
bool cpu_has_native_bf16(std::string* why = nullptr);

/// Whether /proc/cpuinfo's first `flags` line lists `flag` (e.g. "avx512f").
bool cpu_has_flag(const std::string& flag);

/// `auto`: bf16-mixed where supported (see the file comment), else fp32 (the fp32 component's
/// behaviour: no autocast, no scaling, the finite check). Forwards every call to the choice.
class AutoPrecision final : public v1::Precision,
                            public v1::PrecisionBytes,
                            public v1::StepMetricsSource,
                            public v1::CheckpointState,
                            public v1::FrozenWeightCopies {
 public:
  static void declare_options(v1::OptionSchema& schema);
  AutoPrecision(const v1::Options& options, const v1::RunContext& ctx);

  void convert(v1::Model& model) override { chosen_->convert(model); }
  std::unique_ptr<v1::Scope> autocast() override { return chosen_->autocast(); }
  at::Tensor scale_loss(const at::Tensor& loss) override { return chosen_->scale_loss(loss); }
  bool unscale_and_check(const std::vector<at::Tensor>& grads, v1::Communicator& comm) override {
    return chosen_->unscale_and_check(grads, comm);
  }
  void update(bool skipped) override { chosen_->update(skipped); }
  double loss_scale() const override { return chosen_->loss_scale(); }
  std::optional<at::ScalarType> frozen_weight_dtype() const override {
    return chosen_->frozen_weight_dtype();
  }
  double param_bytes() const override { return chosen_->param_bytes(); }
  double grad_bytes() const override { return chosen_->grad_bytes(); }
  double master_bytes() const override { return chosen_->master_bytes(); }
  void add_step_metrics(std::map<std::string, double>& extra) override {
    chosen_->add_step_metrics(extra);
  }
  std::map<std::string, double> checkpoint_state() const override {
    return chosen_->checkpoint_state();
  }
  void load_checkpoint_state(const std::map<std::string, double>& s) override {
    chosen_->load_checkpoint_state(s);
  }
  /// "bf16-mixed" or "fp32".
  const std::string& choice() const { return chosen_name_; }

 private:
  std::unique_ptr<MixedPrecision> chosen_;
  std::string chosen_name_;
};

}  // namespace trainrun::plugins
