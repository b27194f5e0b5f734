// Entry symbol of the "fsdp" plugin. Its components are compiled once into an object
// library that the plugin and its unit tests share; only the plugin gets this file, since every
// plugin's entry symbol has the same name.
#include "fsdp.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("fsdp", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy, trainrun::plugins::FsdpStrategy>(
                    "fsdp", "fully sharded data parallel (PyTorch FSDP): FULL_SHARD, "
                            "SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or auto"))
