// Model components of the "models" plugin: mlp, cnn, gpt, torchscript.
//
// This file holds the components and their table (kComponents); plugin.cpp only defines the
// entry symbol from that table, so the unit tests can compile this file into an executable and
// create the components exactly as the host does.
#include <torch/csrc/jit/serialization/import.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/interfaces.hpp"
#include "trainrun/model/attention.hpp"
#include "trainrun/model/linear.hpp"
#include "trainrun/model/module_model.hpp"
#include "trainrun/model/packed_batch.hpp"
#include "trainrun/plugin.hpp"

namespace trainrun::models {

using v1::Batch;
using v1::DataInfo;
using v1::ModelOutput;
using v1::NamedTensor;
using v1::Options;
using v1::OptionSchema;
using v1::RunContext;

namespace {

// Dropout that draws no random numbers when it cannot change anything, so a run with
// dropout = 0 consumes the same RNG stream in training and evaluation.
torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  return (p > 0 && training) ? torch::dropout(x, p, /*train=*/true) : x;
}

void check_classification(const DataInfo& data, const char* model) {
  TR_CHECK(data.task.empty() || data.task == "classification", model,
           ": needs a classification dataset, but the dataset's task is '", data.task, "'");
  TR_CHECK(!data.sample_shape.empty(), model,
           ": the dataset reports no sample shape, so the input size is unknown");
  TR_CHECK(data.num_classes >= 2, model, ": the dataset reports ", data.num_classes,
           " classes; need at least 2");
}

// Shape check shared by the classifiers: a wrong input shape otherwise surfaces as a matmul
// size error deep inside LibTorch.
void check_input(const torch::Tensor& input, const std::vector<int64_t>& sample_shape,
                 const char* model) {
  bool ok = input.dim() == static_cast<int64_t>(sample_shape.size()) + 1;
  for (size_t d = 0; ok && d < sample_shape.size(); ++d)
    ok = input.size(static_cast<int64_t>(d) + 1) == sample_shape[d];
  if (ok) return;
  std::string expected = "[B";
  for (int64_t d : sample_shape) expected += ", " + std::to_string(d);
  TR_FAIL(model, ": input has shape ", input.sizes(), ", expected ", expected, "]");
}

}  // namespace

/// Models that expose their logits, for tests (and later tools) that need more than the loss.
class LogitsModel : public v1::ModuleModel {
 public:
  /// classification: [B, C] float; language modelling: [B, T, V] float.
  virtual torch::Tensor logits(const torch::Tensor& input) = 0;
};

/// Logits of a model from this plugin (mlp, cnn, gpt). Throws Error for any other model.
at::Tensor logits_of(v1::Model& model, const at::Tensor& input) {
  auto* m = dynamic_cast<LogitsModel*>(&model);
  TR_CHECK(m != nullptr, "logits_of: model does not come from the models plugin");
  return m->logits(input);
}

// =============================================================================================
// mlp

class MlpNet : public torch::nn::Module {
 public:
  MlpNet(int64_t in_features, const std::vector<int64_t>& hidden, int64_t classes, double dropout)
      : dropout_(dropout) {
    layers_ = register_module("layers", torch::nn::ModuleList());
    int64_t in = in_features;
    for (int64_t h : hidden) {
      layers_->push_back(v1::Linear(in, h));
      in = h;
    }
    layers_->push_back(v1::Linear(in, classes));
    for (const auto& m : *layers_) linears_.push_back(std::dynamic_pointer_cast<v1::LinearImpl>(m));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = x.flatten(1);
    for (size_t i = 0; i + 1 < linears_.size(); ++i)
      x = maybe_dropout(torch::relu(linears_[i]->forward(x)), dropout_, is_training());
    return linears_.back()->forward(x);
  }

 private:
  double dropout_;
  torch::nn::ModuleList layers_{nullptr};
  std::vector<std::shared_ptr<v1::LinearImpl>> linears_;
};

class Mlp final : public LogitsModel {
 public:
  static void declare_options(OptionSchema& s) {
    s.int_list("hidden", {256, 128}, "sizes of the hidden layers (ReLU after each)");
    s.real("dropout", 0.0, "dropout probability after each hidden layer", 0.0, 0.99);
  }

