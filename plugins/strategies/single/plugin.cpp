// Entry symbol of the "single" plugin. Compiled into single-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "single.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("single", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy,
                                        trainrun::plugins::SingleStrategy>(
                    "single", "one process, whole model, no communication"))
