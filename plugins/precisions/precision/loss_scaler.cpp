#include "loss_scaler.hpp"

#include <trainrun/error.hpp>

#include <algorithm>
#include <cmath>

namespace trainrun::plugins {

using namespace trainrun::v1;

using v1::ConfigError;

DynamicLossScaler::DynamicLossScaler(const LossScalerOptions& o) : options_(o) {
  TR_CHECK_TYPED(ConfigError, std::isfinite(o.initial_scale) && o.initial_scale > 0, o.context,
                 ": the initial loss scale must be finite and > 0, got ", o.initial_scale);
  TR_CHECK_TYPED(ConfigError, o.scale_window >= 1, o.context,
                 ": loss_scale_window must be >= 1, got ", o.scale_window);
  TR_CHECK_TYPED(ConfigError, o.hysteresis >= 1, o.context, ": hysteresis must be >= 1, got ",
                 o.hysteresis);
  TR_CHECK_TYPED(ConfigError, std::isfinite(o.min_scale) && o.min_scale > 0, o.context,
                 ": min_loss_scale must be finite and > 0, got ", o.min_scale);
  TR_CHECK_TYPED(ConfigError, o.min_scale <= o.initial_scale, o.context, ": min_loss_scale (",
                 o.min_scale, ") is larger than the initial loss scale 2^initial_scale_power (",
                 o.initial_scale, ")");
  TR_CHECK_TYPED(ConfigError, o.scale_factor > 1, o.context, ": scale factor must be > 1");
  state_.scale = o.initial_scale;
  state_.hysteresis_left = o.hysteresis;
}

void DynamicLossScaler::update(bool overflow) {
  LossScalerState& s = state_;
  const LossScalerOptions& o = options_;
  if (overflow) {
    if (o.hysteresis == 1 || s.hysteresis_left == 1) {
      TR_CHECK(!(s.scale <= o.min_scale && o.raise_error_at_min_scale), o.context,
               ": gradients overflowed again with the loss scale already at min_loss_scale = ",
               o.min_scale, " (step ", s.iteration + 1,
               "); the run is diverging. Set raise_error_at_min_scale = false to keep skipping "
               "such steps instead");
      s.scale = std::max(s.scale / o.scale_factor, o.min_scale);
    } else {
      s.hysteresis_left -= 1;
    }
    s.last_overflow = s.iteration;
  } else {
    if (o.consecutive_hysteresis) s.hysteresis_left = o.hysteresis;
    // DeepSpeed's test, (cur_iter - last_overflow_iter) % scale_window == 0: with last_overflow
    // -1 at the start, the scale grows on the window-th clean step (window 1: on every one).
    if ((s.iteration - s.last_overflow) % o.scale_window == 0) {
      if (!o.consecutive_hysteresis) s.hysteresis_left = o.hysteresis;
      s.scale *= o.scale_factor;
    }
  }
  s.iteration += 1;
}

void DynamicLossScaler::load_state(const LossScalerState& st) {
  TR_CHECK(std::isfinite(st.scale) && st.scale > 0, options_.context,
           ": checkpointed loss_scale must be finite and > 0, got ", st.scale);
  TR_CHECK(st.iteration >= 0 && st.last_overflow >= -1 && st.last_overflow < st.iteration,
           options_.context, ": checkpointed iteration ", st.iteration, " / last_overflow ",
           st.last_overflow, " are inconsistent");
  TR_CHECK(st.hysteresis_left >= 1 && st.hysteresis_left <= options_.hysteresis,
           options_.context, ": checkpointed hysteresis_left ", st.hysteresis_left,
           " is outside [1, hysteresis = ", options_.hysteresis, "]");
  state_ = st;
}

std::map<std::string, double> DynamicLossScaler::checkpoint_state() const {
  return {{"loss_scale", state_.scale},
          {"iteration", static_cast<double>(state_.iteration)},
          {"last_overflow", static_cast<double>(state_.last_overflow)},
          {"hysteresis_left", static_cast<double>(state_.hysteresis_left)}};
}

void DynamicLossScaler::load_checkpoint_state(const std::map<std::string, double>& values) {
  auto get = [&](const char* key) {
    auto it = values.find(key);
    TR_CHECK(it != values.end(), options_.context, ": checkpoint state has no '", key, "'");
    return it->second;
  };
  LossScalerState st;
  st.scale = get("loss_scale");
  st.iteration = static_cast<int64_t>(get("iteration"));
  st.last_overflow = static_cast<int64_t>(get("last_overflow"));
  st.hysteresis_left = static_cast<int64_t>(get("hysteresis_left"));
  load_state(st);
}

}  // namespace trainrun::plugins
