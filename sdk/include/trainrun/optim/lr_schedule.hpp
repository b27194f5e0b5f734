#pragma once
// Learning-rate schedules shared by optimizers: linear warm-up followed by a constant, cosine or
// linear decay. Header-only and stateless (the learning rate is a pure function of the step), so
// a resumed run, or a ZeRO rank stepping only its shard, computes exactly the same value.
//
// Conventions follow Hugging Face transformers' get_{constant,cosine,linear}_schedule_with_warmup
// and PyTorch's CosineAnnealingLR, except that the warm-up never yields a zero learning rate (see
// LrSchedule::at).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "trainrun/error.hpp"
#include "trainrun/options.hpp"
#include "trainrun/types.hpp"

namespace trainrun::v1 {

/// Shape of the learning rate after warm-up.
enum class LrDecay {
  Constant,  ///< stays at the peak learning rate
  Cosine,    ///< half-cosine from the peak to min_lr (Loshchilov & Hutter, SGDR, 2017, eq. 5)
  Linear,    ///< straight line from the peak to min_lr
};

/// Job-file name of a decay ("constant", "cosine", "linear").
inline const char* lr_decay_name(LrDecay d) {
  switch (d) {
    case LrDecay::Constant: return "constant";
    case LrDecay::Cosine: return "cosine";
    case LrDecay::Linear: return "linear";
  }
  return "?";
}

/// Parses a job-file decay name; throws ConfigError naming the accepted values otherwise.
inline LrDecay parse_lr_decay(const std::string& name) {
  if (name == "constant") return LrDecay::Constant;
  if (name == "cosine") return LrDecay::Cosine;
  if (name == "linear") return LrDecay::Linear;
  throw ConfigError(detail::cat("unknown learning-rate schedule '", name,
                                "' (expected constant, cosine or linear)"));
}

/// A learning-rate schedule over 0-based optimizer steps. Learning rates are in the optimizer's
/// own units (a multiplier on the update); steps count optimizer steps, not micro-batches.
///
/// With W = warmup_steps, T = total_steps, s = step, peak = lr:
///   s <  W:  lr(s) = peak * (s + 1) / W
///            (linear ramp up from 0; the first step already moves, the last warm-up step uses
///            the full peak. HF's variant, peak * s / W, spends step 0 at lr 0.)
///   s >= W:  p = clamp((s - W) / max(1, T - W), 0, 1)      (decay progress)
///            constant: lr(s) = peak
///            cosine:   lr(s) = min_lr + (peak - min_lr) * (1 + cos(pi * p)) / 2
///            linear:   lr(s) = min_lr + (peak - min_lr) * (1 - p)
/// So the decay starts at the peak on step W and reaches min_lr at step T (and stays there), as
/// PyTorch's CosineAnnealingLR with T_max = T - W and eta_min = min_lr does.
struct LrSchedule {
  double lr = 1e-3;           ///< peak learning rate, reached at the end of warm-up
  double min_lr = 0;          ///< final learning rate of a cosine/linear decay (ignored if constant)
  int64_t warmup_steps = 0;   ///< W, number of warm-up steps (0 = none)
  int64_t total_steps = 0;    ///< T, optimizer steps in the run (TrainPlan::total_steps)
  LrDecay decay = LrDecay::Constant;

  /// The learning rate used by 0-based optimizer step `step` (see the formula above).
  double at(int64_t step) const {
    if (step < 0) step = 0;
    if (warmup_steps > 0 && step < warmup_steps)
      return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    if (decay == LrDecay::Constant) return lr;
    const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
    const double p = std::clamp(static_cast<double>(step - warmup_steps) / span, 0.0, 1.0);
    if (decay == LrDecay::Cosine) {
      constexpr double kPi = 3.14159265358979323846;
      return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(kPi * p));
    }
    return min_lr + (lr - min_lr) * (1.0 - p);
  }

  /// Checks the values and throws ConfigError (prefixed with `context`, e.g. "[optimizer]")
  /// when they cannot describe a schedule: negative rates or steps, min_lr > lr, or a decay
  /// without a known run length.
  void validate(const std::string& context) const {
    TR_CHECK_TYPED(ConfigError, lr >= 0 && std::isfinite(lr), context,
                   ": lr must be a finite number >= 0, got ", lr);
    TR_CHECK_TYPED(ConfigError, min_lr >= 0 && std::isfinite(min_lr), context,
                   ": min_lr must be a finite number >= 0, got ", min_lr);
    TR_CHECK_TYPED(ConfigError, warmup_steps >= 0, context,
                   ": warmup_steps must be >= 0, got ", warmup_steps);
    if (decay != LrDecay::Constant) {
      TR_CHECK_TYPED(ConfigError, min_lr <= lr, context, ": min_lr (", min_lr,
                     ") must not exceed lr (", lr, ") for a ", lr_decay_name(decay), " schedule");
      TR_CHECK_TYPED(ConfigError, total_steps > 0, context, ": a ", lr_decay_name(decay),
                     " schedule needs the run length, but the plan has total_steps = ",
                     total_steps);
    }
  }
};

/// Declares the schedule options every optimizer shares: `schedule` (constant|cosine|linear,
/// default constant), `warmup_steps` (optimizer steps, default 0) and `min_lr` (default 0).
/// The peak `lr` is declared by the optimizer itself, since its default differs per rule.
inline void declare_lr_schedule_options(OptionSchema& schema) {
  schema.choice("schedule", "constant", {"constant", "cosine", "linear"},
                "learning-rate decay after warm-up: constant, cosine or linear toward min_lr, "
                "which is reached at step max_steps, just after the last step (as PyTorch's "
                "CosineAnnealingLR and Hugging Face's get_linear_schedule_with_warmup): the "
                "last linear step uses min_lr + (lr - min_lr) / (max_steps - warmup_steps)");
  schema.integer("warmup_steps", 0,
                 "optimizer steps of linear warm-up from 0 to lr (0 = no warm-up)", 0.0);
  schema.real("min_lr", 0.0, "learning rate at the end of a cosine or linear decay", 0.0);
}

/// Builds the schedule from options declared by declare_lr_schedule_options, the peak `lr` and
/// the run length in `plan`, and validates it (ConfigError naming options.context()).
inline LrSchedule lr_schedule_from_options(const Options& options, double lr,
                                           const TrainPlan& plan) {
  LrSchedule s;
  s.lr = lr;
  s.min_lr = options.get_double("min_lr");
  s.warmup_steps = options.get_int("warmup_steps");
  s.total_steps = plan.total_steps;
  s.decay = parse_lr_decay(options.get_string("schedule"));
  s.validate(options.context());
  return s;
}

}  // namespace trainrun::v1
