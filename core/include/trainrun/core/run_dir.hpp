#pragma once
// The run directory: where a job's outputs go, and keeping an earlier run's outputs apart. Used
// by the trainer, the launcher (before its workers start) and the command line.
#include <string>

#include "trainrun/core/config.hpp"

namespace trainrun::core {

/// [trainer] run_dir, or runs/<job file name> when it is empty.
std::string run_dir_of(const JobConfig& job);

/// When `run_dir` already holds a run (job.toml or logs/), moves that run's files and logs/ to
/// run_dir/previous-N, so two runs never mix and nothing is overwritten. Returns the directory
/// they moved to, or "" when there was nothing to move.
std::string keep_previous_run(const std::string& run_dir);

}  // namespace trainrun::core
