// Loading a Hugging Face directory into the llama model (whole or by shard for the sharded
// strategies, v1::DeferredWeights) and writing <run_dir>/hf/ at the end of a run.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "llama.hpp"
#include "modules.hpp"
#include "trainrun/hf/model_dir.hpp"
#include "trainrun/log.hpp"
#include "trainrun/strategy/sharding.hpp"
#include "trainrun/text/tokenizer.hpp"

namespace trainrun::llama {

namespace fs = std::filesystem;
using namespace detail;

namespace {
// Bytes this process has read through read()/pread() so far (/proc/self/io rchar), -1 where
// the kernel does not say.
int64_t rchar_now() {
  std::ifstream io("/proc/self/io");
  std::string k;
  int64_t v = 0;
  while (io >> k >> v)
    if (k == "rchar:") return v;
  return -1;
}
// A /proc/self/status figure in bytes ("VmRSS", "VmHWM"), -1 where the kernel does not say.
int64_t status_bytes(const std::string& key) {
  std::ifstream st("/proc/self/status");
  std::string line;
  while (std::getline(st, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return -1;
}
}  // namespace

// Checks every parameter against the directory's safetensors headers (names, shapes, dtypes;
// nothing missing or unexpected), then either reads them now, one tensor at a time straight into
// the parameter (peak memory: the model plus its largest tensor in the file's dtype), or, with
// `defer`, leaves them without values for load_deferred_weights() or read_weight_range().
void LlamaModel::load(const std::string& dir, bool defer) {
  rss_at_build_ = status_bytes("VmRSS");
  md_ = std::make_unique<hf::ModelDir>(dir);
  hf::ModelDir& md = *md_;
  dir_ = fs::absolute(dir).lexically_normal().string();
  config_text_ = md.config_text();
  const std::string config_file = (fs::path(dir) / "config.json").string();
  cfg_ = LlamaConfig::from_json(config_text_, config_file);
  // [model] architecture: a score head on a causal LM's weights (TRL's RewardTrainer loads
  // AutoModelForSequenceClassification from one), never the reverse (there is no lm_head).
  TR_CHECK_TYPED(ConfigError, !(want_labels_ == 0 && cfg_.num_labels > 0), config_file,
                 ": a sequence-classification model (", cfg_.num_labels,
                 cfg_.num_labels == 1 ? " label" : " labels",
                 ") cannot be loaded as a causal LM: it has no lm_head");
  TR_CHECK_TYPED(ConfigError,
                 want_labels_ <= 0 || cfg_.num_labels == 0 || cfg_.num_labels == want_labels_,
                 config_file, ": the score head has ", cfg_.num_labels,
                 " labels, [model] num_labels ", want_labels_);
  const bool add_score = want_labels_ > 0 && cfg_.num_labels == 0;
  if (add_score) cfg_.num_labels = want_labels_;
  if (cfg_.num_labels > 0 && want_pad_ >= -1) cfg_.pad_token_id = want_pad_;
  if (cfg_.num_labels > 0 && cfg_.pad_token_id < 0 && want_pad_ == -2) {
    // As TRL sets config.pad_token_id: the tokenizer's pad token, else its EOS token.
    std::error_code ec;
    if (fs::is_regular_file(fs::path(dir) / "tokenizer.json", ec)) {
      const text::Tokenizer tok = text::Tokenizer::from_directory(dir);
      cfg_.pad_token_id = tok.pad_token_id().value_or(tok.eos_token_id().value_or(-1));
    }
  }
  build(defer);
  std::set<std::string> wanted;
  torch::NoGradGuard no_grad;
  for (auto& item : net_->named_parameters(true)) {
    const std::string& name = item.key();
    wanted.insert(name);
    if (add_score && name == "score.weight") {
      // transformers' _init_weights for a Linear: N(0, initializer_range), from the generator
      // the core seeded with [trainer] seed (the same on every rank).
      v1::sharding::refill_storage(item.value());
      item.value().normal_(0.0, cfg_.initializer_range);
      continue;
    }
    TR_CHECK_TYPED(ConfigError, md.contains(name), dir, ": tensor '", name,
                   "' is missing from the weights (", cfg_.model_type, " with ",
                   cfg_.num_hidden_layers, " layers", cfg_.qkv_bias ? ", q/k/v biases" : "",
                   cfg_.qk_norm ? ", q/k norms" : "",
                   cfg_.tie_word_embeddings ? ", tied embeddings" : "", ")");
    const hf::TensorEntry& e = md.entry(name);
    TR_CHECK_TYPED(ConfigError, c10::IntArrayRef(e.shape) == item.value().sizes(), md.file_of(name),
                   ": tensor '", name, "' has shape ", c10::IntArrayRef(e.shape),
                   ", config.json makes it ", item.value().sizes());
    TR_CHECK_TYPED(
        ConfigError, e.dtype == at::kFloat || e.dtype == at::kBFloat16 || e.dtype == at::kHalf,
        md.file_of(name), ": tensor '", name, "' is ", e.dtype, " (F32, BF16 or F16 expected)");
    deferred_[name] = item.value();
  }
  for (const auto& name : md.tensor_names()) {
    if (wanted.count(name)) continue;
    // Known non-weights: RoPE tables some exporters keep, and the output projection of a tied
    // model (the same matrix as embed_tokens).
    const bool inv_freq = name.size() > 9 && name.compare(name.size() - 9, 9, ".inv_freq") == 0;
    if (inv_freq || (cfg_.tie_word_embeddings && name == "lm_head.weight")) continue;
    if (add_score && name == "lm_head.weight") continue;  // the causal LM's head, not used
    TR_CHECK_TYPED(ConfigError, false, md.file_of(name), ": unexpected tensor '", name,
                   "' (not a parameter of ", cfg_.model_type, " as config.json describes it)");
  }
  if (!defer) load_deferred_weights();
}

bool LlamaModel::weight_deferred(const std::string& name) const {
  return deferred_.count(name) > 0;
}

void LlamaModel::read_weight_range(const std::string& name, int64_t offset, const at::Tensor& out) {
  auto it = deferred_.find(name);
  TR_CHECK(it != deferred_.end() && md_ != nullptr, "llama: read_weight_range: '", name,
           "' is not a parameter waiting for its values");
  const int64_t n = it->second.numel();
  TR_CHECK(offset >= 0 && offset + out.numel() <= n, "llama: read_weight_range: elements [", offset,
           ", ", offset + out.numel(), ") lie outside '", name, "' (", n, " elements)");
  if (rchar_start_ < 0) rchar_start_ = rchar_now();
  torch::NoGradGuard no_grad;
  at::Tensor part =
      out.numel() == n ? md_->read(name).reshape({-1}) : md_->read_range(name, offset, out.numel());
  bytes_read_ += static_cast<int64_t>(part.nbytes());
  ++ranges_read_;
  out.copy_(part);
  part = at::Tensor();
  give_back_free_memory();
}

void LlamaModel::load_deferred_weights() {
  if (deferred_.empty()) return;
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : deferred_) {
    v1::sharding::refill_storage(p);
    read_weight_range(name, 0, p.detach().view({-1}));
  }
  deferred_weights_loaded();
}

void LlamaModel::deferred_weights_loaded() {
  if (bytes_read_ > 0 && run_dir_.size() > 0) {
    const int64_t rchar = rchar_start_ >= 0 ? rchar_now() - rchar_start_ : -1;
    v1::Logger("llama", rank_)
        .info(v1::detail::cat("rank ", rank_, " read ", bytes_read_, " bytes of weights in ",
                              ranges_read_, " reads (", md_->total_bytes(), " in the files; ",
                              rchar, " bytes read by the process); RSS ", rss_at_build_,
                              " bytes before the model was built, peak ", status_bytes("VmHWM"),
                              " bytes now"));
  }
  deferred_.clear();
  md_.reset();
}

void LlamaModel::on_final_state_dict(const std::vector<v1::NamedTensor>& state) {
  if (!save_hf_ || rank_ != 0) return;
  // With adapters or a quantized base the HF directory would not be the trained model: the
  // adapter directory (lora) holds the result, and merge-lora makes an HF directory of it.
  std::set<std::string> params;
  for (const auto& p : net_->named_parameters(true)) params.insert(p.key());
  std::vector<v1::NamedTensor> weights;
  for (const auto& t : state) {
    if (t.name.find(".lora_") != std::string::npos) {
      v1::Logger("llama", rank_)
          .info(
              "<run_dir>/hf/ not written: the model carries LoRA adapters (see the adapter "
              "directory; `trainrun merge-lora --base BASE_DIR --adapter DIR --output OUT` merges "
              "them)");
      return;
    }
    if (t.name.find(".weight_") != std::string::npos) {
      v1::Logger("llama", rank_).info("<run_dir>/hf/ not written: the base weights are quantized");
      return;
    }
    // With expert parallelism this rank holds some experts; the state has all of them.
    if (params.count(t.name) ||
        (ep_group_ != nullptr && t.name.find(".experts.") != std::string::npos))
      weights.push_back(t);
  }
  const std::string dtype = save_dtype_ == "auto" ? cfg_.dtype : save_dtype_;
  const std::string out = (fs::path(run_dir_) / "hf").string();
  save_hf(out, weights, dtype, max_shard_bytes_);
  v1::Logger("llama", rank_)
      .info(v1::detail::cat("wrote ", out, " (", weights.size(), " tensors, ", dtype, ")"));
}

}  // namespace trainrun::llama
