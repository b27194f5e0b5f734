// `trainrun generate`: loads an HF model directory through a model plugin (`llama` by default)
// and decodes with its KV cache (v1::IncrementalDecoder): the prompt in one prefill call, then
// one token per call. Greedy unless --temperature > 0 (then softmax sampling with nucleus
// truncation, Holtzman et al. 2020), stopping at any EOS id of generation_config.json /
// config.json / the tokenizer, or after --max-new-tokens. An adapter directory (PEFT layout) is
// merged into the weights in memory (W + scaling x B A, as `trainrun merge-lora`).
#include "generate_cli.hpp"
#include "command_line.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <boost/program_options.hpp>
#include <unistd.h>

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

// EOS ids as transformers' generate() takes them (generation_config.json, else config.json;
// an int or a list), plus the tokenizer's eos_token.
std::set<int64_t> eos_ids(const fs::path& dir, const text::Tokenizer& tok) {
  std::set<int64_t> out;
  auto add = [&](const json& v, const fs::path& file) {
    if (v.is_number_integer()) out.insert(v.get<int64_t>());
    else if (v.is_array())
      for (const auto& e : v) {
        if (!e.is_number_integer()) throw ConfigError(file.string() + ": \"eos_token_id\" holds " + e.dump());
        out.insert(e.get<int64_t>());
      }
    else if (!v.is_null()) throw ConfigError(file.string() + ": \"eos_token_id\" must be an integer or a list, got " + v.dump());
  };
  for (const char* name : {"generation_config.json", "config.json"}) {
    const fs::path p = dir / name;
    if (!fs::is_regular_file(p)) continue;
    const json j = read_json(p);
    if (j.contains("eos_token_id")) {
      add(j["eos_token_id"], p);
      break;
    }
  }
  if (auto e = tok.eos_token_id()) out.insert(*e);
  return out;
}

// PEFT scaling: lora_alpha / r (or / sqrt(r) with use_rslora).
double lora_scaling(const json& c, const std::string& file) {
  if (c.contains("peft_type") && c["peft_type"] != "LORA")
    throw ConfigError(file + ": peft_type is " + c["peft_type"].dump() + "; generate applies LORA adapters");
  if (!c.contains("r") || !c.contains("lora_alpha") || !c["r"].is_number() || !c["lora_alpha"].is_number())
    throw ConfigError(file + ": needs numeric \"r\" and \"lora_alpha\"");
  if (c.value("use_dora", false)) throw ConfigError(file + ": DoRA adapters are not supported");
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    if (c.contains(k) && c[k].is_object() && !c[k].empty())
      throw ConfigError(file + ": \"" + k + "\" is not empty; per-layer ranks or alphas are not supported");
  const double r = c["r"].get<double>(), alpha = c["lora_alpha"].get<double>();
  if (!(r > 0)) throw ConfigError(file + ": \"r\" must be positive");
  return c.value("use_rslora", false) ? alpha / std::sqrt(r) : alpha / r;
}

}  // namespace

// Merges a PEFT adapter into the model's parameters (names: base_model.model.<HF name>); tensors
// that are not lora_A/lora_B pairs (trained biases, modules_to_save) replace the parameter.
int apply_adapter(v1::Model& model, const std::string& dir) {
  const fs::path cfg_path = fs::path(dir) / "adapter_config.json";
  const fs::path weights = fs::path(dir) / "adapter_model.safetensors";
  for (const auto& p : {cfg_path, weights})
    if (!fs::is_regular_file(p)) throw ConfigError("--adapter " + dir + ": no " + p.filename().string());
  const double scaling = lora_scaling(read_json(cfg_path), cfg_path.string());
  std::map<std::string, at::Tensor> params;
  for (auto& p : model.named_parameters()) params[p.name] = p.tensor;
  std::map<std::string, at::Tensor> ad;
  for (auto& t : hf::read_safetensors(weights.string())) ad[t.name] = t.tensor;
  const std::string prefix = "base_model.model.", a_suffix = ".lora_A.weight", b_suffix = ".lora_B.weight";
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
      W.copy_((W.to(at::kDouble) + at::matmul(B, A) * scaling).to(W.scalar_type()));
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

int prepare_for_inference(LoadedModel& loaded, const std::string& adapter) {
  const int merged = adapter.empty() ? 0 : apply_adapter(*loaded.model, adapter);
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
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw ConfigError(path + ":" + std::to_string(n) + ": not valid JSON: " + e.what());
    }
    const char* key = j.is_object() && j.contains("prompt") ? "prompt" : "text";
    if (!j.is_object() || !j.contains(key) || !j[key].is_string())
      throw ConfigError(path + ":" + std::to_string(n) + ": expected an object with a string \"prompt\" (or \"text\")");
    out.push_back(j[key].get<std::string>());
  }
  return out;
}

