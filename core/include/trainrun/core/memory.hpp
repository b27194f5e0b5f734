#pragma once
// The per-process CPU memory tracker (a counting wrapper around LibTorch's CPU allocator) and
// the memory figures the core hands to strategies and prints in `trainrun check`.
// Plugins read the tracker through the SDK's trainrun/runtime/memory.hpp, which finds the extern
// "C" functions this file's implementation exports (see there for why).
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <trainrun/interfaces.hpp>
#include <trainrun/strategy/memory_estimate.hpp>

#include "trainrun/core/config.hpp"
#include "trainrun/core/registry.hpp"

namespace trainrun::core {

/// Installs the counting allocator as LibTorch's CPU allocator (once per process; later calls
/// do nothing). Call it first thing in main(): storage allocated before it is not counted.
void install_memory_tracker();

/// Tells glibc's malloc to keep freed memory for reuse instead of handing it back to the kernel:
/// blocks up to 32 MiB come from the heap (M_MMAP_THRESHOLD) and the heap's top is trimmed
/// only beyond 2 GiB free (M_TRIM_THRESHOLD, M_TOP_PAD 1 GiB). A training step frees and
/// allocates the same large tensors again and again; with glibc's defaults each comes back as
/// fresh pages the kernel zeroes on first touch (about 140,000 page faults and 0.2 s of kernel
/// time per step of SmolLM2-135M LoRA bf16-mixed at seq 512 on one Zen 4 core, 7 % of the step;
/// none with these settings, peak RSS +7 %). The same as setting glibc's MALLOC_*_ variables;
/// left alone when any of them, GLIBC_TUNABLES or TRAINRUN_MALLOC=system is set (or another
/// malloc is preloaded, whose mallopt ignores these). Returns false when left alone.
bool keep_freed_memory();

/// What the tracker counts now (bytes), the peak since the last reset, and the reset; -1 before
/// install_memory_tracker().
int64_t tracked_current_bytes();
int64_t tracked_peak_bytes();
void reset_tracked_peak();

/// MemoryInputs from what the components say of themselves: bytes per parameter from a
/// v1::PrecisionBytes precision (4/4/0 otherwise) and a v1::OptimizerStateBytes optimizer
/// (-1 otherwise); the budget is accelerator_total_bytes / local_world_size (-1 when unknown).
v1::MemoryInputs memory_inputs(const v1::Precision* precision, const v1::Optimizer* optimizer,
                               int64_t accelerator_total_bytes, int local_world_size,
                               int world_size);

/// The ZeRO memory estimate of a job at its world size, as figures and as the text of
/// `trainrun check` (lines without the leading "#   "). Builds the dataset, the model, the
/// precision and the optimizer; nothing else, and no run_dir. Errors of those components
/// propagate (PluginError, ConfigError).
struct MemoryCheck {
  std::array<v1::memory::ZeroStageEstimate, 4> stages;  ///< stages 0-3, bytes per rank
  int64_t trainable_params = 0;                          ///< Psi, a tied tensor once
  int world_size = 1;
  std::vector<std::string> lines;
  double activation_bytes = -1;  ///< one micro-batch's (v1::ActivationMemory); < 0: unknown
  std::string model;  ///< the model as built (Model::describe(): a loaded directory's real config)
};
MemoryCheck check_memory(const JobConfig& job, const Registry& registry);

/// The ZeRO stage whose model state the job's strategy holds (single, ddp, ring: 0; zero: its
/// stage; fsdp: 3, 2, 0 for FULL_SHARD, SHARD_GRAD_OP, NO_SHARD), or -1 when the run decides
/// ("auto", HYBRID_SHARD, a strategy trainrun does not ship).
int zero_stage_of(const JobConfig& job);

/// `trainrun check`: check_memory(job, registry).lines.
std::vector<std::string> check_memory_lines(const JobConfig& job, const Registry& registry);

}  // namespace trainrun::core
