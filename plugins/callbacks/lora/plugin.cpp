// Entry symbol of the "lora" plugin. Compiled into lora-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "lora.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("lora", "0.1.0",
                trainrun::v1::component<trainrun::v1::Callback, trainrun::lora::LoraCallback>(
                    "lora", "low-rank adapters on trainrun Linear layers (PEFT options and file "
                    "layout); freezes the base model"))
