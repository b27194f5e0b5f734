#pragma once
// Where this rank stands and what the run will do: both derive from the job and the environment
// alone, before any step, so `trainrun check`, the run and the tests share one derivation.
#include <cstdint>

#include <trainrun/types.hpp>

#include "trainrun/core/config.hpp"
#include "trainrun/core/sampler.hpp"

namespace trainrun::core {

/// Where this process stands: rank and world size from the environment the launcher (or
/// mpiexec/SLURM/torchrun) set (detect_worker_environment), rank 0 of 1 otherwise. A launcher's
/// world size wins over [launch] nproc_per_node x nnodes (rank 0 notes the difference). Throws
/// ConfigError when the job asks for several processes but this process was not started by a
/// launcher (only `trainrun` itself, which launches, may call train() then).
v1::RunContext context_from_environment(const JobConfig& job);

/// The step layout and the data order that goes with it. The sampler is built here, once: its
/// epoch length is the plan's steps_per_epoch.
struct BatchPlan {
  v1::TrainPlan steps;
  DistributedSampler sampler;
};

/// Derives accumulation steps and step counts and builds rank `rank`'s sampler (seeded by
/// [trainer] seed); throws ConfigError naming the keys when the global batch does not divide
/// (batch_layout_error, the one rule) or the run would be empty.
/// An online objective (rollout.hpp) samples prompts and trains on completions: each of the
/// train_samples prompts makes completions_per_sample completions, and the batch sizes of
/// [trainer] count completions (the sampler draws global_batch_size / completions_per_sample
/// prompts per prompt batch); each prompt batch serves steps_per_batch optimizer steps (TRL's
/// num_iterations), so an epoch has that many times the sampler's steps.
BatchPlan make_plan(const v1::Options& trainer, int world_size, int rank, int64_t train_samples,
                    int64_t completions_per_sample = 1, int64_t steps_per_batch = 1);

}  // namespace trainrun::core
