// `trainrun generate`: loads an HF model directory through a model plugin (`llama` by default)
// and decodes batches of prompts with its KV cache (v1::generate_batch over v1::PaddedDecoder:
// left-padded prompts prefilled together, then one token per row per call). Greedy unless
// --temperature > 0 (then softmax sampling after top-k and nucleus truncation, as transformers'
// warpers), stopping a completion at any EOS id of generation_config.json / config.json / the
// tokenizer, at a --stop string, or after --max-new-tokens. An adapter directory (PEFT layout) is
// merged into the weights in memory (W + scaling x B A, as `trainrun merge-lora`).
#include "generate_cli.hpp"
#include "merge_lora.hpp"
#include "command_line.hpp"
#include "jsonl_line.hpp"
#include "template_limits_cli.hpp"

#include <ATen/ATen.h>
#include <boost/program_options.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "trainrun/core/launcher.hpp"
#include "trainrun/core/registry.hpp"
#include "trainrun/core/runtime.hpp"
#include "trainrun/deferred_weights.hpp"
#include "trainrun/eval/decoder_model.hpp"
#include "trainrun/batch_generation.hpp"
#include "trainrun/generation.hpp"
#include "trainrun/objective.hpp"
#include "trainrun/hf/safetensors.hpp"
#include "trainrun/runtime/cpu_runtime.hpp"
#include "trainrun/text/chat_template.hpp"
#include "trainrun/text/tokenizer.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using nlohmann::json;

namespace trainrun::app {
namespace {

using v1::ConfigError;

json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw ConfigError(p.string() + ": cannot be read");
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw ConfigError(p.string() + ": not valid JSON: " + e.what());
  }
}

// PEFT scaling: lora_alpha / r (or / sqrt(r) with use_rslora).
double lora_scaling(const json& c, const std::string& file) {
  if (c.contains("peft_type") && c["peft_type"] != "LORA")
    throw ConfigError(file + ": peft_type is " + c["peft_type"].dump() +
                      "; generate applies LORA adapters");
  if (!c.contains("r") || !c.contains("lora_alpha") || !c["r"].is_number() ||
      !c["lora_alpha"].is_number())
    throw ConfigError(file + ": needs numeric \"r\" and \"lora_alpha\"");
  if (c.value("use_dora", false)) throw ConfigError(file + ": DoRA adapters are not supported");
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    if (c.contains(k) && c[k].is_object() && !c[k].empty())
      throw ConfigError(file + ": \"" + k +
                        "\" is not empty; per-layer ranks or alphas are not supported");
  const double r = c["r"].get<double>(), alpha = c["lora_alpha"].get<double>();
  if (!(r > 0)) throw ConfigError(file + ": \"r\" must be positive");
  return c.value("use_rslora", false) ? alpha / std::sqrt(r) : alpha / r;
}

}  // namespace

