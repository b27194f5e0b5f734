// `trainrun merge-lora`: W' = W + scaling x B A for every adapted layer (Hu et al. 2021, section
// 4.1: "we can explicitly compute and store W = W0 + BA ... no additional inference latency").
// The base is a trainrun model.safetensors in full precision (what a run saves, e.g.
// configs/gpt-pretrain.toml) or a Hugging Face model directory (then the output is one too:
// config, generation config and tokenizer files copied, weights in the base's dtypes), the adapter a directory with PEFT's adapter_config.json and
// adapter_model.safetensors (what the `lora` callback writes, or Python PEFT's save_pretrained).
//
// QLoRA: an adapter trained against a quantized base (the `lora` callback records the base's
// quantization per layer in adapter_model.safetensors' metadata, key trainrun_base_quantization)
// learned a correction to that base, not to the full-precision one. By default each such layer's
// full-precision weight is quantized as in training and dequantized, and BA is added to that,
// which reproduces the trained model; --plain-base adds BA to the full-precision weight instead
// (a different model; the size of the difference is printed).
#include "merge_lora.hpp"
#include "command_line.hpp"

#include <boost/program_options.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <algorithm>

#include <nlohmann/json.hpp>

#include "trainrun/core/registry.hpp"
#include "trainrun/model/linear.hpp"
#include "trainrun/core/safetensors.hpp"
#include "trainrun/hf/model_dir.hpp"
#include "trainrun/error.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace trainrun::app {

namespace {

using v1::ConfigError;

constexpr const char* kPrefix = "base_model.model.";

// Scaling from PEFT's LoraConfig keys: lora_alpha / r, or / sqrt(r) with use_rslora.
double scaling_of(const nlohmann::json& c, const std::string& file) {
  auto need = [&](const char* key) -> const nlohmann::json& {
    if (!c.contains(key) || c[key].is_null())
      throw ConfigError(file + ": no \"" + key + "\" (is this a LoRA adapter_config.json?)");
    return c[key];
  };
  if (c.contains("peft_type") && c["peft_type"] != "LORA")
    throw ConfigError(file + ": peft_type is " + c["peft_type"].dump() + ", merge-lora merges LORA adapters");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (c.contains(key) && c[key].is_object() && !c[key].empty())
      throw ConfigError(file + ": \"" + key + "\" is not empty; per-layer ranks or alphas are not supported");
  if (c.value("use_dora", false)) throw ConfigError(file + ": DoRA adapters are not supported");
  if (c.value("fan_in_fan_out", false))
    throw ConfigError(file + ": fan_in_fan_out = true (Conv1D-style [in, out] weights) is not supported");
  const double r = need("r").get<double>();
  const double alpha = need("lora_alpha").get<double>();
  if (!(r > 0)) throw ConfigError(file + ": r must be positive");
  return c.value("use_rslora", false) ? alpha / std::sqrt(r) : alpha / r;
}

// A model of one trainrun Linear holding W, for the precision plugin to convert (it finds layers
// through Model::module(), as in a run).
class OneLinear final : public v1::Model {
 public:
  explicit OneLinear(const at::Tensor& W) : layer_(W.size(1), W.size(0)) {
    layer_->weight.set_data(W.to(at::kFloat).contiguous());
    root_.register_module("layer", layer_.ptr());
  }
  std::vector<v1::NamedTensor> named_parameters() override {
    return {{"layer.weight", layer_->weight}};
  }
  void train(bool) override {}
  v1::ModelOutput forward(const v1::Batch&) override {
    throw std::logic_error("merge-lora's one-layer model has no forward");
  }
  torch::nn::Module* module() override { return &root_; }
  std::string describe() const override { return "merge-lora's one-layer model"; }
  v1::Linear& layer() { return layer_; }

