#pragma once
// `trainrun generate`: text from a Hugging Face model directory through a model plugin that
// offers v1::IncrementalDecoder (KV cache), with the directory's tokenizer and chat template.
// Also what `trainrun score` shares with it: loading the model, merging an adapter, and how
// their errors end the command.

#include <functional>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "trainrun/options.hpp"

namespace trainrun::v1 {
class Model;
}
namespace trainrun::core {
class Registry;
}
namespace trainrun::text {
class Tokenizer;
}

namespace trainrun::app {
/// Merges the PEFT LoRA adapter directory `dir` (adapter_config.json, adapter_model.safetensors)
/// into `model`'s parameters (W + scaling x B A; other tensors, e.g. modules_to_save or trained
/// biases, replace the parameter of their name). Returns the adapters merged; throws
/// v1::ConfigError naming the file and tensor for anything that does not fit the model.
/// How a QLoRA adapter's base is taken: as training quantized it (rebuilt by the quant plugin
/// found on `plugin_paths`, merge_lora.hpp's TrainedBase) unless `plain_base`. `command` prefixes
/// warnings ("generate").
struct AdapterBase {
  bool plain_base = false;
  std::vector<std::string> plugin_paths;
  std::string command = "trainrun";
};
/// ... With `base_note`, says in one line which base the adapter went into.
int apply_adapter(v1::Model& model, const std::string& dir, const AdapterBase& how = {},
                  std::string* base_note = nullptr);

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

/// Throws v1::ConfigError "--model DIR: no config.json (not a Hugging Face model directory)"
/// unless `dir` holds a config.json.
void check_model_dir(const std::string& dir);

/// Merges the adapter directory `adapter` into the loaded model (none when empty) and switches
/// the model to inference (train(false)). Returns the adapters merged.
int prepare_for_inference(LoadedModel& loaded, const std::string& adapter,
                          const AdapterBase& how = {}, std::string* base_note = nullptr);

/// The loaded model's describe(), plus ", N LoRA adapters merged from ADAPTER" when `merged` > 0.
std::string describe_loaded(const LoadedModel& loaded, int merged, const std::string& adapter);

/// Runs `body`, the work of `trainrun COMMAND` (generate, score) after its flags, and returns its
/// exit code. What it throws is printed by command_error (command_line.hpp): bad input
/// (v1::ConfigError, v1::PluginError, a chat template's error as "chat template: ...") returns 2,
/// any other std::exception 1.
int run_model_command(const std::string& command, const std::function<int()>& body);

/// `trainrun generate --model DIR [--adapter DIR] [--chat] --prompt TEXT... | --prompts-file F
/// --max-new-tokens N [--temperature T --top-p P --seed S] [--jsonl]`. Returns the exit code:
/// 0 ok, 2 bad arguments, model, adapter, tokenizer or prompt file, 1 failure while generating.
int run_generate_command(int argc, char** argv);
}  // namespace trainrun::app
