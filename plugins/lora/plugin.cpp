// Entry symbol of the "lora" plugin. Its components are compiled once into an object
// library that the plugin and its unit tests share; only the plugin gets this file, since every
// plugin's entry symbol has the same name.
#include "lora.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("lora", "0.1.0",
                trainrun::v1::component<trainrun::v1::Callback, trainrun::lora::LoraCallback>(
                    "lora", "low-rank adapters on trainrun Linear layers (PEFT options and file "
                    "layout); freezes the base model"))
