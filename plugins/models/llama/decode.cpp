// Incremental decoding for the `llama` model (v1::IncrementalDecoder, trainrun/generation.hpp),
// on the modules of modules.hpp, but never through the training forward: a prefill of the
// prompt, then one token per call, each layer's keys (after RoPE) and values appended to a
// preallocated cache, as transformers' DynamicCache does in
// LlamaAttention.forward. The arithmetic is the training forward's, operation by operation, so
// the logits agree with the full forward's to rounding.
#include <torch/types.h>
#include <torch/utils.h>

#include <vector>

#include "llama.hpp"
#include "modules.hpp"
#include "trainrun/generation.hpp"

namespace trainrun::llama {

using namespace detail;

namespace {

// Keys and values of every layer, [B, num_key_value_heads, capacity, head_dim] each, of which
// the first `length` positions are filled.
class KvCache final : public v1::DecodeState {
 public:
  int64_t length() const override { return length_; }
  int64_t capacity() const override { return capacity_; }

  const void* owner = nullptr;
  int64_t batch = 0, length_ = 0, capacity_ = 0;
  std::vector<torch::Tensor> keys, values;
};

// A projection of the new tokens. One token at a time (the decode steps) on a dense weight
// goes through matrix-vector products: OpenBLAS 0.3.21's sgemm packs the whole weight on every
// call even for a single row, which made each step about twice as slow as transformers'.
// Anything else (a prompt, a quantized base, unmerged adapters) is the layer's own forward.
torch::Tensor project(v1::LinearImpl& l, const torch::Tensor& x) {
  if (x.numel() != x.size(-1) || l.base() || !l.adapters().empty() || !l.weight.defined() ||
      l.weight.scalar_type() != x.scalar_type())
    return l.forward(x);
  torch::Tensor y = torch::mv(l.weight, x.reshape({-1}));
  if (l.bias.defined()) y = y + l.bias;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = y.size(0);
  return y.view(shape);
}

// Scaled dot-product attention: q [B, nh, Tq, hd] over k, v [B, nkv, Tk, hd] (grouped-query:
// each key/value head serves nh / nkv consecutive query heads), `masked` bool [Tq, Tk] true
// where a query must not see a key (undefined: sees all) -> [B, nh, Tq, hd]. Softmax in float32
// on 1.13 as transformers' eager path; the SDK's attention() (SDPA on LibTorch >= 2.1).
torch::Tensor decode_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v,
                               const torch::Tensor& masked) {
  v1::AttentionOptions o;
  o.causal = false;  // `masked` holds the causal (and sliding-window) mask already
  if (masked.defined()) o.mask = masked.logical_not();
  return v1::attention(q, k, v, o);
}

// One decoder layer on the new tokens x [B, T, hidden] at positions past .. past + T - 1.
torch::Tensor decode_layer(DecoderLayerImpl& layer, const LlamaConfig& c, const torch::Tensor& x,
                           const torch::Tensor& cos, const torch::Tensor& sin,
                           const torch::Tensor& masked, torch::Tensor& cache_k,
                           torch::Tensor& cache_v, int64_t past) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  AttentionImpl& a = *layer.self_attn;
  const torch::Tensor h = layer.input_layernorm->forward(x);
  torch::Tensor q = project(*a.q_proj, h).view({B, T, nh, hd});
  torch::Tensor k = project(*a.k_proj, h).view({B, T, nkv, hd});
  torch::Tensor v = project(*a.v_proj, h).view({B, T, nkv, hd}).transpose(1, 2);
  if (a.q_norm) q = a.q_norm->forward(q), k = a.k_norm->forward(k);
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  const torch::Tensor cs = cos.to(q.scalar_type()), sn = sin.to(q.scalar_type());
  q = q * cs + rotate_half(q) * sn;
  k = k * cs + rotate_half(k) * sn;
  cache_k.narrow(2, past, T).copy_(k);
  cache_v.narrow(2, past, T).copy_(v);
  torch::Tensor y =
      decode_attention(q, cache_k.narrow(2, 0, past + T), cache_v.narrow(2, 0, past + T), masked);
  y = project(*a.o_proj, y.transpose(1, 2).reshape({B, T, nh * hd}));
  const torch::Tensor r = x + y;
  MlpImpl& m = *layer.mlp;
  const torch::Tensor hm = layer.post_attention_layernorm->forward(r);
  // SwiGLU as MlpImpl::forward computes it.
  return r +
         project(*m.down_proj, torch::silu(project(*m.gate_proj, hm)) * project(*m.up_proj, hm));
}

}  // namespace