// EOS ids as transformers' generate() takes them (generation_config.json, else config.json;
// an int or a list), plus the tokenizer's eos_token.
// Merges a PEFT adapter into the model's parameters (names: base_model.model.<HF name>); tensors
// that are not lora_A/lora_B pairs (trained biases, modules_to_save) replace the parameter.
int apply_adapter(v1::Model& model, const std::string& dir, const AdapterBase& how,
                  std::string* base_note) {
  const fs::path cfg_path = fs::path(dir) / "adapter_config.json";
  const fs::path weights = fs::path(dir) / "adapter_model.safetensors";
  for (const auto& p : {cfg_path, weights})
    if (!fs::is_regular_file(p)) throw ConfigError("--adapter " + dir + ": no " + p.filename().string());
  const double scaling = lora_scaling(read_json(cfg_path), cfg_path.string());
  std::map<std::string, at::Tensor> params;
  for (auto& p : model.named_parameters()) params[p.name] = p.tensor;
  std::map<std::string, at::Tensor> ad;
  std::map<std::string, std::string> metadata;
  for (auto& t : hf::read_safetensors(weights.string(), &metadata)) ad[t.name] = t.tensor;
  const std::string prefix = "base_model.model.", a_suffix = ".lora_A.weight", b_suffix = ".lora_B.weight";
  // A QLoRA adapter was trained against its base as quantized (merge_lora.hpp): that base is
  // rebuilt unless --plain-base, as merge-lora does.
  const nlohmann::json quantized = recorded_base_quantization(metadata, weights.string());
  std::unique_ptr<TrainedBase> trained_base;
  if (!quantized.empty() && !how.plain_base)
    trained_base = std::make_unique<TrainedBase>(how.plugin_paths);
  int rebuilt = 0;
  at::NoGradGuard no_grad;
  int merged = 0;
  for (const auto& [name, t] : ad) {
    if (name.rfind(prefix, 0) != 0)
      throw ConfigError(weights.string() + ": tensor '" + name + "' does not start with '" + prefix + "'");
    const std::string path = name.substr(prefix.size());
    auto ends = [&](const std::string& s) {
      return path.size() > s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
    };
    if (ends(b_suffix)) continue;  // with its lora_A
    if (ends(a_suffix)) {
      const std::string layer = path.substr(0, path.size() - a_suffix.size());
      auto b = ad.find(prefix + layer + b_suffix);
      if (b == ad.end()) throw ConfigError(weights.string() + ": '" + name + "' has no lora_B");
      auto w = params.find(layer + ".weight");
      if (w == params.end()) throw ConfigError(weights.string() + ": the model has no '" + layer + ".weight' for '" + name + "'");
      at::Tensor W = w->second;
      const at::Tensor A = t.to(at::kDouble), B = b->second.to(at::kDouble);
      if (A.dim() != 2 || B.dim() != 2 || B.size(1) != A.size(0) || B.size(0) != W.size(0) || A.size(1) != W.size(1))
        throw ConfigError(weights.string() + ": adapter of '" + layer + "' (lora_A " + c10::str(t.sizes()) +
                          ", lora_B " + c10::str(b->second.sizes()) + ") does not fit " + c10::str(W.sizes()));
      at::Tensor W0 = W;
      if (trained_base && quantized.contains(layer)) {
        W0 = (*trained_base)(W, quantized[layer], layer, weights.string());
        ++rebuilt;
      }
      W.copy_((W0.to(at::kDouble) + at::matmul(B, A) * scaling).to(W.scalar_type()));
      ++merged;
      continue;
    }
    // Trained biases (bias = "all" / "lora_only") replace the base's, as PEFT loads them.
    auto p = params.find(path);
    if (p == params.end() || p->second.sizes() != t.sizes())
      throw ConfigError(weights.string() + ": tensor '" + name + "' matches no parameter of the model's shape");
    p->second.copy_(t);
  }
  if (merged == 0) throw ConfigError(weights.string() + ": no lora_A/lora_B pairs");
  if (trained_base) trained_base->warn_inexact(how.command);
  if (base_note != nullptr) {
    const std::string fmt =
        quantized.empty() ? "" : quantized.begin()->value("format", std::string("?"));
    if (quantized.empty())
      *base_note = "base: full precision, as the adapter was trained";
    else if (how.plain_base)
      *base_note = "base: full precision (--plain-base), NOT the " + fmt + "-quantized base the " +
                   "adapter was trained against (" + std::to_string(quantized.size()) +
                   " layer(s)): a different model from the one trained";
    else
      *base_note = "base: " + fmt + "-quantized as in training, dequantized (" +
                   std::to_string(rebuilt) + " layer(s)), the model that was trained " +
                   "(--plain-base: the full-precision base instead)";
  }
  return merged;
}

LoadedModel::LoadedModel() = default;
LoadedModel::LoadedModel(LoadedModel&&) noexcept = default;
LoadedModel::~LoadedModel() = default;  // the model first, then the registry holding its code

