// Entry symbol of the "profiler" plugin. Compiled into profiler-objects with the component (one
// unit with it): the entry is weak there, so the tests that link several plugins' objects link;
// see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "profiler.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN(
    "profiler", "0.1.0",
    trainrun::v1::component<trainrun::v1::Callback, trainrun::plugins::ProfilerCallback>(
        "profiler",
        "the operators of chosen steps, by self time, input shapes and matrix-product "
        "FLOPs: <run_dir>/profile-rank-N.json"))
