// Entry symbol of the "llama" plugin. Compiled into llama-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "llama.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("llama", "0.1.0",
                trainrun::v1::component<trainrun::v1::Model, trainrun::llama::LlamaModel>(
                    "llama", "Llama-family causal LM (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM) with HF names; "
                    "loads and saves HF model directories"))
