// Entry symbol of the "cpu" plugin. Its components are compiled once into an object
// library that the plugin and its unit tests share; only the plugin gets this file, since every
// plugin's entry symbol has the same name.
#include "cpu.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("cpu", "0.1.0",
                trainrun::v1::component<trainrun::v1::Accelerator,
                                        trainrun::plugins::CpuAccelerator>(
                    "cpu", "the host CPU with a single-process (local) communicator"))
