#pragma once
// Per-rank model-state memory of data-parallel training under ZeRO stages 0-3, after
// Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
// SC20 (sec. 3.1: model states of mixed-precision Adam; sec. 5, Figure 1: the three stages).
// With Psi parameters, N data-parallel ranks and K bytes of optimizer state per parameter
// (master weights included; K = 12 for mixed-precision Adam, 8 for fp32 Adam):
//   stage 0 (DP):          (2 + 2 + K) Psi
//   stage 1 (P_os):         2 Psi + 2 Psi + K Psi / N
//   stage 2 (P_os+g):       2 Psi + (2 + K) Psi / N
//   stage 3 (P_os+g+p):    (2 + 2 + K) Psi / N
// where 2 and 2 are the bytes per parameter of fp16 weights and gradients (4 and 4 under fp32).
// The paper's bytes are decimal (GB = 1e9): 7.5e9 parameters, N = 64, K = 12 give 120 GB,
// 31.4 GB, 16.6 GB and 1.9 GB. Pure functions, no LibTorch calls.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/interfaces.hpp"

namespace trainrun::v1::memory {

/// What the estimate is computed from. Bytes are per parameter unless named otherwise; the
/// per-parameter fields are those of v1::MemoryInputs (see zero_inputs()).
struct ZeroEstimateInputs {
  int64_t num_params = 0;     ///< Psi: parameters the optimizer trains
  int world_size = 1;         ///< N: data-parallel degree (ranks sharing one model)
  double param_bytes = 4;     ///< weights the model computes with (paper: 2, fp16)
  double grad_bytes = 4;      ///< gradients (paper: 2)
  double master_bytes = 0;    ///< fp32 master weights beside low-precision ones (paper: 4)
  double optimizer_bytes = 8; ///< optimizer state without master weights (Adam: 8)
  /// Stage 2/3: elements of one gradient reduce-scatter bucket (0 = not counted; at most Psi
  /// are counted), and the bytes of each of its elements (0 = grad_bytes).
  int64_t reduce_bucket_elems = 0;
  double bucket_elem_bytes = 0;
  /// Stage 3: parameters of the largest unit (the whole model when it has no units; 0 = not
  /// counted) and prefetch_bucket_size (elements; 0 = no prefetch). Counted as gathered: the
  /// unit running plus, when prefetching, max(largest unit, prefetch_elems) ahead (so two units
  /// when the window is at most one unit), in all at most the non-persistent parameters.
  int64_t largest_unit_params = 0;
  int64_t prefetch_elems = 0;
  /// Stage 3: parameters below param_persistence_threshold, kept whole on every rank (only the
  /// weights; their gradients and optimizer state are sharded like the rest).
  int64_t persistent_params = 0;
  /// Parameters that do not train (a LoRA or QLoRA base, [trainer] freeze): their weights are
  /// held like the trained ones (at param_bytes, sharded at stage 3), without gradients or
  /// optimizer state. Psi (num_params) counts only the trained ones.
  int64_t frozen_params = 0;
  /// Bytes of those frozen weights in all, when they are not held at param_bytes each (a
  /// quantized base's packed codes and scales, v1::WeightStoragePlan); < 0: frozen_params x
  /// param_bytes. Sharded with the rest at stage 3.
  double frozen_bytes = -1;
  /// Bytes of frozen weights held whole on every rank at every stage, besides frozen_params:
  /// those outside every unit or shared by several (a tied embedding), which the sharded
  /// engine keeps whole (trainrun/strategy/sharded_engine.hpp).
  double whole_frozen_bytes = 0;
};

/// Per-rank bytes of one stage (SC20 sec. 3.1 and 5). buffers_bytes: communication buckets and
/// stage-3 gathered parameters (not model state). Activations are not included.
struct ZeroStageEstimate {
  int stage = 0;
  double params_bytes = 0;
  double grads_bytes = 0;
  double optimizer_bytes = 0;    ///< optimizer state + master weights (the paper's K Psi)
  double buffers_bytes = 0;
  double model_state_bytes = 0;  ///< params + grads + optimizer
  double total_bytes = 0;        ///< model state + buffers
};

/// Bytes per rank of `stage` (0..3) for `in`, by the formulas of SC20 sec. 5 (this header's
/// first comment) plus buffers; sharded quantities are divided exactly by N (a
/// real flat buffer pads each unit to a multiple of N, at most N - 1 elements more per unit).
/// Throws Error on negative sizes, world_size < 1 or a stage outside 0..3.
inline ZeroStageEstimate estimate_zero_stage(const ZeroEstimateInputs& in, int stage) {
  TR_CHECK(stage >= 0 && stage <= 3, "ZeRO estimate: stage ", stage, " is not 0, 1, 2 or 3");
  TR_CHECK(in.world_size >= 1, "ZeRO estimate: world_size ", in.world_size, " < 1");
  TR_CHECK(in.num_params >= 0 && in.reduce_bucket_elems >= 0 && in.largest_unit_params >= 0 &&
               in.prefetch_elems >= 0 && in.persistent_params >= 0 && in.frozen_params >= 0,
           "ZeRO estimate: parameter and element counts must be >= 0");
  TR_CHECK(in.param_bytes >= 0 && in.grad_bytes >= 0 && in.master_bytes >= 0 &&
               in.optimizer_bytes >= 0 && in.bucket_elem_bytes >= 0,
           "ZeRO estimate: bytes per parameter must be >= 0");
  TR_CHECK(in.whole_frozen_bytes >= 0, "ZeRO estimate: whole_frozen_bytes must be >= 0");
  const double psi = static_cast<double>(in.num_params);
  const double n = static_cast<double>(in.world_size);
  const double k = in.master_bytes + in.optimizer_bytes;
  ZeroStageEstimate e;
  e.stage = stage;
  const double weights = psi + static_cast<double>(in.frozen_params);
  const double frozen_bytes = in.frozen_bytes >= 0
                                  ? in.frozen_bytes
                                  : in.param_bytes * static_cast<double>(in.frozen_params);
  const double whole_frozen = in.whole_frozen_bytes;
  // Bytes per weight on average: what a gathered or persistent weight costs.
  const double weight_bytes =
      weights > 0 ? (in.param_bytes * psi + frozen_bytes) / weights : in.param_bytes;
  e.params_bytes = in.param_bytes * psi + frozen_bytes + whole_frozen;
  e.grads_bytes = in.grad_bytes * psi;
  e.optimizer_bytes = k * psi;
  if (stage >= 1) e.optimizer_bytes /= n;
  if (stage >= 2) {
    e.grads_bytes /= n;
    const double elem = in.bucket_elem_bytes > 0 ? in.bucket_elem_bytes : in.grad_bytes;
    e.buffers_bytes += elem * std::min(psi, static_cast<double>(in.reduce_bucket_elems));
  }
  if (stage == 3) {
    const double persistent = std::min(weights, static_cast<double>(in.persistent_params));
    e.params_bytes = weight_bytes * ((weights - persistent) / n + persistent) + whole_frozen;
    const double unit = std::min(weights, static_cast<double>(in.largest_unit_params));
    const double ahead =
        in.prefetch_elems > 0 ? std::max(unit, static_cast<double>(in.prefetch_elems)) : 0.0;
    const double gathered = std::min(weights - persistent, unit + ahead);
    e.buffers_bytes += weight_bytes * gathered;
  }
  e.model_state_bytes = e.params_bytes + e.grads_bytes + e.optimizer_bytes;
  e.total_bytes = e.model_state_bytes + e.buffers_bytes;
  return e;
}

/// estimate_zero_stage for stages 0, 1, 2 and 3, in that order (bytes per rank, SC20 sec. 5).
inline std::array<ZeroStageEstimate, 4> estimate_zero(const ZeroEstimateInputs& in) {
  return {estimate_zero_stage(in, 0), estimate_zero_stage(in, 1), estimate_zero_stage(in, 2),
          estimate_zero_stage(in, 3)};
}

/// ZeroEstimateInputs (bytes per parameter, SC20 sec. 3.1) from what the core hands a
/// MemoryInputsAware strategy; buffer fields stay 0 for the caller to fill. An unknown
/// optimizer (optimizer_bytes < 0) is assumed to be Adam (8), the common and larger case.
inline ZeroEstimateInputs zero_inputs(const MemoryInputs& mi, int64_t num_params,
                                      int world_size) {
  ZeroEstimateInputs in;
  in.num_params = num_params;
  in.world_size = world_size;
  in.param_bytes = mi.param_bytes;
  in.grad_bytes = mi.grad_bytes;
  in.master_bytes = mi.master_bytes;
  in.optimizer_bytes = mi.optimizer_bytes >= 0 ? mi.optimizer_bytes : 8;
  return in;
}

/// The per-rank budget that a strategy's "auto" choice must fit, in bytes: its memory_budget_gb
/// option when set (GB, 1e9 bytes), else what the core measured (MemoryInputs'
/// memory_budget_bytes, not positive when unknown).
inline double budget_bytes(double budget_gb, const MemoryInputs& mi) {
  return budget_gb > 0 ? budget_gb * 1e9 : static_cast<double>(mi.memory_budget_bytes);
}

/// The smallest world size above in.world_size, up to 2^20, at which `stage`'s total estimate
/// fits `budget` bytes per rank; 0 when none does. For stage 3 this is what an "auto" choice
/// that fits nothing suggests: its model state scales as 1/N, its buffers do not, so a large
/// enough world fits unless the buffers alone exceed the budget.
inline int64_t smallest_fitting_world_size(const ZeroEstimateInputs& in, int stage, double budget) {
  for (int64_t n = int64_t{in.world_size} + 1; n <= (int64_t{1} << 20); ++n) {
    ZeroEstimateInputs at_n = in;
    at_n.world_size = static_cast<int>(n);
    if (estimate_zero_stage(at_n, stage).total_bytes <= budget) return n;
  }
  return 0;
}

/// Bytes in binary units with three significant digits: "812 B", "3.10 MiB", "1.75 GiB".
inline std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024 && u < 5) v /= 1024, ++u;
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f B", v);
  else std::snprintf(buf, sizeof buf, std::fabs(v) >= 100 ? "%.0f %s" : std::fabs(v) >= 10 ? "%.1f %s" : "%.2f %s", v, units[u]);
  return buf;
}