LoadedModel load_hf_model(const std::string& command, const std::string& dir,
                          const std::string& plugin, const std::vector<std::string>& plugin_paths,
                          const std::string& task,
                          const std::map<std::string, v1::OptionValue>& overrides) {
  LoadedModel out;
  out.registry = std::make_unique<core::Registry>();
  core::Registry& reg = *out.registry;
  reg.load_search_path(core::Registry::search_path(plugin_paths, {}));
  const core::ComponentInfo& info =
      reg.require(v1::ComponentKind::Model, plugin, command + " --model-plugin");
  std::map<std::string, v1::OptionValue> values;
  for (const auto& s : info.schema.specs()) values[s.name] = s.default_value;
  values["path"] = dir;
  if (values.count("save_hf")) values["save_hf"] = false;
  for (const auto& [k, v] : overrides)
    if (values.count(k)) values[k] = v;
  v1::RunContext ctx;
  ctx.data.task = task;
  out.model = reg.create<v1::Model>(info, v1::Options(values, command + " --model " + dir), ctx);
  out.label = core::describe_component(info);
  if (auto* d = dynamic_cast<v1::DeferredWeights*>(out.model.get()))  // ABI 1.7: read them whole
    core::guarded(out.label, "load_deferred_weights", [&] {
      d->load_deferred_weights();
      return 0;
    });
  return out;
}

void check_model_dir(const std::string& dir) {
  if (!fs::is_regular_file(fs::path(dir) / "config.json"))
    throw ConfigError("--model " + dir + ": no config.json (not a Hugging Face model directory)");
}

int prepare_for_inference(LoadedModel& loaded, const std::string& adapter, const AdapterBase& how,
                          std::string* base_note) {
  const int merged = adapter.empty() ? 0 : apply_adapter(*loaded.model, adapter, how, base_note);
  core::guarded(loaded.label, "train(false)", [&] {
    loaded.model->train(false);
    return 0;
  });
  return merged;
}

std::string describe_loaded(const LoadedModel& loaded, int merged, const std::string& adapter) {
  return core::guarded(loaded.label, "describe", [&] { return loaded.model->describe(); }) +
         (merged ? ", " + std::to_string(merged) + " LoRA adapters merged from " + adapter
                 : std::string());
}

int run_model_command(const std::string& command, const std::function<int()>& body) {
  try {
    return body();
  } catch (const ConfigError& e) {
    return command_error(command, e.what());
  } catch (const v1::PluginError& e) {
    return command_error(command, e.what());
  } catch (const text::ChatTemplateError& e) {
    return command_error(command, std::string("chat template: ") + e.what());
  } catch (const std::exception& e) {
    command_error(command, e.what());
    return 1;
  }
}

namespace {

std::vector<std::string> read_prompts_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw ConfigError("--prompts-file " + path + ": cannot be read");
  std::vector<std::string> out;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    json j;
    if (!parse_jsonl_line(line, path, n, j)) continue;
    const char* key = j.is_object() && j.contains("prompt") ? "prompt" : "text";
    if (!j.is_object() || !j.contains(key) || !j[key].is_string())
      throw ConfigError(path + ":" + std::to_string(n) + ": expected an object with a string \"prompt\" (or \"text\")");
    out.push_back(j[key].get<std::string>());
  }
  return out;
}

