// Incremental decoding for the `llama` model (v1::IncrementalDecoder, trainrun/generation.hpp),
// on the modules of modules.hpp, but never through the training forward: a prefill of the
// prompt, then one token per call, each layer's keys (after RoPE) and values appended to a
// preallocated cache, as transformers' DynamicCache does in
// LlamaAttention.forward. The arithmetic is the training forward's, operation by operation, so
// the logits agree with the full forward's to rounding. decode_padded() runs a left-padded batch
// of rows of different lengths as transformers' generate(input_ids, attention_mask) does.
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <vector>

#include "llama.hpp"
#include "modules.hpp"
#include "small_batch_linear.hpp"
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
  /// longrope only: the token ids of every slot so far [B, capacity], and whether the cached
  /// keys were rotated with the long factors.
  torch::Tensor ids;
  bool long_keys = false;
};

// x [..., K] times a dense weight [N, K] transposed, for the decode steps: one row through a
// matrix-vector product, up to 2 x kSmallBatchRows rows (a small batch) through
// small_batch_linear: OpenBLAS 0.3.21's sgemm packs the whole weight on every call, which made
// each step about twice as slow as transformers' (1 row) and 1.8 times (8 rows). Undefined when
// neither applies (a prompt, another dtype or device).
torch::Tensor few_rows_linear(const torch::Tensor& x, const torch::Tensor& w) {
  const int64_t rows = x.numel() / x.size(-1);
  if (w.scalar_type() != x.scalar_type()) return {};
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  if (rows == 1) return torch::mv(w, x.reshape({-1})).view(shape);
  if (rows <= 2 * kSmallBatchRows && x.scalar_type() == torch::kFloat && x.device().is_cpu() &&
      w.device().is_cpu() && small_batch_linear_available())
    return small_batch_linear(x, w);
  return {};
}

// A projection of the new tokens: few_rows_linear on a dense weight, else (a prompt, a quantized
// base, unmerged adapters) the layer's own forward.
torch::Tensor project(v1::LinearImpl& l, const torch::Tensor& x) {
  if (l.base() || !l.adapters().empty() || !l.weight.defined()) return l.forward(x);
  torch::Tensor y = few_rows_linear(x, l.weight);
  if (!y.defined()) return l.forward(x);
  return l.bias.defined() ? y + l.bias : y;
}

// Scaled dot-product attention: q [B, nh, Tq, hd] over k, v [B, nkv, Tk, hd] (grouped-query:
// each key/value head serves nh / nkv consecutive query heads), `masked` bool broadcastable to
// [B, 1, Tq, Tk], true where a query must not see a key (undefined: sees all) -> [B, nh, Tq, hd];
// scale and soft-capping from `o`. A single query per row (a decode step) groups the query heads
// of each key/value head into one product over the cache, as the SDK's attention_math computes
// it (scores in q's dtype, softmax in float32) but without copying the keys and values once per
// query head (repeat_kv), which at 8 rows cost as much as the attention itself. Otherwise the
// SDK's attention().
torch::Tensor decode_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v,
                               const torch::Tensor& masked, v1::AttentionOptions o) {
  const int64_t B = q.size(0), nh = q.size(1), nkv = k.size(1), hd = q.size(3);
  if (q.size(2) == 1 && nh % nkv == 0) {
    const torch::Tensor qg = q.reshape({B, nkv, nh / nkv, hd});
    torch::Tensor att = torch::matmul(qg, k.transpose(-2, -1)) * o.scale.value();
    if (o.softcap) att = torch::tanh(att / *o.softcap) * *o.softcap;
    if (masked.defined())
      att = att.masked_fill(masked.view({masked.dim() == 4 ? B : 1, 1, 1, -1}),
                            -std::numeric_limits<float>::infinity());
    att = torch::softmax(att, -1, torch::kFloat).to(q.scalar_type());
    return torch::matmul(att, v).view({B, nh, 1, hd});
  }
  if (masked.defined()) o.mask = masked.logical_not();
  return v1::attention(q, k, v, o);
}