/// The table `trainrun check` prints: a header line, then one line per stage (params, grads,
/// optimizer, buffers, model state, total per rank). With activation_bytes >= 0 (one
/// micro-batch's, v1::ActivationMemory) a "peak" column adds them to the total, and the fit is
/// judged on it; with budget_bytes > 0 (per rank) each line also says whether it fits.
inline std::vector<std::string> format_zero_table(const std::array<ZeroStageEstimate, 4>& stages,
                                                  int64_t budget_bytes = -1,
                                                  double activation_bytes = -1) {
  auto cell = [](const std::string& s, size_t w) {
    return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' ');
  };
  const char* names[] = {"0 (ddp)", "1 (os)", "2 (os+g)", "3 (os+g+p)"};
  std::vector<std::string> lines;
  lines.push_back(cell("stage", 12) + cell("params", 11) + cell("grads", 11) +
                  cell("optimizer", 11) + cell("buffers", 11) + cell("model state", 13) +
                  (activation_bytes >= 0
                       ? cell("total", 11) + (budget_bytes > 0 ? cell("peak", 11) + "fits" : "peak")
                   : budget_bytes > 0 ? cell("total", 11) + "fits"
                                      : "total"));
  for (const auto& e : stages) {
    std::string line = cell(names[e.stage], 12) + cell(format_bytes(e.params_bytes), 11) +
                       cell(format_bytes(e.grads_bytes), 11) +
                       cell(format_bytes(e.optimizer_bytes), 11) +
                       cell(format_bytes(e.buffers_bytes), 11) +
                       cell(format_bytes(e.model_state_bytes), 13);
    const double peak = e.total_bytes + std::max(0.0, activation_bytes);
    if (activation_bytes >= 0) {
      line += cell(format_bytes(e.total_bytes), 11);
      if (budget_bytes > 0)
        line += cell(format_bytes(peak), 11) +
                (peak <= static_cast<double>(budget_bytes) ? "yes" : "no");
      else
        line += format_bytes(peak);
    } else if (budget_bytes > 0) {
      line += cell(format_bytes(e.total_bytes), 11) +
              (e.total_bytes <= static_cast<double>(budget_bytes) ? "yes" : "no");
    } else {
      line += format_bytes(e.total_bytes);
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace trainrun::v1::memory