 private:
  torch::nn::Module root_;
  v1::Linear layer_;
};

// An adapter trained on another model whose tensors have the same names and shapes (a Mistral
// adapter on a Llama base) would merge without a shape error. PEFT's adapter_config.json names
// the model it was trained on (base_model_name_or_path); where that directory still has a
// config.json, its model_type must be the base's. Not detectable when the directory is gone or
// the base is a trainrun model.safetensors (no config.json): then shapes are all that is checked.
void check_trained_base(const nlohmann::json& adapter_cfg, const fs::path& adapter_cfg_path,
                        const std::string& base_path) {
  const auto it = adapter_cfg.find("base_model_name_or_path");
  if (it == adapter_cfg.end() || !it->is_string()) return;
  const fs::path trained = it->get<std::string>();
  std::error_code ec;
  if (!fs::is_regular_file(trained / "config.json", ec) || fs::equivalent(trained, base_path, ec)) return;
  auto model_type = [](const fs::path& config) -> std::string {
    try {
      std::ifstream f(config);
      const nlohmann::json j = nlohmann::json::parse(f);
      const auto m = j.find("model_type");
      return m != j.end() && m->is_string() ? m->get<std::string>() : std::string();
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(config.string() + ": not valid JSON: " + trainrun::v1::parse_error_text(e.what()));
    }
  };
  const std::string ours = model_type(fs::path(base_path) / "config.json");
  const std::string theirs = model_type(trained / "config.json");
  if (!ours.empty() && !theirs.empty() && ours != theirs)
    throw ConfigError("--base " + base_path + ": config.json key \"model_type\" is \"" + ours +
                      "\", but the adapter was trained on " + trained.string() + " (" +
                      adapter_cfg_path.string() + ", base_model_name_or_path), whose model_type is \"" +
                      theirs + "\": an adapter only fits the model it was trained on");
}

nlohmann::json read_json_file(const fs::path& path) {
  try {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(path.string() +
                      ": not valid JSON: " + trainrun::v1::parse_error_text(e.what()));
  }
}

// The base's tensors in file order (an HF directory's shards, or one safetensors file).
std::vector<v1::NamedTensor> read_base(const std::string& base_path, bool hf_dir) {
  if (!hf_dir) return core::read_safetensors(base_path);
  std::vector<v1::NamedTensor> base;
  const hf::ModelDir md(base_path);  // ConfigError naming a missing config.json, shard, ...
  for (const auto& name : md.tensor_names()) base.push_back({name, md.read(name)});
  return base;
}

// The adapter's tensors merged into (or, for trained biases, replacing) the base's, with what
// rebuilding the quantized base changed.
struct Merger {
  std::vector<v1::NamedTensor>& base;
  std::map<std::string, size_t> index;  // base tensor name -> position
  const std::string& base_path;
  const fs::path& ad_path;
  double scaling = 1.0;
  bool plain_base = false;
  nlohmann::json quantized_layers = nlohmann::json::object();
  double max_diff = 0, sum_sq_diff = 0, sum_sq = 0;
  int dequantized = 0, merged = 0, replaced = 0;

  // W <- W0 + scaling x B A for `layer`, W0 the base as training saw it.
  void merge_layer(const std::string& layer, const at::Tensor& a, const at::Tensor& b,
                   TrainedBase& trained_base) {
    auto w = index.find(layer + ".weight");
    if (w == index.end()) {
      const bool quantized =
          index.count(layer + ".weight_nf4") || index.count(layer + ".weight_int8");
      throw ConfigError(
          base_path + ": no tensor '" + layer + ".weight' for the adapter of '" + layer + "'" +
          (quantized ? " (the base holds it quantized: give the full-precision base model)" : ""));
    }
    at::Tensor& W = base[w->second].tensor;
    const at::Tensor A = a.to(at::kDouble), B = b.to(at::kDouble);
    at::Tensor W0 = W;
    if (quantized_layers.contains(layer)) {
      const at::Tensor Wq = trained_base(W, quantized_layers[layer], layer, ad_path.string());
      const at::Tensor d = (Wq.to(at::kDouble) - W.to(at::kDouble));
      max_diff = std::max(max_diff, d.abs().max().item<double>());
      sum_sq_diff += d.pow(2).sum().item<double>();
      sum_sq += W.to(at::kDouble).pow(2).sum().item<double>();
      if (!plain_base) {
        W0 = Wq;
        ++dequantized;
      }
    }
    if (A.dim() != 2 || B.dim() != 2 || W.dim() != 2 || B.size(1) != A.size(0) ||
        B.size(0) != W.size(0) || A.size(1) != W.size(1))
      throw ConfigError("adapter of '" + layer + "': lora_A " + c10::str(a.sizes()) + ", lora_B " +
                        c10::str(b.sizes()) + " do not fit the base weight " + c10::str(W.sizes()));
    // In float64, then back to the base's dtype: the sum is rounded once.
    W = (W0.to(at::kDouble) + at::matmul(B, A) * scaling).to(W.scalar_type());
    ++merged;
  }