std::unique_ptr<v1::DecodeState> LlamaModel::new_decode_state(int64_t batch_size,
                                                              int64_t max_length) {
  TR_CHECK(cfg_.num_labels == 0,
           "llama: a sequence-classification model (score head) scores text and does not "
           "generate it: use `trainrun score`");
  TR_CHECK(batch_size > 0 && max_length > 0,
           "llama: a KV cache needs a positive batch size and length, got ", batch_size, " and ",
           max_length);
  auto& net = net_of(net_);
  const torch::Tensor& w = net.model->embed_tokens->weight;
  auto cache = std::make_unique<KvCache>();
  cache->owner = this;
  cache->batch = batch_size;
  cache->capacity_ = max_length;
  const auto opts = torch::TensorOptions().dtype(w.scalar_type()).device(w.device());
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
    cache->keys.push_back(
        torch::zeros({batch_size, cfg_.num_key_value_heads, max_length, cfg_.head_dim}, opts));
    cache->values.push_back(
        torch::zeros({batch_size, cfg_.num_key_value_heads, max_length, cfg_.head_dim}, opts));
  }
  return cache;
}

at::Tensor LlamaModel::decode(const at::Tensor& ids, v1::DecodeState& state) {
  auto* cache = dynamic_cast<KvCache*>(&state);
  TR_CHECK(cache && cache->owner == this,
           "llama: decode() was given a cache this model did not make");
  TR_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong,
           "llama: decode() needs int64 token ids [B, T], got ", ids.scalar_type(), " ",
           ids.sizes());
  const int64_t B = ids.size(0), T = ids.size(1), past = cache->length_;
  TR_CHECK(B == cache->batch, "llama: decode() got ", B, " sequences for a cache of ",
           cache->batch);
  TR_CHECK(T > 0 && past + T <= cache->capacity_, "llama: decode() of ", T, " tokens after ", past,
           " overflows the cache (", cache->capacity_, " tokens)");
  torch::NoGradGuard no_grad;
  auto& net = net_of(net_);
  const c10::Device dev = net.model->embed_tokens->weight.device();
  const torch::Tensor input = ids.to(dev);
  // cos/sin in float32 for positions past .. past + T - 1, as the full forward computes them.
  const torch::Tensor pos =
      torch::arange(past, past + T, torch::TensorOptions().dtype(torch::kFloat).device(dev));
  const torch::Tensor freqs = torch::outer(pos, net.inv_freq.to(dev));
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  const torch::Tensor cos = emb.cos(), sin = emb.sin();
  // Query i (absolute position) must not see key j when j > i, or i - j >= sliding_window.
  torch::Tensor masked;
  {
    const auto lopts = torch::TensorOptions().dtype(torch::kLong).device(dev);
    const torch::Tensor i = torch::arange(past, past + T, lopts).unsqueeze(1);
    const torch::Tensor j = torch::arange(0, past + T, lopts).unsqueeze(0);
    torch::Tensor m = j > i;
    if (cfg_.sliding_window > 0) m = m | ((i - j) >= cfg_.sliding_window);
    if (m.any().item<bool>()) masked = m;
  }
  torch::Tensor x = net.model->embed_tokens->forward(input);
  for (size_t l = 0; l < net.model->layer_ptrs.size(); ++l)
    x = decode_layer(*net.model->layer_ptrs[l], cfg_, x, cos, sin, masked, cache->keys[l],
                     cache->values[l], past);
  x = net.model->norm->forward(x);
  cache->length_ = past + T;
  torch::Tensor logits;
  if (!cfg_.tie_word_embeddings)
    logits = project(*net.lm_head, x);
  else if (x.numel() == x.size(-1))
    logits = torch::mv(net.model->embed_tokens->weight, x.reshape({-1})).view({B, T, -1});
  else
    logits = torch::linear(x, net.model->embed_tokens->weight);
  return logits.to(torch::kFloat);
}

}  // namespace trainrun::llama
