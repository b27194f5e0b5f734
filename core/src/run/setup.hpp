// The build phase's helpers (setup.cpp): each one a [trainer] key or a check of the machine,
// applied once before the strategy sets up. Private to core/src/run/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "run.hpp"

namespace trainrun::core {

// [trainer] init_weights: every parameter and buffer of the model from a safetensors file, by
// name; a missing, extra or reshaped tensor is an error naming the file and the tensor, raised
// before anything trains.
void load_initial_weights(v1::Model& model, const std::string& path, const std::string& label);

// [trainer] freeze: requires_grad off for every parameter whose name matches one of the
// patterns (fnmatch globs). Returns "k of n parameters" ("" = none).
std::string freeze_parameters(const v1::Options& trainer, v1::Model& model);

// The model's parameter count for the banner (a quantized Linear counts as in x out weights).
int64_t count_model_parameters(v1::Model& model);

// Throws ConfigError when `dir` cannot be created or written (probed with a file of `rank`).
void check_checkpoint_dir_writable(const std::string& dir, int rank);

// [trainer] activation_checkpointing: returns "k of n units" for the banner ("" = off).
std::string install_activation_checkpointing(const v1::Options& trainer, Slot<v1::Model>& model);

// Writes <run_dir>/runtime/rank-N.json and all-gathers every rank's CPU runtime; returns the
// banner lines (used on rank 0). Collective.
std::vector<std::string> report_runtime(Slot<v1::Accelerator>& accelerator, const v1::RunContext& ctx);

}  // namespace trainrun::core
