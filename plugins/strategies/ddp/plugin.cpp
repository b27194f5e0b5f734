// Entry symbol of the "ddp" plugin. Compiled into ddp-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "ddp.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("ddp", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy, trainrun::plugins::DdpStrategy>(
                    "ddp", "data parallel: gradients averaged in buckets overlapped with backward"))
