#include "lora.hpp"

#include <trainrun/plugin.hpp>

#include <c10/core/GradMode.h>
#include <torch/nn/init.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <trainrun/log.hpp>

namespace trainrun::lora {

using namespace trainrun::v1;

namespace fs = std::filesystem;

double lora_scaling(int64_t r, double alpha, bool use_rslora) {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

LoraAdapter::LoraAdapter(int64_t in, int64_t out, int64_t r, double alpha, double dropout,
                         bool use_rslora)
    : dropout_(dropout), scaling_(lora_scaling(r, alpha, use_rslora)) {
  a_ = torch::nn::Linear(torch::nn::LinearOptions(in, r).bias(false));
  b_ = torch::nn::Linear(torch::nn::LinearOptions(r, out).bias(false));
  c10::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(a_->weight, std::sqrt(5.0));
  b_->weight.zero_();
}

at::Tensor LoraAdapter::forward(const at::Tensor& x, bool training) {
  if (!enabled_) return at::zeros({1, b_->weight.size(0)}, x.options());
  // Dropout draws no random numbers when it cannot change anything (as the models' dropout).
  const at::Tensor h = dropout_ > 0 && training ? at::dropout(x, dropout_, true) : x;
  const at::Tensor& a = a_->weight;
  return at::linear(at::linear(h.to(a.scalar_type()), a), b_->weight).mul(scaling_).to(x.scalar_type());
}

at::Tensor LoraAdapter::delta_weight() {
  c10::NoGradGuard no_grad;
  return at::matmul(b_->weight.to(at::kFloat), a_->weight.to(at::kFloat)).mul(scaling_);
}

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> LoraAdapter::modules() {
  return {{"lora_A", a_.ptr()}, {"lora_B", b_.ptr()}};
}

void write_safetensors_f32(const std::string& path, const std::vector<NamedTensor>& tensors,
                           const std::string& base_quantization) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  if (!base_quantization.empty()) header["__metadata__"]["trainrun_base_quantization"] = base_quantization;
  std::vector<at::Tensor> data;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    at::Tensor c = t.tensor.detach().to(at::kCPU).to(at::kFloat).contiguous();
    header[t.name] = {{"dtype", "F32"},
                      {"shape", c.sizes().vec()},
                      {"data_offsets", {offset, offset + static_cast<int64_t>(c.nbytes())}}};
    offset += static_cast<int64_t>(c.nbytes());
    data.push_back(c);
  }
  std::string text = header.dump();
  // The data starts 8-byte aligned: the header is padded with spaces, as safetensors does.
  text.append((8 - (text.size() % 8)) % 8, ' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TR_CHECK(f.is_open(), "lora: cannot write '", tmp, "': ", std::strerror(errno));
    const uint64_t n = text.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));  // little-endian
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& c : data)
      f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
    f.flush();
    TR_CHECK(f.good(), "lora: writing '", tmp, "' failed: ", std::strerror(errno));
  }
  fs::rename(tmp, path);
}

void LoraCallback::declare_options(OptionSchema& s) {
  s.integer("r", 8, "rank of the adapters", 1, 1 << 16);
  s.real("lora_alpha", 8.0, "scaling numerator: the update is scaled by lora_alpha / r", 0.0);
  s.real("lora_dropout", 0.0, "dropout on the adapters' input while training", 0.0, 0.99);
  s.string_list("target_modules", {"all-linear"},
                "trainrun Linear layers to adapt: names (\"c_attn\") or globs (\"blocks.*.attn.*\"); "
                "\"all-linear\" = every one but an output layer lm_head");
  s.boolean("use_rslora", false, "rank-stabilised scaling lora_alpha / sqrt(r)");
  s.choice("bias", "none", {"none", "all", "lora_only"},
           "which biases train: none, every bias, or the adapted layers' biases");
  s.string_list("modules_to_save", {},
                "modules trained whole and saved beside the adapters (PEFT's modules_to_save, "
                "matched as target_modules are); a sequence-classification model (task SEQ_CLS, "
                "llama with architecture = \"sequence_classification\") adds its head \"score\" "
                "as PEFT adds \"classifier\" and \"score\"");
  s.boolean("save_adapter", true, "write the adapters in PEFT's layout at the end of training");
  s.string("adapter_dir", "adapter", "directory for the adapter files, relative to run_dir");
}

