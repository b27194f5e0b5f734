#pragma once
// The one check that the job's [objective] trains on the task its [data] gives: the run calls it
// at setup (objective.cpp) and `trainrun check` (memory_check.cpp), so both refuse the same jobs
// with the same words (exit 2).
#include <string>

#include <trainrun/rollout.hpp>

#include "trainrun/core/config.hpp"

namespace trainrun::core {

/// Throws v1::ConfigError naming job.file, the [objective] and [data] plugins and what to change
/// when `data_task` (DataInfo::task) needs an objective the job lacks (`objective_task` empty: no
/// [objective]), or when the objective's task (Objective::task()) is not `data_task`.
void check_objective_task(const JobConfig& job, const std::string& objective_task,
                          const std::string& data_task);

/// An online objective's job (rollout.hpp), checked by the run (rollout_phase.cpp) and by
/// `trainrun check`: at least one [[rewards]], and [trainer] global_batch_size a multiple of
/// num_generations x world_size (each prompt's completions on one rank). Throws v1::ConfigError
/// naming job.file and the keys.
void check_online_job(const JobConfig& job, const v1::RolloutSpec& spec, int world_size);

}  // namespace trainrun::core
