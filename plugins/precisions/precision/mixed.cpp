#include "mixed.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <trainrun/torch_compat.hpp>

#include <cmath>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "precision.hpp"

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace {

// float16's largest finite value: a scaled gradient beyond it would be inf in a float16
// backward.
constexpr double kFp16Max = 65504.0;

bool is_reduced(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

}  // namespace

// --- autocast ---------------------------------------------------------------------------------

// The per-device-type autocast API on every LibTorch (SDK trainrun/torch_compat.hpp).
using v1::compat::autocast_dtype;
using v1::compat::autocast_enabled;
using v1::compat::set_autocast_dtype;
using v1::compat::set_autocast_enabled;

AutocastScope::AutocastScope(std::optional<at::ScalarType> cpu_dtype,
                             std::optional<at::ScalarType> cuda_dtype)
    : prev_cpu_(autocast_enabled(at::kCPU)),
      prev_cuda_(autocast_enabled(at::kCUDA)),
      prev_cpu_dtype_(autocast_dtype(at::kCPU)),
      prev_cuda_dtype_(autocast_dtype(at::kCUDA)) {
  if (cpu_dtype) {
    set_autocast_dtype(at::kCPU, *cpu_dtype);
    set_autocast_enabled(at::kCPU, true);
  }
  if (cuda_dtype) {
    set_autocast_dtype(at::kCUDA, *cuda_dtype);
    set_autocast_enabled(at::kCUDA, true);
  }
  // As torch.autocast.__enter__/__exit__: the cache of casted weights lives as long as the
  // outermost autocast region, so a weight is cast once per forward, not once per use.
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_enabled(at::kCPU, prev_cpu_);
  set_autocast_dtype(at::kCPU, prev_cpu_dtype_);
  set_autocast_enabled(at::kCUDA, prev_cuda_);
  set_autocast_dtype(at::kCUDA, prev_cuda_dtype_);
}

// --- overflow check ---------------------------------------------------------------------------

bool overflow_local(const std::vector<at::Tensor>& grads, bool fp16_range_check) {
  if (!fp16_range_check) return !all_finite_local(grads);
  c10::NoGradGuard no_grad;
  // min and max of every tensor in one pass each (aminmax propagates NaN), checked together:
  // one host read per step. |x| <= 65504 is false for inf and NaN too.
  std::vector<at::Tensor> extremes;
  extremes.reserve(2 * grads.size());
  for (const auto& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    auto [mn, mx] = at::aminmax(g);
    extremes.push_back(mn.to(at::kFloat).reshape({1}));
    extremes.push_back(mx.to(at::kFloat).reshape({1}));
  }
  if (extremes.empty()) return false;
  return !at::cat(extremes).abs().le(kFp16Max).all().item<bool>();
}

// --- MixedPrecision ---------------------------------------------------------------------------

MixedPrecision::MixedPrecision(MixedConfig config) : config_(std::move(config)) {
  if (config_.dynamic) scaler_.emplace(*config_.dynamic);
  TR_CHECK_TYPED(ConfigError, std::isfinite(config_.static_scale) && config_.static_scale > 0,
                 config_.name, ": loss_scale must be finite and >= 0, got ", config_.static_scale);
}

void MixedPrecision::convert(Model& model) {
  if (config_.rank == 0 &&
      (config_.cpu_autocast == at::kBFloat16 || config_.cast_weights == at::kBFloat16)) {
    const auto params = model.named_parameters();
    if (!params.empty() && params.front().tensor.device().is_cpu() && !cpu_has_native_bf16()) {
      // Without AVX-512, LibTorch 1.13 takes its reference loops for bfloat16 products (oneDNN's
      // bf16 kernels need AVX-512): 1.4 against 24 GFLOPS for float32 on one AMD EPYC (Zen 3)
      // core, a [512, 576] x [576, 1536] product (issue 41).
      std::cerr << "[trainrun] precision " << config_.plugin
                << ": warning: this CPU has no native bfloat16 instructions (avx512_bf16, amx_bf16)"
                << (cpu_has_flag("avx512f")
                        ? ": bf16 products are emulated, slower than float32's"
                        : " and no AVX-512 either: bf16 products run LibTorch's reference loops, "
                          "often 10-20x slower than float32's")
                << "; continuing in bf16 (precision.plugin = \"auto\" or \"fp32\" computes in "
                   "float32 here)"
                << std::endl;
    }
  }
  if (!config_.cast_weights) return;
  const at::ScalarType to = *config_.cast_weights;
  c10::NoGradGuard no_grad;
  // set_data keeps each tensor's identity (the module, the model's units and anything else
  // holding it see the new dtype), its requires_grad and leaf status, as Module::to() does.
  // Only float32 tensors change: integer buffers (counters, masks) and float64 stay.
  for (auto& p : model.named_parameters())
    if (p.tensor.scalar_type() == at::kFloat) p.tensor.set_data(p.tensor.detach().to(to));
  for (auto& b : model.named_buffers())
    if (b.tensor.scalar_type() == at::kFloat) b.tensor.set_data(b.tensor.detach().to(to));
}

std::optional<at::ScalarType> MixedPrecision::frozen_weight_dtype() const {
  if (!config_.frozen_weight_copies || config_.cast_weights || !config_.cpu_autocast)
    return std::nullopt;
  return config_.cpu_autocast;
}

std::unique_ptr<Scope> MixedPrecision::autocast() {
  if (!config_.cpu_autocast && !config_.cuda_autocast) return nullptr;
  return std::make_unique<AutocastScope>(config_.cpu_autocast, config_.cuda_autocast);
}

double MixedPrecision::loss_scale() const {
  return scaler_ ? scaler_->scale() : config_.static_scale;
}

at::Tensor MixedPrecision::scale_loss(const at::Tensor& loss) {
  const double scale = loss_scale();
  return scale == 1.0 ? loss : loss * scale;
}

bool MixedPrecision::unscale_and_check(const std::vector<at::Tensor>& grads,
                                       Communicator& comm) {
  // DeepSpeed's order: check the scaled gradients (agreed by every rank), unscale only when the
  // step will be taken; a skipped step's gradients are dropped by zero_grad anyway.
  const bool ok = all_ranks_agree(!overflow_local(grads, config_.fp16_range_check), grads, comm);
  const double scale = loss_scale();
  if (ok && scale != 1.0) {
    c10::NoGradGuard no_grad;
    // The scale is a power of two times the initial scale: 1/scale is exact for the defaults.
    const double inv = 1.0 / scale;
    for (const auto& g : grads)
      if (g.defined()) g.mul_(inv);
  }
  return ok;
}

void MixedPrecision::update(bool skipped) {
  if (scaler_) scaler_->update(skipped);
}

double MixedPrecision::param_bytes() const { return config_.cast_weights ? 2 : 4; }
double MixedPrecision::grad_bytes() const { return config_.cast_weights ? 2 : 4; }
double MixedPrecision::master_bytes() const { return config_.cast_weights ? 4 : 0; }

void MixedPrecision::add_step_metrics(std::map<std::string, double>& extra) {
  if (scaler_ || config_.static_scale != 1.0) extra["loss_scale"] = loss_scale();
}

std::map<std::string, double> MixedPrecision::checkpoint_state() const {
  return scaler_ ? scaler_->checkpoint_state() : std::map<std::string, double>{};
}

void MixedPrecision::load_checkpoint_state(const std::map<std::string, double>& state) {
  if (scaler_) {
    scaler_->load_checkpoint_state(state);
    return;
  }
  TR_CHECK(state.empty(), config_.name,
           ": checkpoint holds loss-scaler state, but this precision has no dynamic loss "
           "scaler (was the checkpoint written with another [precision]?)");
}

// --- the components ---------------------------------------------------------------------------

void Bf16Mixed::declare_options(OptionSchema& s) {
  s.boolean("frozen_weight_copies", true,
            "keep each frozen float32 Linear weight (a LoRA base) in bf16 for the run instead of "
            "casting it at every forward (same products; costs 2 bytes per frozen weight "
            "element; sharded weights are never copied)");
}

Bf16Mixed::Bf16Mixed(const Options& options, const RunContext& ctx)
    : MixedPrecision(MixedConfig{options.context(), at::kBFloat16, at::kBFloat16, std::nullopt,
                                 std::nullopt, 1.0, false, "bf16-mixed", ctx.rank,
                                 options.get_bool("frozen_weight_copies")}) {}

void Bf16True::declare_options(OptionSchema&) {}

Bf16True::Bf16True(const Options& options, const RunContext& ctx)
    : MixedPrecision(MixedConfig{options.context(), at::kBFloat16, at::kBFloat16, at::kBFloat16,
                                 std::nullopt, 1.0, false, "bf16-true", ctx.rank}) {}

void Fp16Mixed::declare_options(OptionSchema& s) {
  s.real("loss_scale", 0.0,
         "0 = dynamic loss scaling; > 0 = this constant scale (DeepSpeed fp16.loss_scale)", 0.0);
  s.integer("initial_scale_power", 16, "dynamic scaling starts at 2^initial_scale_power", 0, 126);
  s.integer("loss_scale_window", 1000,
            "clean (non-overflowing) steps before the scale doubles", 1, 1e15);
  s.integer("hysteresis", 2,
            "overflows tolerated before the scale halves (DeepSpeed's delayed shift); refilled "
            "when the scale grows, or on every clean step with consecutive_hysteresis", 1, 1e9);
  s.boolean("consecutive_hysteresis", false,
            "refill the hysteresis on every clean step, so only consecutive overflows halve");
  s.real("min_loss_scale", 1.0, "the dynamic scale never goes below this (> 0)", 0.0);
  s.boolean("raise_error_at_min_scale", true,
            "an overflow with the scale already at min_loss_scale ends the run with an error "
            "(DeepSpeed's behaviour); false keeps skipping such steps");
  s.boolean("fp16_range_check", true,
            "count a scaled gradient beyond float16's range (|g| > 65504) as an overflow, as a "
            "float16 backward would overflow; on CPU the compute is float32, so without it "
            "only inf/NaN gradients overflow");
}

MixedConfig Fp16Mixed::config_from(const Options& o) {
  MixedConfig c;
  c.name = o.context();
  // CPU autocast in LibTorch 1.13 only supports bfloat16 and CPU has no float16 matmul kernels:
  // compute on CPU stays float32. CUDA tensors (a CUDA build) autocast to float16.
  c.cpu_autocast = std::nullopt;
  c.cuda_autocast = at::kHalf;
  c.fp16_range_check = o.get_bool("fp16_range_check");
  const double fixed = o.get_double("loss_scale");
  if (fixed > 0) {
    TR_CHECK_TYPED(ConfigError, std::isfinite(fixed), o.context(),
                   ": loss_scale must be finite, got ", fixed);
    c.static_scale = fixed;
    return c;
  }
  LossScalerOptions s;
  s.context = o.context();
  s.initial_scale = std::ldexp(1.0, static_cast<int>(o.get_int("initial_scale_power")));
  s.scale_window = o.get_int("loss_scale_window");
  s.hysteresis = o.get_int("hysteresis");
  s.consecutive_hysteresis = o.get_bool("consecutive_hysteresis");
  s.min_scale = o.get_double("min_loss_scale");
  s.raise_error_at_min_scale = o.get_bool("raise_error_at_min_scale");
  TR_CHECK_TYPED(ConfigError, s.min_scale > 0, o.context(), ": min_loss_scale must be > 0, got ",
                 s.min_scale);
  TR_CHECK_TYPED(ConfigError, s.min_scale <= s.initial_scale, o.context(), ": min_loss_scale (",
                 s.min_scale, ") is larger than 2^initial_scale_power (", s.initial_scale, ")");
  c.dynamic = s;
  return c;
}

Fp16Mixed::Fp16Mixed(const Options& options, const RunContext&)
    : MixedPrecision(config_from(options)) {}

// --- auto -------------------------------------------------------------------------------------

bool cpu_has_flag(const std::string& flag) {
  // Read once per process: the callers ask for several flags in a row.
  static const std::set<std::string> flags = [] {
    std::set<std::string> out;
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("flags", 0) != 0) continue;
      std::istringstream words(line.substr(line.find(':') + 1));
      std::string w;
      while (words >> w) out.insert(w);
      break;
    }
    return out;
  }();
  return flags.count(flag) > 0;
}