LoraCallback::LoraCallback(const Options& o, const RunContext& ctx)
    : r_(o.get_int("r")),
      alpha_(o.get_double("lora_alpha")),
      dropout_(o.get_double("lora_dropout")),
      rslora_(o.get_bool("use_rslora")),
      save_(o.get_bool("save_adapter")),
      bias_(o.get_string("bias")),
      adapter_dir_(o.get_string("adapter_dir")),
      run_dir_(ctx.run_dir),
      targets_(o.get_string_list("target_modules")),
      rank_(ctx.rank) {
  TR_CHECK_TYPED(ConfigError, !targets_.empty(), o.context(), ": target_modules is empty");
  modules_to_save_ = o.get_string_list("modules_to_save");
  TR_CHECK_TYPED(ConfigError, !adapter_dir_.empty(), o.context(), ": adapter_dir is empty");
}

// The quantization of a layer's frozen base, from its format and the shapes of its frozen
// state (names as the quant plugin registers them: weight_nf4, weight_absmax or
// weight_absmax_q + weight_absmax2): blocks = ceil(numel / blocksize). Block sizes are powers of
// two (bitsandbytes' 64..4096, quant-nf4's dq blocks of 256), and at most one power of two
// gives a block count of two or more (the sizes that do lie in [ceil(n / k), floor((n - 1) /
// (k - 1))], narrower than a factor of 2), so the recorded size is exact whenever one does; a
// single block is the same quantization at any size that covers it. Otherwise the smallest
// (even) size giving that count is recorded and "blocksize_exact" says so.
static nlohmann::ordered_json describe_quantized_base(LinearImpl& layer, LinearBase& base) {
  nlohmann::ordered_json q;
  const std::string format = base.format();
  q["format"] = format;
  if (format.rfind("nf4", 0) != 0) return q;
  std::map<std::string, at::Tensor> state;
  for (const auto& p : layer.named_parameters(/*recurse=*/false)) state[p.key()] = p.value();
  for (const auto& p : layer.named_buffers(/*recurse=*/false)) state[p.key()] = p.value();
  const int64_t n = layer.options.in_features() * layer.options.out_features();
  auto size_for = [](int64_t count, int64_t blocks, bool* exact, bool even) {
    const int64_t lo = (count + blocks - 1) / blocks;
    for (int64_t p2 = 1; p2 <= (int64_t{1} << 40); p2 *= 2)
      if (p2 >= lo && (blocks == 1 || p2 <= (count - 1) / (blocks - 1)) && (!even || p2 % 2 == 0)) {
        *exact = true;
        return p2;
      }
    *exact = false;
    return even && lo % 2 ? lo + 1 : lo;
  };
  const bool dq = state.count("weight_absmax_q") > 0;
  const at::Tensor absmax = dq ? state["weight_absmax_q"] : state["weight_absmax"];
  TR_CHECK(absmax.defined(), "callback 'lora': the ", format, " base has no absmax state");
  bool exact = true, exact2 = true;
  q["blocksize"] = size_for(n, absmax.numel(), &exact, true);
  q["double_quant"] = dq;
  if (dq && state.count("weight_absmax2"))
    q["dq_blocksize"] = size_for(absmax.numel(), state["weight_absmax2"].numel(), &exact2, false);
  q["blocksize_exact"] = exact && exact2;
  return q;
}

