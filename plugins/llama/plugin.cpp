// Entry symbol of the "llama" plugin. The model is compiled once into llama-objects, which the
// plugin, llama_logits, packing_check and the llama_config fuzz target share; only the plugin
// gets this file, since every plugin's entry symbol has the same name.
#include "llama.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("llama", "0.1.0",
                trainrun::v1::component<trainrun::v1::Model, trainrun::llama::LlamaModel>(
                    "llama", "Llama-family causal LM (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM) with HF names; "
                    "loads and saves HF model directories"))