// One decoder layer on the new tokens x [B, T, hidden] at positions past .. past + T - 1, with
// the layer kind's cos/sin [T, rot] or [B, 1, T, rot] and mask.
torch::Tensor decode_layer(DecoderLayerImpl& layer, const LlamaConfig& c, const torch::Tensor& x,
                           const torch::Tensor& cos, const torch::Tensor& sin,
                           const torch::Tensor& masked, torch::Tensor& cache_k,
                           torch::Tensor& cache_v, int64_t past) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  AttentionImpl& a = *layer.self_attn;
  const torch::Tensor h = layer.input_layernorm->forward(x);
  const std::vector<torch::Tensor> qkv = a.qkv(h, project);
  torch::Tensor q = qkv[0].view({B, T, nh, hd});
  torch::Tensor k = qkv[1].view({B, T, nkv, hd});
  torch::Tensor v = qkv[2].view({B, T, nkv, hd}).transpose(1, 2);
  if (a.q_norm) q = a.q_norm->forward(q), k = a.k_norm->forward(k);
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  const torch::Tensor cs = cos.to(q.scalar_type()), sn = sin.to(q.scalar_type());
  q = apply_rope(q, cs, sn);
  k = apply_rope(k, cs, sn);
  cache_k.narrow(2, past, T).copy_(k);
  cache_v.narrow(2, past, T).copy_(v);
  torch::Tensor y = decode_attention(q, cache_k.narrow(2, 0, past + T),
                                     cache_v.narrow(2, 0, past + T), masked, a.options());
  y = project(*a.o_proj, y.transpose(1, 2).reshape({B, T, nh * hd}));
  // The residuals and the MLP as the training layer computes them.
  return layer.mlp_residual(x, y, [&](const torch::Tensor& t) {
    return layer.moe ? layer.moe->forward_with(t, project) : layer.mlp->forward_with(t, project);
  });
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
  if (cfg_.rope.type == "longrope")
    cache->ids = torch::zeros({batch_size, max_length}, opts.dtype(torch::kLong));
  return cache;
}

void LlamaModel::repeat_rows(v1::DecodeState& state, int64_t repeats) {
  auto* cache = dynamic_cast<KvCache*>(&state);
  TR_CHECK(cache && cache->owner == this,
           "llama: repeat_rows() was given a cache this model did not make");
  TR_CHECK(repeats >= 1, "llama: repeat_rows() needs repeats >= 1, got ", repeats);
  if (repeats == 1) return;
  for (auto* list : {&cache->keys, &cache->values})
    for (auto& t : *list) t = t.repeat_interleave(repeats, 0);
  if (cache->ids.defined()) cache->ids = cache->ids.repeat_interleave(repeats, 0);
  cache->batch *= repeats;
}