struct Sampling {
  double temperature = 0.0, top_p = 1.0;
  at::Generator gen;
};

// The next token from logits [vocab] (float32): arg-max, or a draw from the temperature-scaled
// softmax restricted to the smallest set of most likely tokens whose probability reaches top_p.
int64_t next_token(const at::Tensor& logits, Sampling& s) {
  if (s.temperature <= 0) return logits.argmax().item<int64_t>();
  at::Tensor probs = at::softmax(logits.to(at::kDouble) / s.temperature, -1);
  if (s.top_p < 1.0) {
    auto [sorted, order] = probs.sort(-1, /*descending=*/true);
    // Keep a token while the mass before it is below top_p (the first one always).
    const at::Tensor keep = (sorted.cumsum(-1) - sorted) < s.top_p;
    probs = at::zeros_like(probs).scatter_(-1, order, sorted * keep);
  }
  return at::multinomial(probs, 1, false, s.gen).item<int64_t>();
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
  int64_t max_new = 0, threads = 0;
  double temperature = 0.0, top_p = 1.0;
  uint64_t seed = 0;
  bool chat = false, jsonl = false;
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

// One prompt's continuation: its ids, why it stopped ("eos", "length") and the time of the
// prefill (up to the first new token) and of the decode steps after it.
struct Continuation {
  std::vector<int64_t> ids;
  std::string finish = "length";
  double prefill_s = 0, decode_s = 0;
};

Continuation continue_prompt(v1::IncrementalDecoder& decoder,
                             const std::vector<int64_t>& prompt_ids, int64_t max_new,
                             const std::set<int64_t>& eos, Sampling& sampling,
                             const std::string& label) {
  const int64_t P = static_cast<int64_t>(prompt_ids.size());
  Continuation c;
  auto t0 = std::chrono::steady_clock::now();
  // Not core::guarded: its PluginError means bad input (exit 2); a failure while decoding is
  // exit 1, still naming the plugin.
  try {
    std::unique_ptr<v1::DecodeState> state = decoder.new_decode_state(1, P + max_new);
    at::Tensor logits = decoder.decode(at::tensor(prompt_ids, at::kLong).view({1, P}), *state);
    for (;;) {
      const int64_t next = next_token(logits[0][-1], sampling);
      if (c.ids.empty()) {
        c.prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        t0 = std::chrono::steady_clock::now();
      }
      c.ids.push_back(next);
      if (eos.count(next)) {
        c.finish = "eos";
        break;
      }
      if (static_cast<int64_t>(c.ids.size()) >= max_new) break;
      logits = decoder.decode(at::tensor({next}, at::kLong).view({1, 1}), *state);
    }
  } catch (const c10::Error& e) {
    throw std::runtime_error(label + ": decode failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error(label + ": decode failed: " + e.what());
  }
  c.decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
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
  if (a.chat) tmpl = text::load_chat_template(a.model_dir);
  const std::set<int64_t> eos = eos_ids(a.model_dir, tok);

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
  const int merged = prepare_for_inference(loaded, a.adapter);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  std::cerr << "generate: " << describe_loaded(loaded, merged, a.adapter) << "; loaded in "
            << std::fixed << std::setprecision(2) << load_s << " s" << std::endl;

  Sampling sampling{a.temperature, a.top_p, at::detail::createCPUGenerator(a.seed)};
  const std::vector<std::string>& prompts = a.prompts;
  int64_t total_prompt = 0, total_new = 0;
  double total_prefill_s = 0, total_decode_s = 0;
  int64_t total_decode_tokens = 0;
  for (size_t n = 0; n < prompts.size(); ++n) {
    const std::vector<int32_t> ids32 = encode_prompt(prompts[n], tok, tmpl);
    if (ids32.empty())
      throw ConfigError("prompt " + std::to_string(n + 1) + " encodes to no tokens");
    const std::vector<int64_t> prompt_ids(ids32.begin(), ids32.end());
    const int64_t P = static_cast<int64_t>(prompt_ids.size());
    const Continuation c = continue_prompt(*decoder, prompt_ids, a.max_new, eos, sampling, label);
    const std::vector<int64_t>& out = c.ids;
    const int64_t decode_tokens =
        static_cast<int64_t>(out.size()) - 1;  // the first came from the prefill
    total_prompt += P;
    total_new += static_cast<int64_t>(out.size());
    total_prefill_s += c.prefill_s;
    total_decode_s += c.decode_s;
    total_decode_tokens += decode_tokens;
    // Models often pad their vocabulary past the tokenizer's (Qwen: 151936 vs 151669): such
    // an id has no text.
    std::vector<int32_t> out32;
    for (int64_t id : out)
      if (id < tok.vocab_size()) out32.push_back(static_cast<int32_t>(id));
    const std::string text = tok.decode(out32, /*skip_special_tokens=*/true);
    const double prefill_tps = P / c.prefill_s,
                 decode_tps = decode_tokens > 0 ? decode_tokens / c.decode_s : 0.0;
    if (a.jsonl) {
      json j = {{"prompt", prompts[n]},
                {"prompt_ids", prompt_ids},
                {"ids", out},
                {"text", text},
                {"finish_reason", c.finish},
                {"prefill_tokens_per_s", prefill_tps},
                {"decode_tokens_per_s", decode_tps}};
      std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
    } else {
      std::cout << (prompts.size() > 1 ? "### prompt " + std::to_string(n + 1) + "\n"
                                       : std::string())
                << text << std::endl;
    }
    std::cerr << "generate: prompt " << n + 1 << ": " << P << " prompt tokens, " << out.size()
              << " new (" << (c.finish == "eos" ? "stopped at EOS" : "max-new-tokens")
              << "); prefill " << std::setprecision(1) << prefill_tps << " tokens/s, decode "
              << decode_tps << " tokens/s" << std::endl;
  }
  if (prompts.size() > 1)
    std::cerr << "generate: " << prompts.size() << " prompts: " << total_prompt
              << " prompt tokens at " << std::setprecision(1) << total_prompt / total_prefill_s
              << " tokens/s (prefill), " << total_new << " new tokens, decode "
              << (total_decode_s > 0 ? total_decode_tokens / total_decode_s : 0.0) << " tokens/s"
              << std::endl;
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
      "PEFT LoRA adapter directory, merged into the weights in memory")(
      "chat",
      "render each prompt as a user message with the model's chat template + generation prompt")(
      "prompt", po::value(&a.prompts)->composing(), "prompt text (repeatable)")(
      "prompts-file", po::value(&a.prompts_file), "JSONL file, one {\"prompt\": TEXT} per line")(
      "max-new-tokens", po::value(&a.max_new), "tokens to generate at most per prompt")(
      "temperature", po::value(&a.temperature),
      "0 (default): greedy; > 0: sample from softmax(logits / T)")(
      "top-p", po::value(&a.top_p),
      "sampling: keep the most likely tokens up to this probability mass (default 1)")(
      "seed", po::value(&a.seed), "sampling: random seed (default 0)")(
      "threads", po::value(&a.threads), "LibTorch intra-op threads (default: LibTorch's choice)")(
      "blas-coretype", po::value(&a.blas_coretype),
      "OpenBLAS kernel: auto (default: as a job's [launch] "
      "blas_coretype), off, or a kernel name")(
      "jsonl", "print one JSON object per prompt (ids, text, timings) instead of plain text")(
      "model-plugin", po::value(&a.model_plugin),
      "model component to load the directory with (default llama)")(
      "plugin-path", po::value(&a.plugin_paths)->composing(),
      "plugin directory or file, searched first (repeatable)");
  po::variables_map vm;
  if (const auto done = parse_command_line(argc, argv, "generate",
                                           "usage: trainrun generate --model DIR [--adapter DIR] "
                                           "[--chat] --prompt TEXT [--prompt TEXT]...\n"
                                           "                         --max-new-tokens N "
                                           "[--temperature T --top-p P --seed S] [--jsonl]\n"
                                           "       trainrun generate --model DIR --prompts-file "
                                           "prompts.jsonl --max-new-tokens N ...",
                                           opts, vm))
    return *done;
  if (a.model_dir.empty()) return command_error("generate", "--model DIR is required");
  if (a.max_new <= 0) return command_error("generate", "--max-new-tokens N (N > 0) is required");
  if (a.temperature < 0) return command_error("generate", "--temperature must be >= 0");
  if (!(a.top_p > 0 && a.top_p <= 1)) return command_error("generate", "--top-p must be in (0, 1]");
  a.chat = vm.count("chat") > 0;
  a.jsonl = vm.count("jsonl") > 0;
  return run_model_command("generate", [&] { return generate(a, argv); });
}

}  // namespace trainrun::app