// The OpenBLAS kernel as a training job's [launch] blas_coretype = "auto" picks it
// (core/runtime.hpp): OpenBLAS 0.3.21 may load an SSE kernel on an AVX-512 CPU, which makes
// every decode step several times slower. Applied by running this command line again with
// OPENBLAS_CORETYPE set (OpenBLAS reads it only when it loads); "off" keeps what it loaded.
void select_blas_kernel(const std::string& option, char** argv) {
  if (option == "off" || std::getenv("TRAINRUN_BLAS_CHOICE")) return;
  const core::BlasChoice choice =
      core::resolve_blas_kernel(option, core::user_coretype_env(), v1::cpu::blas_info(),
                                core::best_blas_kernel(core::cpu_features()), core::probe_blas_kernel);
  if (choice.warn) std::cerr << "generate: --blas-coretype: " << choice.note << std::endl;
  setenv("TRAINRUN_BLAS_CHOICE", choice.note.c_str(), 1);
  if (!choice.select) return;
  setenv("OPENBLAS_CORETYPE", choice.coretype.c_str(), 1);
  const std::string exe = core::self_executable();
  execv(exe.c_str(), argv);
  std::cerr << "generate: cannot run " << exe << " again (" << std::strerror(errno) << "); keeping BLAS kernel "
            << v1::cpu::blas_info().corename << std::endl;
}

// The command line of `trainrun generate`.
struct GenerateArgs {
  std::string model_dir, adapter, prompts_file, model_plugin = "llama", blas_coretype = "auto";
  std::vector<std::string> prompts, plugin_paths;
  std::vector<std::string> stop;
  int64_t max_new = 0, min_new = 0, threads = 0, top_k = 0, num_generations = 1, batch_size = 8;
  double temperature = 0.0, top_p = 1.0;
  uint64_t seed = 0;
  bool chat = false, jsonl = false, plain_base = false;
  text::TemplateLimits template_limits;
};

// A prompt's ids: as text with the tokenizer's special tokens, or (--chat) as a user message
// rendered with the chat template and its generation prompt.
std::vector<int32_t> encode_prompt(const std::string& prompt, const text::Tokenizer& tok,
                                   const std::optional<text::ChatTemplate>& tmpl) {
  if (!tmpl) return tok.encode(prompt, /*add_special_tokens=*/true);
  nlohmann::ordered_json message = nlohmann::ordered_json::object();
  message["role"] = "user";
  message["content"] = prompt;
  text::ChatTemplateOptions o;
  o.add_generation_prompt = true;
  // As apply_chat_template(tokenize=True): the template writes any BOS itself.
  return tok.encode(tmpl->apply(nlohmann::ordered_json::array({message}), o).text,
                    /*add_special_tokens=*/false);
}

