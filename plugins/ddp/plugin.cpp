// Entry symbol of the "ddp" plugin. Its components are compiled once into an object
// library that the plugin and its unit tests share; only the plugin gets this file, since every
// plugin's entry symbol has the same name.
#include "ddp.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("ddp", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy, trainrun::plugins::DdpStrategy>(
                    "ddp", "data parallel: gradients averaged in buckets overlapped with backward"))