  Mlp(const Options& o, const RunContext& ctx) : data_(ctx.data) {
    check_classification(data_, "mlp");
    int64_t in = 1;
    for (int64_t d : data_.sample_shape) in *= d;
    hidden_ = o.get_int_list("hidden");
    for (int64_t h : hidden_)
      TR_CHECK(h > 0, o.context(), ": hidden sizes must be positive, got ", h);
    net_ = std::make_shared<MlpNet>(in, hidden_, data_.num_classes, o.get_double("dropout"));
    set_module(net_);
  }

  torch::Tensor logits(const torch::Tensor& input) override {
    check_input(input, data_.sample_shape, "mlp");
    return net_->forward(input);
  }
  ModelOutput forward(const Batch& b) override { return v1::cross_entropy_sum(logits(b.input), b.target); }
  std::string describe() const override {
    return v1::detail::cat("mlp: hidden ", c10::IntArrayRef(hidden_), ", ", data_.num_classes,
                           " classes");
  }

 private:
  DataInfo data_;
  std::vector<int64_t> hidden_;
  std::shared_ptr<MlpNet> net_;
};

// =============================================================================================
// cnn
//
// Each entry of `channels` is a 3x3 convolution (padding 1, so the size is kept) + ReLU + 2x2
// max-pool; then dropout, a hidden fully connected layer and the classifier. With the default
// [32, 64] a 28x28 image becomes 64x7x7. Padding before pooling keeps the second convolution at
// 14x14, about 6x cheaper than the unpadded 24x24 variant, for the same Fashion-MNIST accuracy.

class CnnNet : public torch::nn::Module {
 public:
  CnnNet(const std::vector<int64_t>& shape, const std::vector<int64_t>& channels, int64_t hidden,
         int64_t classes, double dropout)
      : dropout_(dropout) {
    convs_ = register_module("convs", torch::nn::ModuleList());
    int64_t c = shape[0], h = shape[1], w = shape[2];
    for (int64_t out : channels) {
      auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(c, out, 3).padding(1));
      convs_->push_back(conv);
      conv_ptrs_.push_back(conv.ptr());
      c = out;
      h /= 2;
      w /= 2;
    }
    TR_CHECK(h > 0 && w > 0, "cnn: a ", shape[1], "x", shape[2], " image is too small for ",
             channels.size(), " pooling stages");
    fc1_ = register_module("fc1", v1::Linear(c * h * w, hidden));
    fc2_ = register_module("fc2", v1::Linear(hidden, classes));
  }

  torch::Tensor forward(torch::Tensor x) {
    for (auto& conv : conv_ptrs_) x = torch::max_pool2d(torch::relu(conv->forward(x)), 2);
    x = maybe_dropout(x.flatten(1), dropout_, is_training());
    x = maybe_dropout(torch::relu(fc1_->forward(x)), dropout_, is_training());
    return fc2_->forward(x);
  }

 private:
  double dropout_;
  torch::nn::ModuleList convs_{nullptr};
  std::vector<std::shared_ptr<torch::nn::Conv2dImpl>> conv_ptrs_;
  v1::Linear fc1_{nullptr}, fc2_{nullptr};
};

class Cnn final : public LogitsModel {
 public:
  static void declare_options(OptionSchema& s) {
    s.int_list("channels", {32, 64}, "output channels of each conv3x3 + max-pool stage");
    s.integer("hidden", 128, "width of the fully connected hidden layer", 1);
    s.real("dropout", 0.25, "dropout probability after the conv stack and the hidden layer",
           0.0, 0.99);
  }

  Cnn(const Options& o, const RunContext& ctx) : data_(ctx.data) {
    check_classification(data_, "cnn");
    // [H, W] images are taken as one channel.
    shape_ = data_.sample_shape;
    if (shape_.size() == 2) shape_.insert(shape_.begin(), 1);
    TR_CHECK(shape_.size() == 3, "cnn: needs image samples [C, H, W] or [H, W], the dataset has ",
             c10::IntArrayRef(data_.sample_shape));
    channels_ = o.get_int_list("channels");
    TR_CHECK(!channels_.empty(), o.context(), ": channels must list at least one stage");
    for (int64_t c : channels_)
      TR_CHECK(c > 0, o.context(), ": channels must be positive, got ", c);
    net_ = std::make_shared<CnnNet>(shape_, channels_, o.get_int("hidden"), data_.num_classes,
                                    o.get_double("dropout"));
    set_module(net_);
  }