// The shared body of decode() and decode_padded(): `real` int64 [B, past + T] (1 = a real
// token) or undefined (every slot real, the same positions for every row).
at::Tensor LlamaModel::decode_rows(const at::Tensor& ids, const at::Tensor& real,
                                   v1::DecodeState& state, int64_t keep) {
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
  TR_CHECK(!real.defined() || (real.dim() == 2 && real.size(0) == B && real.size(1) == past + T),
           "llama: decode_padded() needs an attention mask [", B, ", ", past + T, "], got ",
           real.sizes());
  TR_CHECK(keep >= 0 && keep <= T, "llama: decode_padded_last() keeps ", keep, " of ", T,
           " new slots' logits");
  torch::NoGradGuard no_grad;
  auto& net = net_of(net_);
  const c10::Device dev = net.model->embed_tokens->weight.device();
  const torch::Tensor input = ids.to(dev);
  const auto lopts = torch::TensorOptions().dtype(torch::kLong).device(dev);
  // Slots: query i sits at slot past + i; key j at slot j.
  const torch::Tensor i = torch::arange(past, past + T, lopts).unsqueeze(1);
  const torch::Tensor j = torch::arange(0, past + T, lopts).unsqueeze(0);
  // cos/sin in float32, as the full forward computes them: [T, rot] at positions past .. past +
  // T - 1, or [B, 1, T, rot] at each row's count of real tokens before the slot (transformers'
  // position_ids = attention_mask.cumsum(-1) - 1 for a left-padded batch).
  torch::Tensor pos;
  torch::Tensor mask = real.defined() ? real.to(dev).to(torch::kLong) : torch::Tensor();
  if (mask.defined())
    pos = (mask.cumsum(1) - 1).clamp_min(0).narrow(1, past, T).to(torch::kFloat).unsqueeze(-1);
  else
    pos = torch::arange(past, past + T, torch::TensorOptions().dtype(torch::kFloat).device(dev))
              .unsqueeze(-1);
  if (cache->ids.defined()) {
    cache->ids.narrow(1, past, T).copy_(input);
    const bool long_now = pos.max().item<double>() + 1 >
                          static_cast<double>(cfg_.rope.original_max_position_embeddings);
    if (long_now && !cache->long_keys && past > 0) {
      // The cached keys were rotated with longrope's short factors; from here on transformers'
      // Phi-3 computes with the long ones and drops its cache when the sequence first passes the
      // pretraining context (Phi3ForCausalLM.prepare_inputs_for_generation): every slot again,
      // as one prefill, so that generation goes on as the full forward would.
      cache->length_ = 0;
      cache->long_keys = true;
      const at::Tensor all =
          decode_rows(cache->ids.narrow(1, 0, past + T).clone(), real, state, keep > 0 ? keep : T);
      return keep > 0 ? all : all.narrow(1, all.size(1) - T, T);
    }
    cache->long_keys = long_now;
  }
  // Per kind of layer (full attention, sliding window): RoPE tables and the mask. Query i must
  // not see key j when j > i, or i - j >= sliding_window (slot distance: a row's padding all
  // comes first, so it equals the position distance between its real tokens), or when j is
  // padding. A padding query sees itself, so that no softmax row is empty (NaN).
  struct Kind {
    torch::Tensor cos, sin, masked;
  } kinds[2];
  for (int kind = 0; kind < 2; ++kind) {
    if (!cfg_.has_layer_kind(kind == 1)) continue;
    auto [c, s] = net.rope_cos_sin(pos, kind == 1);
    if (mask.defined()) c = c.unsqueeze(1), s = s.unsqueeze(1);
    torch::Tensor m = j > i;
    if (kind == 1 && cfg_.sliding_window > 0) m = m | ((i - j) >= cfg_.sliding_window);
    torch::Tensor masked;
    if (mask.defined())
      masked = (m.unsqueeze(0) | (mask.unsqueeze(1) == 0)) & (i != j).unsqueeze(0);
    else if (m.any().item<bool>())
      masked = m;
    if (masked.defined() && masked.dim() == 3) masked = masked.unsqueeze(1);  // [B, 1, T, past+T]
    kinds[kind] = {c, s, masked};
  }
  torch::Tensor x = net.model->embed(input, cfg_.embed_scale);
  for (size_t l = 0; l < net.model->layer_ptrs.size(); ++l) {
    DecoderLayerImpl& layer = *net.model->layer_ptrs[l];
    const Kind& k = kinds[layer.sliding ? 1 : 0];
    x = decode_layer(layer, cfg_, x, k.cos, k.sin, k.masked, cache->keys[l], cache->values[l],
                     past);
  }
  if (keep > 0 && keep < T) x = x.narrow(1, T - keep, keep);
  x = net.model->norm->forward(x);
  cache->length_ = past + T;
  torch::Tensor logits;
  if (!cfg_.tie_word_embeddings)
    logits = project(*net.lm_head, x);
  else if (!(logits = few_rows_linear(x, net.model->embed_tokens->weight)).defined())
    logits = torch::linear(x, net.model->embed_tokens->weight);
  return net.softcap_logits(logits).to(torch::kFloat);
}

at::Tensor LlamaModel::decode(const at::Tensor& ids, v1::DecodeState& state) {
  return decode_rows(ids, at::Tensor(), state);
}

at::Tensor LlamaModel::decode_padded(const at::Tensor& ids, const at::Tensor& attention_mask,
                                     v1::DecodeState& state) {
  TR_CHECK(attention_mask.defined(), "llama: decode_padded() needs an attention mask");
  return decode_rows(ids, attention_mask, state);
}

at::Tensor LlamaModel::decode_padded_last(const at::Tensor& ids, const at::Tensor& attention_mask,
                                          v1::DecodeState& state, int64_t logits_to_keep) {
  TR_CHECK(attention_mask.defined(), "llama: decode_padded_last() needs an attention mask");
  TR_CHECK(logits_to_keep >= 1, "llama: decode_padded_last() keeps ", logits_to_keep,
           " slots' logits; at least 1");
  return decode_rows(ids, attention_mask, state, logits_to_keep);
}

}  // namespace trainrun::llama
