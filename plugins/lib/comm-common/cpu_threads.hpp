#pragma once
// The CPU runtime options shared by the CPU accelerators (cpu, gloo-cpu, mpi): thread budgets
// per pool and core pinning, planned and applied by the SDK's trainrun/runtime/cpu_runtime.hpp.
// Header-only so the single-process cpu plugin needs none of comm-common's store machinery.
#include <trainrun/error.hpp>
#include <trainrun/interfaces.hpp>
#include <trainrun/options.hpp>
#include <trainrun/runtime/cpu_runtime.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace trainrun::comm {

/// Declares `threads`, `blas_threads` (integer or "auto") and `pin` in an accelerator's schema.
inline void declare_threads_option(v1::OptionSchema& schema) {
  schema.integer_or_auto("threads", v1::kAuto,
                         "LibTorch intra-op and inter-op threads per rank: auto = the node's "
                         "usable cores (affinity mask, cgroup quota) / local ranks, or "
                         "OMP_NUM_THREADS when set; 0 = LibTorch's default",
                         0.0, 4096.0);
  schema.integer_or_auto("blas_threads", v1::kAuto,
                         "BLAS (OpenBLAS) threads per rank: auto = 1 (a second pool beside "
                         "LibTorch's competes for the same cores), or OPENBLAS_NUM_THREADS when "
                         "set; 0 = OpenBLAS's default",
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
  v1::cpu::CoreBudget budget = v1::cpu::available_cores();
  // Under mpiexec/SLURM (not trainrun's own agent, which never binds), a mask narrower than
  // the node's CPUs means the launcher bound this rank already: its mask is its share.
  budget.per_rank = ctx.local_world_size > 1 && !std::getenv("TRAINRUN_AGENT_STORE") &&
                    static_cast<long>(budget.cpus.size()) < sysconf(_SC_NPROCESSORS_ONLN);
  try {
    plan = v1::cpu::plan_threads(options.get_int("threads"), options.get_int("blas_threads"),
                                 options.get_bool("pin"), ctx.local_rank, ctx.local_world_size,
                                 budget);
  } catch (const v1::ConfigError& e) {
    throw v1::ConfigError(options.context() + ": " + e.what());
  }
  v1::cpu::apply(plan, backend);
  // Alone on the node, several LibTorch threads are right unless other processes hold cores:
  // OpenMP pools wait for every thread at each parallel region, and a thread whose core is
  // taken stalls them all (measured: an MLP at 2 threads fell from 38k to 6.5k samples/s
  // beside one busy process). With several local ranks the siblings' own start-up would be
  // counted as load, so only a lone rank samples (0.1 s).
  if (ctx.local_world_size == 1 && plan.intra_op > 1) {
    if (const double busy = v1::cpu::busy_cores_now(); busy >= 0.5)
      std::fprintf(stderr,
                   "trainrun %s: warning: this node is already busy (%.1f cores in use) and this "
                   "rank runs %d LibTorch threads; OpenMP threads stall each other when another "
                   "process takes one of their cores: on a shared node set [accelerator] "
                   "threads = 1 (--set accelerator.threads=1)\n",
                   backend, busy, plan.intra_op);
  }
  return plan;
}

}  // namespace trainrun::comm
