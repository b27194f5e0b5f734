#pragma once
// The training loop the core owns (docs/design.md, "One step, as data").
#include <trainrun/types.hpp>

#include "trainrun/core/config.hpp"
#include "trainrun/core/registry.hpp"
#include "trainrun/core/run_dir.hpp"

namespace trainrun::core {

/// Where this process stands: rank and world size from the environment the launcher (or
/// mpiexec/SLURM/torchrun) set (detect_worker_environment), rank 0 of 1 otherwise. A launcher's
/// world size wins over [launch] nproc_per_node x nnodes (rank 0 notes the difference). Throws
/// ConfigError when the job asks for several processes but this process was not started by a
/// launcher (only `trainrun` itself, which launches, may call train() then).
v1::RunContext context_from_environment(const JobConfig& job);

/// Derives accumulation steps and step counts; throws ConfigError naming the keys when the
/// global batch does not divide or the run would be empty.
v1::TrainPlan make_plan(const v1::Options& trainer, int world_size, int64_t train_samples);

/// Builds every component of a validated job and trains it. Returns the process exit code
/// (0 done, 130 interrupted). Throws ConfigError/PluginError (exit 2) for bad input found while
/// building, v1::Error for failures while training.
int train(const JobConfig& job, const Registry& registry);

}  // namespace trainrun::core
