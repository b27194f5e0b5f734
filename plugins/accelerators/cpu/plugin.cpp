// Entry symbol of the "cpu" plugin. Compiled into cpu-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "cpu.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("cpu", "0.1.0",
                trainrun::v1::component<trainrun::v1::Accelerator,
                                        trainrun::plugins::CpuAccelerator>(
                    "cpu", "the host CPU with a single-process (local) communicator"))
