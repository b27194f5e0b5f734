// Entry symbol of the "ring" plugin. Compiled into ring-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "ring_strategy.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("ring", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy, trainrun::plugins::RingStrategy>(
                    "ring", "data parallel, Horovod-style: negotiated, fused ring all-reduce of "
                            "gradients over send/recv"))