int generate(GenerateArgs& a, char** argv) {
  if (!a.prompts_file.empty())
    for (auto& p : read_prompts_file(a.prompts_file)) a.prompts.push_back(std::move(p));
  if (a.prompts.empty()) throw ConfigError("give at least one --prompt TEXT or a --prompts-file");
  check_model_dir(a.model_dir);
  select_blas_kernel(a.blas_coretype, argv);
  if (a.threads > 0) at::set_num_threads(static_cast<int>(a.threads));

  const text::Tokenizer tok = text::Tokenizer::from_directory(a.model_dir);
  std::optional<text::ChatTemplate> tmpl;
  if (a.chat) tmpl = text::load_chat_template(a.model_dir, "", a.template_limits);
  const std::set<int64_t> eos = eval::generation_eos_ids(a.model_dir, tok);

  const auto t_load = std::chrono::steady_clock::now();
  LoadedModel loaded = load_hf_model("trainrun generate", a.model_dir, a.model_plugin,
                                     a.plugin_paths, "language_modeling", {});
  const std::string& label = loaded.label;
  if (auto* sc = dynamic_cast<v1::SequenceClassifier*>(loaded.model.get());
      sc && sc->num_labels() > 0)
    throw ConfigError("--model " + a.model_dir +
                      ": a sequence-classification model (a reward model) "
                      "scores text and does not generate it: use `trainrun score`");
  auto* decoder = dynamic_cast<v1::IncrementalDecoder*>(loaded.model.get());
  if (!decoder)
    throw ConfigError(label + " does not offer incremental decoding (v1::IncrementalDecoder)");
  std::string base_note;
  const int merged = prepare_for_inference(loaded, a.adapter,
                                           {a.plain_base, a.plugin_paths, "generate"}, &base_note);
  if (!base_note.empty()) std::cerr << "generate: " << base_note << std::endl;
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  std::cerr << "generate: " << describe_loaded(loaded, merged, a.adapter) << "; loaded in "
            << std::fixed << std::setprecision(2) << load_s << " s" << std::endl;

  v1::GenerationRequest req;
  for (size_t n = 0; n < a.prompts.size(); ++n) {
    const std::vector<int32_t> ids32 = encode_prompt(a.prompts[n], tok, tmpl);
    if (ids32.empty())
      throw ConfigError("prompt " + std::to_string(n + 1) + " encodes to no tokens");
    req.prompts.emplace_back(ids32.begin(), ids32.end());
  }
  req.num_generations = a.num_generations;
  req.max_completion_length = a.max_new;
  req.min_new_tokens = a.min_new;
  req.temperature = a.temperature;
  req.top_k = a.top_k;
  req.top_p = a.top_p;
  req.eos_token_ids.assign(eos.begin(), eos.end());
  // transformers falls back to the first EOS id when there is no pad token; the filler's value
  // never reaches a real token (masked), it only has to be a valid id.
  req.pad_token_id = tok.pad_token_id() ? *tok.pad_token_id() : (eos.empty() ? 0 : *eos.begin());
  req.seed = a.seed;
  req.batch_size = a.batch_size;
  // A stop string may span tokens: the completion's text so far is searched (as transformers'
  // stop_strings, the completion keeps the token that completed it).
  if (!a.stop.empty())
    req.stop = [&](int64_t, const std::vector<int64_t>& ids) {
      const std::string t = eval::completion_text(tok, ids);
      return std::any_of(a.stop.begin(), a.stop.end(),
                         [&](const std::string& s) { return t.find(s) != std::string::npos; });
    };
  v1::GenerationResult res;
  // Not core::guarded: its PluginError means bad input (exit 2); a failure while decoding is
  // exit 1, still naming the plugin.
  try {
    res = v1::generate_batch(*decoder, req);
  } catch (const c10::Error& e) {
    throw std::runtime_error(label + ": decode failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error(label + ": decode failed: " + e.what());
  }
  const bool several = res.completions.size() > 1;
  int64_t total_new = 0;
  for (size_t c = 0; c < res.completions.size(); ++c) {
    const v1::Completion& comp = res.completions[c];
    const int64_t g = static_cast<int64_t>(c) % a.num_generations;
    const std::string text = eval::completion_text(tok, comp.ids);
    total_new += static_cast<int64_t>(comp.ids.size());
    if (a.jsonl) {
      json j = {{"prompt", a.prompts[comp.prompt]},
                {"prompt_index", comp.prompt},
                {"generation", g},
                {"prompt_ids", req.prompts[comp.prompt]},
                {"ids", comp.ids},
                {"text", text},
                {"finish_reason", comp.finish}};
      std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
    } else {
      std::cout << (several ? "### prompt " + std::to_string(comp.prompt + 1) +
                                  (a.num_generations > 1 ? ", completion " + std::to_string(g + 1)
                                                         : std::string()) +
                                  "\n"
                            : std::string())
                << text << std::endl;
    }
  }
  // One line a script can parse: the prefill covers each batch up to its first new tokens.
  std::cerr << "generate: " << res.completions.size() << " completions in batches of "
            << (a.batch_size > 0 ? a.batch_size : static_cast<int64_t>(res.completions.size()))
            << ": " << res.prefill_tokens << " prompt tokens, prefill " << std::setprecision(3)
            << res.prefill_s << " s; " << total_new << " new tokens, decode " << res.decode_s
            << " s; " << std::setprecision(1) << total_new / (res.prefill_s + res.decode_s)
            << " new tokens/s end to end" << std::endl;
  return 0;
}

}  // namespace