bool cpu_has_native_bf16(std::string* why) {
  const bool amx = cpu_has_flag("amx_bf16"), avx512 = cpu_has_flag("avx512_bf16");
  if (why)
    *why = amx && avx512 ? "this CPU has amx_bf16 and avx512_bf16"
           : amx         ? "this CPU has amx_bf16"
           : avx512      ? "this CPU has avx512_bf16"
                         : "this CPU has no native bfloat16 instructions (avx512_bf16, "
                           "amx_bf16), so bf16 compute would be emulated and slower";
  return amx || avx512;
}

void AutoPrecision::declare_options(OptionSchema& s) {
  s.boolean("require_native_bf16", true,
            "choose bf16-mixed only where the CPU computes bfloat16 natively (avx512_bf16 or "
            "amx_bf16); false: wherever CPU autocast to bfloat16 works");
}

AutoPrecision::AutoPrecision(const Options& o, const RunContext& ctx) {
  std::string why;
  bool bf16 = cpu_has_native_bf16(&why) || !o.get_bool("require_native_bf16");
  if (bf16) {
    // The probe: a matmul under CPU autocast must come out bfloat16 and right.
    try {
      AutocastScope scope(at::kBFloat16, std::nullopt);
      c10::NoGradGuard no_grad;
      const at::Tensor y = at::matmul(at::ones({4, 4}), at::ones({4, 4}));
      bf16 = y.scalar_type() == at::kBFloat16 && y.to(at::kFloat).eq(4).all().item<bool>();
      if (!bf16) why = "CPU autocast to bfloat16 did not produce a bfloat16 matmul";
    } catch (const std::exception& e) {
      bf16 = false;
      why = std::string("CPU autocast to bfloat16 failed: ") + e.what();
    }
  }
  MixedConfig c;
  c.name = o.context() + " (auto: " + (bf16 ? "bf16-mixed" : "fp32") + ")";
  if (bf16) c.cpu_autocast = c.cuda_autocast = at::kBFloat16;
  c.frozen_weight_copies = bf16;
  chosen_ = std::make_unique<MixedPrecision>(c);
  chosen_name_ = bf16 ? "bf16-mixed" : "fp32";
  if (ctx.rank == 0)
    std::cerr << "[trainrun] precision auto: " << chosen_name_ << " (" << why << ")" << std::endl;
}

}  // namespace trainrun::plugins
