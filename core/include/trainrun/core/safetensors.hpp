#pragma once
// The core's checkpoints use the shared safetensors implementation of the hf library
// (trainrun/hf/safetensors.hpp); these names keep the core's call sites.
#include <trainrun/hf/safetensors.hpp>

namespace trainrun::core {

using hf::read_safetensors;
using hf::write_safetensors;

}  // namespace trainrun::core