int run_generate_command(int argc, char** argv) {
  GenerateArgs a;
  po::options_description opts("trainrun generate options");
  opts.add_options()("help,h", "show this help")(
      "model", po::value(&a.model_dir),
      "Hugging Face model directory (config.json, safetensors, tokenizer files)")(
      "adapter", po::value(&a.adapter),
      "PEFT LoRA adapter directory, merged into the weights in memory (a QLoRA adapter into "
      "its base quantized as in training)")(
      "plain-base", po::bool_switch(&a.plain_base),
      "QLoRA adapters: merge into the full-precision base instead of the base as training "
      "quantized it (as PEFT over an unquantized base; a different model)")(
      "chat",
      "render each prompt as a user message with the model's chat template + generation prompt")(
      "prompt", po::value(&a.prompts)->composing(), "prompt text (repeatable)")(
      "prompts-file", po::value(&a.prompts_file), "JSONL file, one {\"prompt\": TEXT} per line")(
      "max-new-tokens", po::value(&a.max_new), "tokens to generate at most per prompt")(
      "min-new-tokens", po::value(&a.min_new),
      "EOS ids cannot be chosen before this many new tokens (default 0)")(
      "temperature", po::value(&a.temperature),
      "0 (default): greedy; > 0: sample from softmax(logits / T)")(
      "top-p", po::value(&a.top_p),
      "sampling: keep the most likely tokens up to this probability mass (default 1)")(
      "top-k", po::value(&a.top_k), "sampling: keep the k most likely tokens (default 0: all)")(
      "num-generations", po::value(&a.num_generations),
      "completions per prompt (default 1; each sampled with its own seed)")(
      "batch-size", po::value(&a.batch_size),
      "completions decoded together, left-padded in one KV cache (default 8; 0: all)")(
      "stop", po::value(&a.stop)->composing(),
      "stop a completion once its text contains this string (repeatable)")(
      "seed", po::value(&a.seed), "sampling: random seed (default 0)")(
      "threads", po::value(&a.threads), "LibTorch intra-op threads (default: LibTorch's choice)")(
      "blas-coretype", po::value(&a.blas_coretype),
      "OpenBLAS kernel: auto (default: as a job's [launch] "
      "blas_coretype), off, or a kernel name")(
      "jsonl", "print one JSON object per completion (ids, text, finish_reason) instead of text")(
      "model-plugin", po::value(&a.model_plugin),
      "model component to load the directory with (default llama)")(
      "plugin-path", po::value(&a.plugin_paths)->composing(),
      "plugin directory or file, searched first (repeatable)");
  add_template_limit_options(opts, a.template_limits);
  po::variables_map vm;
  if (const auto done = parse_command_line(argc, argv, "generate",
                                           "usage: trainrun generate --model DIR [--adapter DIR] "
                                           "[--chat] --prompt TEXT [--prompt TEXT]...\n"
                                           "                         --max-new-tokens N "
                                           "[--temperature T --top-p P --top-k K --seed S]\n"
                                           "                         [--num-generations N] "
                                           "[--batch-size B] [--stop TEXT]... [--jsonl]\n"
                                           "       trainrun generate --model DIR --prompts-file "
                                           "prompts.jsonl --max-new-tokens N ...",
                                           opts, vm))
    return *done;
  if (a.model_dir.empty()) return command_error("generate", "--model DIR is required");
  if (a.max_new <= 0) return command_error("generate", "--max-new-tokens N (N > 0) is required");
  if (a.temperature < 0) return command_error("generate", "--temperature must be >= 0");
  if (!(a.top_p > 0 && a.top_p <= 1)) return command_error("generate", "--top-p must be in (0, 1]");
  if (a.top_k < 0) return command_error("generate", "--top-k must be >= 0");
  if (a.num_generations <= 0) return command_error("generate", "--num-generations must be > 0");
  if (a.batch_size < 0) return command_error("generate", "--batch-size must be >= 0");
  a.chat = vm.count("chat") > 0;
  a.jsonl = vm.count("jsonl") > 0;
  return run_model_command("generate", [&] { return generate(a, argv); });
}

}  // namespace trainrun::app
