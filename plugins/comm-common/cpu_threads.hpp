#pragma once
// The CPU runtime options shared by the CPU accelerators (cpu, gloo-cpu, mpi): thread budgets
// per pool and core pinning, planned and applied by the SDK's trainrun/cpu_runtime.hpp.
// Header-only so the single-process cpu plugin needs none of comm-common's store machinery.
#include <trainrun/cpu_runtime.hpp>
#include <trainrun/error.hpp>
#include <trainrun/interfaces.hpp>
#include <trainrun/options.hpp>

#include <string>

namespace trainrun::comm {

/// Declares `threads`, `blas_threads` (integer or "auto") and `pin` in an accelerator's schema.
inline void declare_threads_option(v1::OptionSchema& schema) {
  schema.integer_or_auto("threads", v1::kAuto,
                         "LibTorch intra-op and inter-op threads per rank: auto = the node's "
                         "usable cores (affinity mask, cgroup quota) / local ranks; 0 = "
                         "LibTorch's default",
                         0.0, 4096.0);
  schema.integer_or_auto("blas_threads", v1::kAuto,
                         "BLAS (OpenBLAS) threads per rank: auto = 1, since a second pool beside "
                         "LibTorch's competes for the same cores; 0 = the library's default",
                         0.0, 4096.0);
  schema.boolean("pin", true,
                 "pin each local rank's threads to its own disjoint share of the CPUs (skipped "
                 "when there are more local ranks than CPUs)");
}

/// Plans and applies the options for this rank; returns the plan for describe(). Throws
/// ConfigError naming the accelerator for a bad value, Error when pinning is refused.
inline v1::cpu::ThreadPlan apply_threads_option(const v1::Options& options,
                                                const v1::RunContext& ctx, const char* backend) {
  v1::cpu::ThreadPlan plan;
  try {
    plan = v1::cpu::plan_threads(options.get_int("threads"), options.get_int("blas_threads"),
                                 options.get_bool("pin"), ctx.local_rank, ctx.local_world_size,
                                 v1::cpu::available_cores());
  } catch (const v1::ConfigError& e) {
    throw v1::ConfigError(options.context() + ": " + e.what());
  }
  v1::cpu::apply(plan, backend);
  return plan;
}

}  // namespace trainrun::comm
