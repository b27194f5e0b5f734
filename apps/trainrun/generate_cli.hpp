#pragma once
// `trainrun generate`: text from a Hugging Face model directory through a model plugin that
// offers v1::IncrementalDecoder (KV cache), with the directory's tokenizer and chat template.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/options.hpp"

namespace trainrun::v1 {
class Model;
}
namespace trainrun::core {
class Registry;
}

namespace trainrun::app {
/// Merges the PEFT LoRA adapter directory `dir` (adapter_config.json, adapter_model.safetensors)
/// into `model`'s parameters (W + scaling x B A; other tensors, e.g. modules_to_save or trained
/// biases, replace the parameter of their name). Returns the adapters merged; throws
/// v1::ConfigError naming the file and tensor for anything that does not fit the model.
int apply_adapter(v1::Model& model, const std::string& dir);

/// A model component loaded from an HF model directory for a command (generate, score): the
/// registry that loaded its plugin (kept alive as long as the model) and the component's label.
struct LoadedModel {
  std::unique_ptr<core::Registry> registry;
  std::unique_ptr<v1::Model> model;
  std::string label;
  LoadedModel();
  LoadedModel(LoadedModel&&) noexcept;
  ~LoadedModel();
};

/// Builds model component `plugin` (searched on `plugin_paths` first) from the HF directory
/// `dir`: its options' defaults, path = dir, then `overrides` for the options the component
/// declares (others are ignored), with RunContext::data.task = `task`; reads deferred weights
/// whole (ABI 1.7). `command` ("trainrun score") names the caller in errors. Throws
/// v1::ConfigError / v1::PluginError as the registry and the component do.
LoadedModel load_hf_model(const std::string& command, const std::string& dir,
                          const std::string& plugin, const std::vector<std::string>& plugin_paths,
                          const std::string& task,
                          const std::map<std::string, v1::OptionValue>& overrides);

/// `trainrun generate --model DIR [--adapter DIR] [--chat] --prompt TEXT... | --prompts-file F
/// --max-new-tokens N [--temperature T --top-p P --seed S] [--jsonl]`. Returns the exit code:
/// 0 ok, 2 bad arguments, model, adapter, tokenizer or prompt file, 1 failure while generating.
int run_generate_command(int argc, char** argv);
}  // namespace trainrun::app