void LoraCallback::on_setup(Model& model, const RunContext&) {
  TR_CHECK(adapters_.empty(), "callback 'lora': on_setup called twice");
  // A model with HF names says what PEFT should call the base and the task.
  if (const auto* hf = dynamic_cast<const HfModelSource*>(&model)) {
    base_model_ = hf->hf_model_dir();
    task_type_ = hf->hf_task_type();
  }
  // PeftModelForSequenceClassification: the classification heads train whole.
  if (task_type_ == "SEQ_CLS")
    for (const char* head : {"classifier", "score"}) modules_to_save_.push_back(head);
  // Layers trained whole are never adapted (PEFT guards target matching against them).
  const auto layers = find_linear_layers(model, targets_, modules_to_save_, "callback 'lora'");
  // PEFT: freeze the whole base model, then add trainable adapters.
  for (auto& p : model.named_parameters()) p.tensor.requires_grad_(false);
  std::set<const void*> adapted_bias;
  for (const auto& [name, layer] : layers) {
    auto adapter = std::make_shared<LoraAdapter>(layer->options.in_features(),
                                                 layer->options.out_features(), r_, alpha_,
                                                 dropout_, rslora_);
    layer->add_adapter(adapter);
    adapters_.push_back({name, adapter});
    if (auto base = layer->base()) base_quantization_[name] = describe_quantized_base(*layer, *base);
    if (layer->bias.defined()) adapted_bias.insert(layer->bias.unsafeGetTensorImpl());
  }
  // modules_to_save: every parameter under a matching module trains and is saved whole.
  if (!modules_to_save_.empty())
    for (auto& p : model.named_parameters()) {
      const size_t dot = p.name.rfind('.');
      if (dot == std::string::npos ||
          !v1::module_name_matches(p.name.substr(0, dot), modules_to_save_))
        continue;
      p.tensor.requires_grad_(true);
      saved_whole_.push_back(p);
    }
  for (auto& p : model.named_parameters()) {
    const bool is_bias = p.name == "bias" ||
                         (p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0);
    if (!is_bias || bias_ == "none") continue;
    if (bias_ == "all" || adapted_bias.count(p.tensor.unsafeGetTensorImpl())) {
      p.tensor.requires_grad_(true);
      biases_.push_back(p);
    }
  }
  // A quantized weight's packed storage and quantization state are frozen parameters of its
  // layer: count the weight's elements from the layer's shape instead, as PEFT's
  // print_trainable_parameters counts a 4-bit weight's elements.
  std::set<const void*> quant_state;
  int64_t quantized = 0;
  if (torch::nn::Module* root = model.module())
    for (const auto& item : root->named_modules("", false))
      if (auto l = std::dynamic_pointer_cast<LinearImpl>(item.value()); l && l->base()) {
        quantized += l->options.in_features() * l->options.out_features();
        for (const auto& q : l->named_parameters(/*recurse=*/false))
          if (q.key() != "bias") quant_state.insert(q.value().unsafeGetTensorImpl());
      }
  total_ = quantized;
  trainable_ = 0;
  for (const auto& p : model.named_parameters()) {
    if (quant_state.count(p.tensor.unsafeGetTensorImpl())) continue;
    total_ += p.tensor.numel();
    if (p.tensor.requires_grad()) trainable_ += p.tensor.numel();
  }
  if (rank_ == 0) {
    std::ostringstream os;
    os.precision(4);
    os << "r " << r_ << ", alpha " << alpha_ << " (scaling " << lora_scaling(r_, alpha_, rslora_)
       << "), " << adapters_.size() << " layer(s) (" << adapters_.front().first
       << (adapters_.size() > 1 ? ", ..." : "") << "), bias " << bias_ << ": trainable "
       << trainable_ << " of " << total_ << " parameters ("
       << 100.0 * static_cast<double>(trainable_) / static_cast<double>(total_) << "%)";
    v1::Logger("lora", rank_).info(os.str());
  }
}