  torch::Tensor logits(const torch::Tensor& input) override {
    check_input(input, data_.sample_shape, "cnn");
    return net_->forward(input.reshape({input.size(0), shape_[0], shape_[1], shape_[2]}));
  }
  ModelOutput forward(const Batch& b) override { return v1::cross_entropy_sum(logits(b.input), b.target); }
  std::string describe() const override {
    return v1::detail::cat("cnn: channels ", c10::IntArrayRef(channels_), " on ",
                           c10::IntArrayRef(shape_), ", ", data_.num_classes, " classes");
  }

 private:
  DataInfo data_;
  std::vector<int64_t> shape_;
  std::vector<int64_t> channels_;
  std::shared_ptr<CnnNet> net_;
};

// =============================================================================================
// gpt: a decoder-only transformer after nanoGPT (Karpathy), itself GPT-2 without the weight
// file: pre-LayerNorm blocks, GELU MLP of width 4*n_embd, learned position embeddings, the
// token embedding reused as the output projection when tie_weights is on.

struct GptConfig {
  int64_t n_layer, n_head, n_embd, block_size, vocab_size;
  double dropout;
  bool bias, tie_weights;
};

// LayerNorm with an optional bias (torch::nn::LayerNorm has the bias or neither).
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t n, bool bias) : n_(n) {
    weight_ = register_parameter("weight", torch::ones({n}));
    if (bias) bias_ = register_parameter("bias", torch::zeros({n}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::layer_norm(x, {n_}, weight_,
                             bias_.defined() ? c10::optional<torch::Tensor>(bias_) : c10::nullopt,
                             1e-5);
  }

 private:
  int64_t n_;
  torch::Tensor weight_, bias_;
};
TORCH_MODULE(LayerNorm);

// Causal self-attention written as matmul + masked softmax (LibTorch 1.13 has no fused
// scaled_dot_product_attention). Query/key/value come from one projection c_attn.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& c)
      : n_head_(c.n_head), n_embd_(c.n_embd), dropout_(c.dropout) {
    c_attn_ = register_module(
        "c_attn", v1::Linear(torch::nn::LinearOptions(c.n_embd, 3 * c.n_embd).bias(c.bias)));
    c_proj_ = register_module(
        "c_proj", v1::Linear(torch::nn::LinearOptions(c.n_embd, c.n_embd).bias(c.bias)));
  }

  // x: [B, T, C], blocked: bool [T, T] or [B, 1, T, T] (v1::attention_blocked) -> [B, T, C]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& blocked) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hs = C / n_head_;
    auto qkv = c_attn_->forward(x).split(n_embd_, /*dim=*/2);
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_head_, hs}).transpose(1, 2); };
    torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);  // [B, nh, T, hs]
    torch::Tensor y = attention(q, k, v, blocked).transpose(1, 2).contiguous().view({B, T, C});
    return maybe_dropout(c_proj_->forward(y), dropout_, is_training());
  }

  // The attention itself, q/k/v [B, nh, T, hs] -> [B, nh, T, hs]: softmax(q k^T / sqrt(hs)) v
  // where not `blocked` (causal, and across the samples of a packed row); the SDK's attention(),
  // scaled_dot_product_attention on LibTorch >= 2.1, the same math spelled out on 1.13.
  torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& blocked) {
    v1::AttentionOptions o;
    o.causal = false;  // `blocked` holds the causal mask already
    o.mask = blocked.logical_not();
    o.dropout_p = dropout_;
    o.training = is_training();
    return v1::attention(q, k, v, o);
  }

 private:
  int64_t n_head_, n_embd_;
  double dropout_;
  v1::Linear c_attn_{nullptr}, c_proj_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class GptMlpImpl : public torch::nn::Module {
 public:
  explicit GptMlpImpl(const GptConfig& c) : dropout_(c.dropout) {
    c_fc_ = register_module(
        "c_fc", v1::Linear(torch::nn::LinearOptions(c.n_embd, 4 * c.n_embd).bias(c.bias)));
    c_proj_ = register_module(
        "c_proj", v1::Linear(torch::nn::LinearOptions(4 * c.n_embd, c.n_embd).bias(c.bias)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return maybe_dropout(c_proj_->forward(torch::gelu(c_fc_->forward(x))), dropout_, is_training());
  }

 private:
  double dropout_;
  v1::Linear c_fc_{nullptr}, c_proj_{nullptr};
};
TORCH_MODULE(GptMlp);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& c) {
    ln_1_ = register_module("ln_1", LayerNorm(c.n_embd, c.bias));
    attn_ = register_module("attn", CausalSelfAttention(c));
    ln_2_ = register_module("ln_2", LayerNorm(c.n_embd, c.bias));
    mlp_ = register_module("mlp", GptMlp(c));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& blocked) {
    x = x + attn_->forward(ln_1_->forward(x), blocked);
    return x + mlp_->forward(ln_2_->forward(x));
  }

 private:
  LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  GptMlp mlp_{nullptr};
};
TORCH_MODULE(Block);

