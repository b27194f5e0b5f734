// Entry symbol of the "zero" plugin. Compiled into zero-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "zero.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("zero", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy, trainrun::plugins::ZeroStrategy>(
                    "zero", "ZeRO data parallelism, stages 1-3: optimizer state, gradients and "
                            "parameters sharded across ranks (DeepSpeed's zero_optimization)"))
