// Entry symbol of the "gloo-cpu" plugin. Its components are compiled once into an object
// library that the plugin and its unit tests share; only the plugin gets this file, since every
// plugin's entry symbol has the same name.
#include "gloo.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("gloo-cpu", "0.1.0",
                trainrun::v1::component<trainrun::v1::Accelerator,
                                        trainrun::plugins::GlooAccelerator>(
                    "gloo-cpu",
                    "the host CPU with a Gloo (TCP) communicator across processes: all-reduce, "
                    "reduce-scatter, all-gather, broadcast, send/recv, barrier, sub-groups"))