  // Every lora_A/lora_B pair merged; anything else the adapter trained (biases with bias = "all"
  // / "lora_only") replaces the base's tensor, as PEFT's set_peft_model_state_dict does.
  void merge_all(const std::map<std::string, at::Tensor>& adapter, TrainedBase& trained_base) {
    std::set<std::string> used;
    const std::string suffix = ".lora_A.weight";
    for (const auto& [name, a] : adapter) {
      if (name.rfind(kPrefix, 0) != 0)
        throw ConfigError(ad_path.string() + ": tensor '" + name + "' does not start with '" +
                          kPrefix + "'");
      const std::string path = name.substr(std::string(kPrefix).size());
      if (path.size() <= suffix.size() ||
          path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      const std::string layer = path.substr(0, path.size() - suffix.size());
      const std::string b_name = std::string(kPrefix) + layer + ".lora_B.weight";
      auto b = adapter.find(b_name);
      if (b == adapter.end()) throw ConfigError(ad_path.string() + ": '" + name + "' has no '" + b_name + "'");
      merge_layer(layer, a, b->second, trained_base);
      used.insert(name);
      used.insert(b_name);
    }
    for (const auto& [name, t] : adapter) {
      if (used.count(name)) continue;
      const std::string path = name.substr(std::string(kPrefix).size());
      if (path.find(".lora_B.weight") != std::string::npos)
        throw ConfigError(ad_path.string() + ": '" + name + "' has no matching lora_A");
      auto it = index.find(path);
      if (it == index.end())
        throw ConfigError(base_path + ": no tensor '" + path + "' for adapter tensor '" + name +
                          "'");
      if (base[it->second].tensor.sizes() != t.sizes())
        throw ConfigError("adapter tensor '" + name + "' has shape " + c10::str(t.sizes()) +
                          ", the base's " + c10::str(base[it->second].tensor.sizes()));
      base[it->second].tensor = t.to(base[it->second].tensor.scalar_type());
      ++replaced;
    }
    if (merged == 0) throw ConfigError(ad_path.string() + ": no lora_A/lora_B pairs to merge");
  }

  void print_quantized_base() const {
    if (quantized_layers.empty()) return;
    const std::string fmt = quantized_layers.begin()->value("format", std::string("?"));
    std::ostringstream diff;
    diff << "the dequantized base differs from the full-precision one by up to " << max_diff
         << " (relative RMS " << (sum_sq > 0 ? std::sqrt(sum_sq_diff / sum_sq) : 0.0) << ")";
    if (plain_base)
      std::cout << "merge-lora: --plain-base: the adapter was trained against a " << fmt
                << "-quantized base (" << quantized_layers.size() << " layer(s)); merged into the "
                << "full-precision base instead, which is NOT the model that was trained: " << diff.str()
                << "; without --plain-base the quantized base is rebuilt as in training" << std::endl;
    else
      std::cout << "merge-lora: " << dequantized << " layer(s) trained against a " << fmt
                << "-quantized base: merged into that base (quantized as in training, dequantized), "
                << "which reproduces the trained model; " << diff.str()
                << " (--plain-base merges into the full-precision base instead)" << std::endl;
  }
};

int merge(const std::string& base_path, const std::string& adapter_dir, const std::string& output,
          int64_t max_shard_bytes, bool plain_base, const std::vector<std::string>& plugin_paths) {
  const fs::path cfg_path = fs::path(adapter_dir) / "adapter_config.json";
  const fs::path ad_path = fs::path(adapter_dir) / "adapter_model.safetensors";
  const bool hf_dir = fs::is_directory(base_path);
  if (!hf_dir && !fs::is_regular_file(base_path))
    throw ConfigError("--base " + base_path + ": no such file or directory");
  for (const auto& p : {cfg_path, ad_path})
    if (!fs::is_regular_file(p))
      throw ConfigError("--adapter " + adapter_dir + ": no " + p.filename().string());
  const nlohmann::json cfg = read_json_file(cfg_path);
  const double scaling = scaling_of(cfg, cfg_path.string());
  if (hf_dir) check_trained_base(cfg, cfg_path, base_path);

  std::vector<v1::NamedTensor> base = read_base(base_path, hf_dir);
  Merger m{base, {}, base_path, ad_path, scaling, plain_base};
  for (size_t i = 0; i < base.size(); ++i) m.index[base[i].name] = i;
  std::map<std::string, at::Tensor> adapter;
  std::map<std::string, std::string> ad_meta;
  for (auto& t : core::read_safetensors(ad_path.string(), &ad_meta)) adapter[t.name] = t.tensor;
  m.quantized_layers = recorded_base_quantization(ad_meta, ad_path.string());
  TrainedBase trained_base(plugin_paths);
  m.merge_all(adapter, trained_base);
  trained_base.warn_inexact("merge-lora");
  if (hf_dir) {
    fs::create_directories(output);
    hf::write_model_weights(output, base, max_shard_bytes);
    for (const char* f : {"config.json", "generation_config.json"})
      if (fs::is_regular_file(fs::path(base_path) / f))
        fs::copy_file(fs::path(base_path) / f, fs::path(output) / f,
                      fs::copy_options::overwrite_existing);
    hf::copy_tokenizer_files(base_path, output);
  } else {
    core::write_safetensors(output, base,
                            {{"format", "pt"}, {"trainrun_merged_adapter", adapter_dir}});
  }
  m.print_quantized_base();
  std::cout << "merge-lora: " << m.merged << " adapter(s) merged (scaling " << scaling << ")"
            << (m.replaced ? ", " + std::to_string(m.replaced) + " tensor(s) replaced"
                           : std::string())
            << ", " << base.size() << " tensors written to " << output << std::endl;
  return 0;
}

}  // namespace

// TrainedBase (merge_lora.hpp): shared with generate and score, which rebuild the same base.
// W as the adapter's training saw it: the full-precision weight quantized as recorded (NF4 with
// its blocksize and double quantization, or int8) and dequantized, float32. The precision plugin
// that trained it does both (quant-nf4 / quant-int8, found on the plugin search path as a job's
// components are), through the SDK's interfaces only: Precision::convert, then the layer's
// LinearBase::dequantized_weight().
struct TrainedBase::Impl {
  explicit Impl(std::vector<std::string> plugin_paths) : plugin_paths_(std::move(plugin_paths)) {}