class GptNet : public torch::nn::Module {
 public:
  explicit GptNet(const GptConfig& c) : cfg_(c) {
    wte_ = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
    wpe_ = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
    blocks_ = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) {
      Block b(c);
      blocks_->push_back(b);
      block_ptrs_.push_back(b.ptr());
    }
    ln_f_ = register_module("ln_f", LayerNorm(c.n_embd, c.bias));
    // Tied weights are not registered twice (see ModuleModel): logits reuse wte's matrix.
    if (!c.tie_weights)
      lm_head_ = register_module(
          "lm_head", v1::Linear(torch::nn::LinearOptions(c.n_embd, c.vocab_size).bias(false)));
    init_weights();
  }

  // GPT-2 initialisation: N(0, 0.02) for every matrix and embedding, zero biases, unit LayerNorm
  // gains; the projections that write into the residual stream (attn.c_proj, mlp.c_proj) get
  // 0.02/sqrt(2*n_layer) so the residual variance does not grow with depth.
  void init_weights() {
    torch::NoGradGuard no_grad;
    const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer));
    for (auto& item : named_parameters(/*recurse=*/true)) {
      const std::string& name = item.key();
      torch::Tensor& p = item.value();
      const bool ends_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
      if (p.dim() == 1) {
        if (ends_bias) p.zero_(); else p.fill_(1.0);
      } else if (name.size() >= 13 && name.compare(name.size() - 13, 13, "c_proj.weight") == 0) {
        p.normal_(0.0, resid_std);
      } else {
        p.normal_(0.0, 0.02);
      }
    }
  }

  const GptConfig& config() const { return cfg_; }
  const std::vector<std::shared_ptr<BlockImpl>>& blocks() const { return block_ptrs_; }

  // idx int64 [B, T], pos int64 [B, T] or [1, T] (positions within each sample).
  torch::Tensor embed(const torch::Tensor& idx, const torch::Tensor& pos) {
    return maybe_dropout(wte_->forward(idx) + wpe_->forward(pos), cfg_.dropout, is_training());
  }
  torch::Tensor head(const torch::Tensor& x) {
    torch::Tensor h = ln_f_->forward(x);
    return cfg_.tie_weights ? torch::linear(h, wte_->weight) : lm_head_->forward(h);
  }

 private:
  GptConfig cfg_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  std::vector<std::shared_ptr<BlockImpl>> block_ptrs_;
  LayerNorm ln_f_{nullptr};
  v1::Linear lm_head_{nullptr};
};

