#pragma once
// Dynamic loss scaling with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py,
// DynamicLossScaler.update_scale, itself from NVIDIA Megatron-LM's fp16 loss scaler). A pure
// state machine: no tensors, no communication; the precision that owns it feeds it one
// "overflow or clean" per optimizer step, agreed by all ranks beforehand.
//
// Per step, with `hysteresis` = the configured delay (DeepSpeed's delayed_shift) and
// `hysteresis_left` = what is left of it (cur_hysteresis):
//   overflow: if hysteresis == 1 or hysteresis_left == 1, scale = max(scale / 2, min_scale)
//             (at min_scale already: an Error when raise_error_at_min_scale); otherwise
//             hysteresis_left -= 1 and the scale stays. Either way last_overflow = iteration.
//   clean:    with consecutive_hysteresis, hysteresis_left = hysteresis. Then, if
//             (iteration - last_overflow) % window == 0 (last_overflow is -1 at the start), the
//             scale doubles (and, without consecutive_hysteresis, hysteresis_left is refilled:
//             this is the only place it is refilled in that mode).
//   iteration += 1.
// Consequences worth knowing: without consecutive_hysteresis, once the hysteresis has been used
// up every further overflow halves the scale until the scale next grows; the scale grows on the
// window-th clean step after the start or an overflow, then every `window` clean steps (window
// 1: on every clean step, 2^16 -> 2^17 after the first step, as DeepSpeed).
#include <cstdint>
#include <map>
#include <string>

namespace trainrun::plugins {

/// Configuration of a DynamicLossScaler. The defaults are DeepSpeed's fp16 config defaults.
struct LossScalerOptions {
  double initial_scale = 65536.0;        ///< 2^initial_scale_power; > 0
  int64_t scale_window = 1000;           ///< clean steps between increases; >= 1
  int64_t hysteresis = 2;                ///< overflows tolerated before halving; >= 1
  bool consecutive_hysteresis = false;   ///< refill the hysteresis on every clean step
  double min_scale = 1.0;                ///< the scale never goes below this; > 0
  double scale_factor = 2.0;             ///< growth and backoff factor (DeepSpeed: fixed 2)
  bool raise_error_at_min_scale = true;  ///< an overflow at min_scale throws v1::Error
  std::string context = "loss scaler";   ///< prefix of error messages (the job-file table)
};

/// The scaler's whole state, as a checkpoint stores it.
struct LossScalerState {
  double scale = 65536.0;
  int64_t iteration = 0;           ///< steps seen (DeepSpeed's cur_iter)
  int64_t last_overflow = -1;      ///< iteration of the last overflow; -1 = none yet
  int64_t hysteresis_left = 2;     ///< DeepSpeed's cur_hysteresis
};

/// DeepSpeed's DynamicLossScaler.update_scale as a state machine (see the file comment).
class DynamicLossScaler {
 public:
  /// Throws v1::ConfigError naming the option when an option is out of its range.
  explicit DynamicLossScaler(const LossScalerOptions& options);

  /// The current loss scale (a power of scale_factor times initial_scale, >= min_scale).
  double scale() const { return state_.scale; }
  /// Records one optimizer step's agreed outcome and adjusts the scale for the next step.
  /// Throws v1::Error on an overflow at min_scale when raise_error_at_min_scale is set.
  void update(bool overflow);

  const LossScalerState& state() const { return state_; }
  const LossScalerOptions& options() const { return options_; }
  /// Restores a state from checkpoint_state(); throws v1::Error naming the missing or invalid
  /// key.
  void load_state(const LossScalerState& state);

  /// The state as named float64 values (keys loss_scale, iteration, last_overflow,
  /// hysteresis_left), for v1::CheckpointState.
  std::map<std::string, double> checkpoint_state() const;
  void load_checkpoint_state(const std::map<std::string, double>& values);

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace trainrun::plugins
