// Entry symbol of the "single" plugin. Its components are compiled once into an object
// library that the plugin and its unit tests share; only the plugin gets this file, since every
// plugin's entry symbol has the same name.
#include "single.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("single", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy,
                                        trainrun::plugins::SingleStrategy>(
                    "single", "one process, whole model, no communication"))