class Gpt final : public LogitsModel, public v1::BatchFieldsReaderBase {
 public:
  static void declare_options(OptionSchema& s) {
    s.integer("n_layer", 4, "number of transformer blocks", 1, 1024);
    s.integer("n_head", 4, "attention heads per block (must divide n_embd)", 1, 1024);
    s.integer("n_embd", 128, "embedding width", 1, 1 << 16);
    s.integer("block_size", 128, "maximum sequence length T (size of the position table)", 1,
              1 << 20);
    s.integer("vocab_size", 256, "vocabulary size; 0 = take it from the dataset", 0, 1 << 24);
    s.real("dropout", 0.0, "dropout probability (embeddings, attention, residual)", 0.0, 0.99);
    s.boolean("bias", true, "biases in the Linear and LayerNorm layers");
    s.boolean("tie_weights", true, "reuse the token embedding as the output projection");
  }

  Gpt(const Options& o, const RunContext& ctx) {
    const DataInfo& data = ctx.data;
    TR_CHECK(data.task.empty() || data.task == "language_modeling",
             "gpt: needs a language-modelling dataset, but the dataset's task is '", data.task, "'");
    GptConfig c{o.get_int("n_layer"), o.get_int("n_head"),  o.get_int("n_embd"),
                o.get_int("block_size"), o.get_int("vocab_size"), o.get_double("dropout"),
                o.get_bool("bias"), o.get_bool("tie_weights")};
    TR_CHECK(c.n_embd % c.n_head == 0, o.context(), ": n_embd (", c.n_embd,
             ") must be divisible by n_head (", c.n_head, ")");
    if (c.vocab_size == 0) {
      TR_CHECK(data.vocab_size > 0, o.context(),
               ": vocab_size = 0 takes the vocabulary from the dataset, which reports none");
      c.vocab_size = data.vocab_size;
    }
    TR_CHECK(data.vocab_size <= c.vocab_size, o.context(), ": vocab_size ", c.vocab_size,
             " is smaller than the dataset's vocabulary (", data.vocab_size,
             "); set vocab_size = 0 to use the dataset's");
    if (data.sample_shape.size() == 1)
      TR_CHECK(data.sample_shape[0] <= c.block_size, o.context(), ": the dataset's sequences have ",
               data.sample_shape[0], " tokens, more than block_size = ", c.block_size,
               "; give [data] and [model] the same block_size");
    net_ = std::make_shared<GptNet>(c);
    set_module(net_);
    for (int64_t i = 0; i < c.n_layer; ++i)
      units_.push_back(std::make_unique<v1::Unit>("blocks." + std::to_string(i),
                                                  net_->blocks()[static_cast<size_t>(i)]));
  }

  // input: int64 [B, T], T <= block_size -> logits [B, T, vocab_size]
  torch::Tensor logits(const torch::Tensor& idx) override {
    Batch b;
    b.input = idx;
    return logits(b);
  }
  // Honours the batch's position_ids (restarting per packed sample) and segment_ids (attention
  // never crosses samples).
  torch::Tensor logits(const Batch& batch) {
    const GptConfig& c = net_->config();
    const Batch f = fields_of(batch);
    const torch::Tensor& idx = f.input;
    TR_CHECK(idx.dim() == 2, "gpt: input must be token ids [B, T], got shape ", idx.sizes());
    TR_CHECK(idx.scalar_type() == torch::kLong, "gpt: input token ids must be int64, got ",
             idx.scalar_type());
    TR_CHECK(idx.size(1) <= c.block_size, "gpt: sequence length T = ", idx.size(1),
             " exceeds block_size = ", c.block_size);
    const int64_t B = idx.size(0), T = idx.size(1);
    const torch::Tensor pos = v1::positions_of(f, B, T, idx.device());
    TR_CHECK(!f.position_ids.defined() || T == 0 || pos.max().item<int64_t>() < c.block_size,
             "gpt: a position id exceeds block_size - 1 = ", c.block_size - 1);
    const torch::Tensor blocked = v1::attention_blocked(T, idx.device(), f.segment_ids);
    torch::Tensor x = net_->embed(idx, pos);
    const auto& blocks = net_->blocks();
    // The block is captured by value: with activation checkpointing the function runs again
    // during backward, after this frame is gone.
    for (size_t i = 0; i < blocks.size(); ++i)
      x = units_[i]->run(x, [block = blocks[i], blocked](const torch::Tensor& in) { return block->forward(in, blocked); });
    return net_->head(x);
  }
  ModelOutput forward(const Batch& b) override { return v1::cross_entropy_sum(logits(b), b.target); }