  at::Tensor rebuild(const at::Tensor& W, const nlohmann::json& q, const std::string& layer,
                     const std::string& adapter_file) {
    const std::string format = q.value("format", std::string());
    std::string plugin;
    std::map<std::string, v1::OptionValue> set;
    if (format.rfind("nf4", 0) == 0) {
      // Said once for all layers (warn_inexact), not once per layer.
      if (!q.value("blocksize_exact", true) && inexact_++ == 0) {
        first_inexact_ = layer;
        inexact_file_ = adapter_file;
      }
      // The recorded dq_blocksize is inferred from shapes too; quant-nf4 always used 256.
      plugin = "quant-nf4";
      set["blocksize"] = q.value("blocksize", int64_t{64});
      set["double_quant"] = q.value("double_quant", false);
    } else if (format == "int8") {
      plugin = "quant-int8";
    } else {
      throw ConfigError(adapter_file + ": layer '" + layer +
                        "' was trained against a base in format '" + format +
                        "', which merge-lora cannot rebuild; use --plain-base to merge into the "
                        "full-precision weight (a different model from the one trained)");
    }
    set["target_modules"] = std::vector<std::string>{"layer"};
    OneLinear model(W);
    create(plugin, set, layer)->convert(model);
    TR_CHECK(model.layer()->base(), plugin, " did not quantize layer '", layer, "'");
    return model.layer()->base()->dequantized_weight().to(at::kFloat);
  }

