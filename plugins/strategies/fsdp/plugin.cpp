// Entry symbol of the "fsdp" plugin. Compiled into fsdp-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "fsdp.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("fsdp", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy, trainrun::plugins::FsdpStrategy>(
                    "fsdp", "fully sharded data parallel (PyTorch FSDP): FULL_SHARD, "
                            "SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or auto"))