void LoraCallback::save(const std::string& dir, const std::map<std::string, at::Tensor>& state) const {
  fs::create_directories(dir);
  // From the gathered final state when the core gave one (any strategy), else the live layers.
  auto get = [&](const std::string& n, const at::Tensor& live) {
    if (state.empty()) return live;
    auto it = state.find(n);
    TR_CHECK(it != state.end(), "callback 'lora': the final state dict has no '", n, "'");
    return it->second;
  };
  std::vector<NamedTensor> tensors;
  nlohmann::ordered_json targets = nlohmann::json::array();
  for (const auto& [name, a] : adapters_) {
    // Without the gathered state, live parameters that a sharding strategy made pieces of flat
    // parameters cannot be saved.
    TR_CHECK(!state.empty() || (a->A().dim() == 2 && a->B().dim() == 2 && a->A().size(0) == r_ &&
                                a->B().size(1) == r_),
             "callback 'lora': the adapter of '", name, "' is not whole on this rank (A ",
             a->A().sizes(), ", B ", a->B().sizes(), "): the strategy shards it and gave no "
             "full state dict");
    tensors.push_back({"base_model.model." + name + ".lora_A.weight", get(name + ".lora_A.weight", a->A())});
    tensors.push_back({"base_model.model." + name + ".lora_B.weight", get(name + ".lora_B.weight", a->B())});
    targets.push_back(name);
  }
  for (const auto& b : biases_) tensors.push_back({"base_model.model." + b.name, get(b.name, b.tensor)});
  // PEFT saves a ModulesToSaveWrapper's copy under the module's own name.
  for (const auto& m : saved_whole_)
    tensors.push_back({"base_model.model." + m.name, get(m.name, m.tensor)});
  write_safetensors_f32((fs::path(dir) / "adapter_model.safetensors").string(), tensors,
                        base_quantization_.empty() ? std::string() : base_quantization_.dump());
  // PEFT's LoraConfig keys (peft/tuners/lora/config.py); target_modules lists the adapted
  // layers' full paths, which PEFT matches exactly.
  nlohmann::ordered_json c;
  c["alpha_pattern"] = nlohmann::json::object();
  c["base_model_name_or_path"] = base_model_.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(base_model_);
  c["bias"] = bias_;
  c["fan_in_fan_out"] = false;
  c["inference_mode"] = true;
  c["init_lora_weights"] = true;
  c["layers_pattern"] = nullptr;
  c["layers_to_transform"] = nullptr;
  c["lora_alpha"] = alpha_;
  c["lora_dropout"] = dropout_;
  c["modules_to_save"] = modules_to_save_.empty() ? nlohmann::ordered_json(nullptr)
                                                  : nlohmann::ordered_json(modules_to_save_);
  c["peft_type"] = "LORA";
  c["r"] = r_;
  c["rank_pattern"] = nlohmann::json::object();
  c["revision"] = nullptr;
  c["target_modules"] = targets;
  c["task_type"] = task_type_.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(task_type_);
  c["use_dora"] = false;
  c["use_rslora"] = rslora_;
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  std::ofstream f(path + ".tmp");
  f << c.dump(2) << "\n";
  f.close();
  TR_CHECK(f.good(), "lora: writing '", path, "' failed");
  fs::rename(path + ".tmp", path);
}

void LoraCallback::on_final_state_dict(const std::vector<NamedTensor>& state) {
  if (!save_ || rank_ != 0 || adapters_.empty()) return;
  std::map<std::string, at::Tensor> by_name;
  for (const auto& t : state) by_name[t.name] = t.tensor;
  const std::string dir = (fs::path(run_dir_) / adapter_dir_).string();
  save(dir, by_name);
  saved_ = true;
  v1::Logger("lora", rank_)
      .info(v1::detail::cat("wrote ", dir, "/adapter_model.safetensors (",
                            2 * adapters_.size() + biases_.size() + saved_whole_.size(),
                            " tensors) and adapter_config.json"));
}

void LoraCallback::on_train_end(const TrainSummary& summary) {
  if (!save_ || rank_ != 0 || adapters_.empty() || summary.interrupted || saved_) return;
  const std::string dir = (fs::path(run_dir_) / adapter_dir_).string();
  save(dir);
  v1::Logger("lora", rank_)
      .info(v1::detail::cat("wrote ", dir, "/adapter_model.safetensors (",
                            2 * adapters_.size() + biases_.size() + saved_whole_.size(),
                            " tensors) and adapter_config.json"));
}

}  // namespace trainrun::lora
