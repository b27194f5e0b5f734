#pragma once
// The training loop the core owns (docs/design.md, "One step, as data").
#include <trainrun/types.hpp>

#include "trainrun/core/config.hpp"
#include "trainrun/core/plan.hpp"
#include "trainrun/core/registry.hpp"
#include "trainrun/core/run_dir.hpp"

namespace trainrun::core {

/// Builds every component of a validated job and trains it. Returns the process exit code
/// (0 done, 130 interrupted). Throws ConfigError/PluginError (exit 2) for bad input found while
/// building, v1::Error for failures while training.
int train(const JobConfig& job, const Registry& registry);

}  // namespace trainrun::core