  std::vector<v1::Unit*> units() override {
    std::vector<v1::Unit*> out;
    for (auto& u : units_) out.push_back(u.get());
    return out;
  }

  std::string describe() const override {
    const GptConfig& c = net_->config();
    return v1::detail::cat("gpt: ", c.n_layer, " layers, ", c.n_head, " heads, n_embd ", c.n_embd,
                           ", block_size ", c.block_size, ", vocab ", c.vocab_size,
                           c.tie_weights ? ", tied embeddings" : "");
  }

 private:
  std::shared_ptr<GptNet> net_;
  std::vector<std::unique_ptr<v1::Unit>> units_;
};

// =============================================================================================
// torchscript: any module saved from Python with torch.jit.save, trained in place.

class TorchScript final : public v1::Model {
 public:
  static void declare_options(OptionSchema& s) {
    s.required_string("path", "file written by torch.jit.save; forward(input) returns logits "
                              "[B, C] (classification) or [B, T, V] (language modelling)");
  }

  TorchScript(const Options& o, const RunContext& ctx)
      : path_(o.get_string("path")), task_(ctx.data.task) {
    namespace fs = std::filesystem;
    std::error_code ec;
    TR_CHECK(fs::is_regular_file(path_, ec), o.context(), ": TorchScript file '", path_,
             "' does not exist or is not a regular file");
    try {
      module_ = torch::jit::load(path_, torch::Device(torch::kCPU));
    } catch (const c10::Error& e) {
      TR_FAIL(o.context(), ": '", path_,
              "' is not a TorchScript archive (save it with torch.jit.save): ",
              e.what_without_backtrace());
    }
    int64_t trainable = 0;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      TR_CHECK(p.value.scalar_type() == torch::kFloat, "torchscript: parameter '", p.name, "' of '",
               path_, "' is ", p.value.scalar_type(), "; save the module in float32");
      // requires_grad is kept as saved, so parameters frozen in Python stay frozen.
      if (p.value.requires_grad()) trainable += p.value.numel();
    }
    TR_CHECK(trainable > 0, "torchscript: '", path_, "' has no parameter with requires_grad");
  }

  std::vector<NamedTensor> named_parameters() override {
    std::vector<NamedTensor> out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) out.push_back({p.name, p.value});
    return out;
  }
  std::vector<NamedTensor> named_buffers() override {
    std::vector<NamedTensor> out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.push_back({b.name, b.value});
    return out;
  }
  void train(bool on) override { module_.train(on); }

  ModelOutput forward(const Batch& b) override {
    c10::IValue out = module_.forward({b.input});
    TR_CHECK(out.isTensor(), "torchscript: forward of '", path_, "' returned ", out.tagKind(),
             ", expected a logits tensor");
    torch::Tensor logits = out.toTensor();
    const bool lm = task_ == "language_modeling";
    TR_CHECK(logits.dim() == (lm ? 3 : 2), "torchscript: forward of '", path_,
             "' returned shape ", logits.sizes(), ", expected ",
             lm ? "[B, T, V] for language modelling" : "[B, C] for classification");
    return v1::cross_entropy_sum(logits, b.target);
  }

  std::string describe() const override {
    return "torchscript: " + path_;
  }

 private:
  std::string path_;
  std::string task_;
  torch::jit::Module module_;
};

/// The components of the "models" plugin, in the order `trainrun plugins` lists them.
extern const trainrun_component_v1 kComponents[] = {
    v1::component<v1::Model, Mlp>("mlp", "Multi-layer perceptron classifier (flattens the input)"),
    v1::component<v1::Model, Cnn>("cnn", "Small convolutional classifier for images such as 28x28 MNIST"),
    v1::component<v1::Model, Gpt>("gpt", "Decoder-only transformer language model (nanoGPT-style)"),
    v1::component<v1::Model, TorchScript>("torchscript", "A TorchScript module saved from Python, trained in place"),
};
static_assert(sizeof(kComponents) / sizeof(kComponents[0]) == 4,
              "plugin.cpp and the tests list the components by index");

}  // namespace trainrun::models
