// Entry symbol of the "zero" plugin. Its components are compiled once into an object
// library that the plugin and its unit tests share; only the plugin gets this file, since every
// plugin's entry symbol has the same name.
#include "zero.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("zero", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy, trainrun::plugins::ZeroStrategy>(
                    "zero", "ZeRO data parallelism, stages 1-3: optimizer state, gradients and "
                            "parameters sharded across ranks (DeepSpeed's zero_optimization)"))
