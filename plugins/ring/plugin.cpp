// Entry symbol of the "ring" plugin. Its components are compiled once into an object
// library that the plugin and its unit tests share; only the plugin gets this file, since every
// plugin's entry symbol has the same name.
#include "ring_strategy.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("ring", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy, trainrun::plugins::RingStrategy>(
                    "ring", "data parallel, Horovod-style: negotiated, fused ring all-reduce of "
                            "gradients over send/recv"))
