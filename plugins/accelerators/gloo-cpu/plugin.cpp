// Entry symbol of the "gloo-cpu" plugin. Compiled into gloo-cpu-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "gloo.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("gloo-cpu", "0.1.0",
                trainrun::v1::component<trainrun::v1::Accelerator,
                                        trainrun::plugins::GlooAccelerator>(
                    "gloo-cpu",
                    "the host CPU with a Gloo (TCP) communicator across processes: all-reduce, "
                    "reduce-scatter, all-gather, broadcast, send/recv, barrier, sub-groups"))