  std::unique_ptr<v1::Precision> create(const std::string& plugin,
                                        const std::map<std::string, v1::OptionValue>& set,
                                        const std::string& layer) {
    if (!registry_) {
      registry_ = std::make_unique<core::Registry>();
      registry_->load_search_path(core::Registry::search_path(plugin_paths_, {}));
    }
    const core::ComponentInfo& info = registry_->require(
        v1::ComponentKind::Precision, plugin, "merge-lora (the quantized base of '" + layer + "')");
    std::map<std::string, v1::OptionValue> values;
    for (const auto& spec : info.schema.specs()) values[spec.name] = spec.default_value;
    for (const auto& [k, v] : set) values[k] = v;
    v1::RunContext ctx;
    // As a run's non-lead rank: the plugin's banner line is a run's, and here would come once per
    // layer.
    ctx.rank = 1;
    ctx.world_size = 2;
    return registry_->create<v1::Precision>(info, v1::Options(values, "merge-lora " + plugin), ctx);
  }

  std::vector<std::string> plugin_paths_;
  std::unique_ptr<core::Registry> registry_;  // outlives every component it created
  int inexact_ = 0;
  std::string first_inexact_, inexact_file_;

  void warn_inexact(const std::string& command) const {
    if (inexact_ > 0)
      std::cerr << command << ": warning: " << inexact_ << " layer(s) (" << first_inexact_
                << (inexact_ > 1 ? ", ..." : "") << "): the NF4 block sizes recorded in "
                << inexact_file_ << " were inferred from weight sizes that do not fix them; the "
                << "recorded ones are used\n";
  }
};

TrainedBase::TrainedBase(std::vector<std::string> plugin_paths)
    : impl_(std::make_unique<Impl>(std::move(plugin_paths))) {}
TrainedBase::~TrainedBase() = default;
at::Tensor TrainedBase::operator()(const at::Tensor& W, const nlohmann::json& q,
                                   const std::string& layer, const std::string& adapter_file) {
  return impl_->rebuild(W, q, layer, adapter_file);
}
void TrainedBase::warn_inexact(const std::string& command) const { impl_->warn_inexact(command); }

nlohmann::json recorded_base_quantization(const std::map<std::string, std::string>& metadata,
                                          const std::string& adapter_file) {
  auto it = metadata.find("trainrun_base_quantization");
  if (it == metadata.end()) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(adapter_file +
                      ": metadata trainrun_base_quantization is not valid JSON: " + e.what());
  }
}

int run_merge_lora_command(int argc, char** argv) {
  std::string base, adapter, output, max_shard = "5GB";
  std::vector<std::string> plugin_paths;
  bool plain_base = false;
  po::options_description opts("trainrun merge-lora options");
  opts.add_options()("help,h", "show this help")(
      "base", po::value(&base),
      "full-precision base model: a safetensors file (trainrun names) or a "
      "Hugging Face model directory")(
      "adapter", po::value(&adapter),
      "adapter directory (adapter_config.json + adapter_model.safetensors)")(
      "output,o", po::value(&output),
      "merged model to write (safetensors file; a directory for an HF base)")(
      "max-shard-size", po::value(&max_shard),
      "HF output: largest weight file before sharding (default 5GB)")(
      "plain-base", po::bool_switch(&plain_base),
      "QLoRA adapters: add BA to the full-precision base weight instead of to the base as "
      "training quantized it (the default, which reproduces the trained model); the result is "
      "a different model")(
      "plugin-path", po::value(&plugin_paths)->composing(),
      "QLoRA adapters: where the quant plugin that rebuilds the base is (a directory or .so; "
      "repeatable; before TRAINRUN_PLUGIN_PATH and the install's plugin directory)");
  po::variables_map vm;
  if (const auto done = parse_command_line(
          argc, argv, "merge-lora",
          "usage: trainrun merge-lora --base HF_MODEL_DIR --adapter DIR --output MERGED_DIR "
          "[--plain-base] [--max-shard-size 5GB] [--plugin-path P]...\n"
          "       trainrun merge-lora --base model.safetensors --adapter DIR --output "
          "merged.safetensors [--plain-base] [--plugin-path P]...",
          opts, vm))
    return *done;
  if (base.empty() || adapter.empty() || output.empty()) {
    std::cerr << "trainrun merge-lora: error: --base, --adapter and --output are required\n" << opts << std::endl;
    return 2;
  }
  try {
    return merge(base, adapter, output, hf::parse_size(max_shard), plain_base, plugin_paths);
  } catch (...) {
    return command_failure<ConfigError>("merge-lora");
  }
}

}  // namespace trainrun::app
