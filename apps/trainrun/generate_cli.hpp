#pragma once
// `trainrun generate`: text from a Hugging Face model directory through a model plugin that
// offers v1::IncrementalDecoder (KV cache), with the directory's tokenizer and chat template.

#include <string>

namespace trainrun::v1 {
class Model;
}

namespace trainrun::app {
/// Merges the PEFT LoRA adapter directory `dir` (adapter_config.json, adapter_model.safetensors)
/// into `model`'s parameters (W + scaling x B A; other tensors, e.g. modules_to_save or trained
/// biases, replace the parameter of their name). Returns the adapters merged; throws
/// v1::ConfigError naming the file and tensor for anything that does not fit the model.
int apply_adapter(v1::Model& model, const std::string& dir);

/// `trainrun generate --model DIR [--adapter DIR] [--chat] --prompt TEXT... | --prompts-file F
/// --max-new-tokens N [--temperature T --top-p P --seed S] [--jsonl]`. Returns the exit code:
/// 0 ok, 2 bad arguments, model, adapter, tokenizer or prompt file, 1 failure while generating.
int run_generate_command(int argc, char** argv);
}  // namespace trainrun::app
