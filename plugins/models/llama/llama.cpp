// Model `llama` (see llama.hpp). The forward follows transformers' modeling_llama.py (and
// modeling_qwen3.py for q_norm/k_norm, modeling_mistral.py for the sliding window) operation by
// operation, so fp32 logits agree with transformers' eager attention to rounding.
#include "llama.hpp"

#include <torch/types.h>
#include <torch/utils.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "trainrun/hf/model_dir.hpp"
#include "trainrun/log.hpp"
#include "trainrun/model/attention.hpp"
#include "trainrun/model/linear.hpp"
#include "trainrun/model/packed_batch.hpp"
#include "trainrun/plugin.hpp"
#include "trainrun/strategy/sharding.hpp"

namespace trainrun::llama {

namespace fs = std::filesystem;
using nlohmann::json;
using v1::ConfigError;

// =============================================================================================
// config.json

namespace {

const std::set<std::string> kModelTypes = {"llama", "mistral", "qwen2", "qwen3"};

const json* key(const json& j, const char* k) {
  auto it = j.find(k);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string dtype_name(const std::string& d) {
  // transformers writes "bfloat16"; older files may say "torch.bfloat16".
  return d.rfind("torch.", 0) == 0 ? d.substr(6) : d;
}

at::ScalarType scalar_type(const std::string& d, const std::string& where) {
  if (d == "float32") return at::kFloat;
  if (d == "bfloat16") return at::kBFloat16;
  if (d == "float16") return at::kHalf;
  TR_CHECK_TYPED(ConfigError, false, where, ": dtype '", d,
                 "' is not supported (float32, bfloat16, float16)");
  return at::kFloat;
}

}  // namespace

LlamaConfig LlamaConfig::from_json(const std::string& text, const std::string& src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError(src + ": not valid JSON: " + trainrun::v1::parse_error_text(e.what()));
  }
  TR_CHECK_TYPED(ConfigError, j.is_object(), src, ": not a JSON object");
  LlamaConfig c;
  auto get_int = [&](const char* k, int64_t def) -> int64_t {
    const json* v = key(j, k);
    if (!v) return def;
    TR_CHECK_TYPED(ConfigError, v->is_number_integer(), src, ": \"", k, "\" must be an integer, got ", v->dump());
    return v->get<int64_t>();
  };
  auto get_real = [&](const json& o, const char* k, double def) -> double {
    const json* v = key(o, k);
    if (!v) return def;
    TR_CHECK_TYPED(ConfigError, v->is_number(), src, ": \"", k, "\" must be a number, got ", v->dump());
    return v->get<double>();
  };
  auto get_bool = [&](const char* k, bool def) -> bool {
    const json* v = key(j, k);
    if (!v) return def;
    TR_CHECK_TYPED(ConfigError, v->is_boolean(), src, ": \"", k, "\" must be true or false, got ", v->dump());
    return v->get<bool>();
  };
  const json* mt = key(j, "model_type");
  TR_CHECK_TYPED(ConfigError, mt && mt->is_string(), src, ": no \"model_type\" (the llama plugin "
                 "reads model_type llama, mistral, qwen2, qwen3)");
  c.model_type = mt->get<std::string>();
  TR_CHECK_TYPED(ConfigError, kModelTypes.count(c.model_type), src, ": model_type \"", c.model_type,
                 "\" is not supported by the llama plugin (supported: llama, mistral, qwen2, qwen3)");
  if (const json* a = key(j, "architectures"); a && a->is_array())
    for (const auto& name : *a) {
      const std::string s = name.is_string() ? name.get<std::string>() : name.dump();
      TR_CHECK_TYPED(ConfigError, s.size() > 11 && s.compare(s.size() - 11, 11, "ForCausalLM") == 0,
                     src, ": architectures lists \"", s, "\"; the llama plugin builds *ForCausalLM "
                     "models (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)");
    }
  c.vocab_size = get_int("vocab_size", 32000);
  c.hidden_size = get_int("hidden_size", 4096);
  c.intermediate_size = get_int("intermediate_size", 11008);
  c.num_hidden_layers = get_int("num_hidden_layers", 32);
  c.num_attention_heads = get_int("num_attention_heads", 32);
  c.num_key_value_heads = get_int("num_key_value_heads", c.num_attention_heads);
  for (auto [k, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                      {"intermediate_size", c.intermediate_size}, {"num_hidden_layers", c.num_hidden_layers},
                      {"num_attention_heads", c.num_attention_heads},
                      {"num_key_value_heads", c.num_key_value_heads}})
    TR_CHECK_TYPED(ConfigError, v > 0, src, ": \"", k, "\" must be positive, got ", v);
  TR_CHECK_TYPED(ConfigError, c.num_attention_heads % c.num_key_value_heads == 0, src,
                 ": num_attention_heads (", c.num_attention_heads, ") must be a multiple of "
                 "num_key_value_heads (", c.num_key_value_heads, ")");
  c.head_dim = get_int("head_dim", c.hidden_size / c.num_attention_heads);
  TR_CHECK_TYPED(ConfigError, c.head_dim > 0 && c.head_dim % 2 == 0, src, ": head_dim must be even and positive, got ", c.head_dim);
  if (!key(j, "head_dim"))
    TR_CHECK_TYPED(ConfigError, c.hidden_size % c.num_attention_heads == 0, src, ": hidden_size (",
                   c.hidden_size, ") is not divisible by num_attention_heads (", c.num_attention_heads,
                   ") and there is no head_dim");
  c.max_position_embeddings = get_int("max_position_embeddings", 2048);
  c.rms_norm_eps = get_real(j, "rms_norm_eps", 1e-6);
  c.initializer_range = get_real(j, "initializer_range", 0.02);
  c.tie_word_embeddings = get_bool("tie_word_embeddings", c.model_type == "qwen3" ? false : false);
  if (const json* act = key(j, "hidden_act"))
    TR_CHECK_TYPED(ConfigError, act->is_string() && act->get<std::string>() == "silu", src,
                   ": hidden_act ", act->dump(), " is not supported (the llama plugin's MLP is SwiGLU, \"silu\")");
  if (const json* tp = key(j, "pretraining_tp"))
    TR_CHECK_TYPED(ConfigError, tp->is_number_integer() && tp->get<int64_t>() == 1, src,
                   ": pretraining_tp ", tp->dump(), " is not supported (only 1)");
  const double dropout = get_real(j, "attention_dropout", 0.0);
  TR_CHECK_TYPED(ConfigError, dropout == 0.0, src, ": attention_dropout ", dropout,
                 " is not supported (only 0)");

  // Biases: Llama's attention_bias puts one on q, k, v and o; Qwen2 has them on q, k, v only.
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;
  } else {
    c.qkv_bias = c.o_bias = get_bool("attention_bias", false);
  }
  c.mlp_bias = get_bool("mlp_bias", false);
  c.qk_norm = c.model_type == "qwen3";

  // Sliding window: Mistral applies sliding_window when set; Qwen2/3 only with
  // use_sliding_window (and then only on some layers), which is not supported.
  if (c.model_type == "mistral") {
    c.sliding_window = get_int("sliding_window", 0);
  } else if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    TR_CHECK_TYPED(ConfigError, !get_bool("use_sliding_window", false), src,
                   ": use_sliding_window = true is not supported for ", c.model_type,
                   " (only full attention on every layer)");
  }
  if (const json* lt = key(j, "layer_types"); lt && lt->is_array())
    for (const auto& t : *lt)
      TR_CHECK_TYPED(ConfigError, t == "full_attention" || (c.model_type == "mistral" && t == "sliding_attention"),
                     src, ": layer_types contains ", t.dump(), "; only \"full_attention\" is supported");

  // RoPE: transformers 5.x writes rope_parameters {rope_type, rope_theta, ...}; 4.x writes
  // rope_theta at the top and rope_scaling {type | rope_type, factor, ...} (null = default).
  const json* rp = key(j, "rope_parameters");
  const json* rs = key(j, "rope_scaling");
  c.rope_theta = get_real(j, "rope_theta", 10000.0);
  const json* scaling = nullptr;
  if (rp) {
    TR_CHECK_TYPED(ConfigError, rp->is_object(), src, ": rope_parameters must be an object");
    c.rope_theta = get_real(*rp, "rope_theta", c.rope_theta);
    scaling = rp;
  } else if (rs) {
    TR_CHECK_TYPED(ConfigError, rs->is_object(), src, ": rope_scaling must be an object or null");
    scaling = rs;
  }
  if (scaling) {
    const json* t = key(*scaling, "rope_type");
    if (!t) t = key(*scaling, "type");
    c.rope_type = t && t->is_string() ? t->get<std::string>() : "default";
    TR_CHECK_TYPED(ConfigError, c.rope_type == "default" || c.rope_type == "linear" || c.rope_type == "llama3",
                   src, ": ", rp ? "rope_parameters" : "rope_scaling", " rope_type \"", c.rope_type,
                   "\" is not supported (supported: default, linear, llama3)");
    if (c.rope_type != "default") {
      TR_CHECK_TYPED(ConfigError, key(*scaling, "factor"), src, ": rope type ", c.rope_type, " needs \"factor\"");
      c.rope_factor = get_real(*scaling, "factor", 1.0);
    }
    if (c.rope_type == "llama3") {
      c.low_freq_factor = get_real(*scaling, "low_freq_factor", 1.0);
      c.high_freq_factor = get_real(*scaling, "high_freq_factor", 4.0);
      const json* o = key(*scaling, "original_max_position_embeddings");
      TR_CHECK_TYPED(ConfigError, o && o->is_number_integer(), src,
                     ": rope type llama3 needs an integer \"original_max_position_embeddings\"");
      c.original_max_position_embeddings = o->get<int64_t>();
    }
  }
  std::string dt = "float32";
  if (const json* d = key(j, "dtype"); d && d->is_string()) dt = d->get<std::string>();
  else if (const json* d2 = key(j, "torch_dtype"); d2 && d2->is_string()) dt = d2->get<std::string>();
  c.dtype = dtype_name(dt);
  scalar_type(c.dtype, src + " dtype");
  return c;
}

std::string LlamaConfig::to_json(const std::string& original, const std::string& dtype) const {
  json j = original.empty() ? json::object() : json::parse(original);
  static const std::map<std::string, std::string> arch = {{"llama", "LlamaForCausalLM"},
                                                          {"mistral", "MistralForCausalLM"},
                                                          {"qwen2", "Qwen2ForCausalLM"},
                                                          {"qwen3", "Qwen3ForCausalLM"}};
  j["architectures"] = {arch.at(model_type)};
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (model_type == "llama" || model_type == "mistral") {
    if (model_type == "llama") j["attention_bias"] = qkv_bias, j["mlp_bias"] = mlp_bias;
  }
  if (model_type == "mistral") j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  // Both RoPE spellings: 4.x reads rope_theta + rope_scaling, 5.x rope_parameters.
  json params = {{"rope_type", rope_type}, {"rope_theta", rope_theta}};
  json legacy = nullptr;
  if (rope_type != "default") {
    params["factor"] = rope_factor;
    legacy = {{"rope_type", rope_type}, {"factor", rope_factor}};
  }
  if (rope_type == "llama3")
    for (json* o : {&params, &legacy}) {
      (*o)["low_freq_factor"] = low_freq_factor;
      (*o)["high_freq_factor"] = high_freq_factor;
      (*o)["original_max_position_embeddings"] = original_max_position_embeddings;
    }
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = legacy;
  j["rope_parameters"] = params;
  j["torch_dtype"] = dtype;  // 4.x
  j["dtype"] = dtype;        // 5.x
  return j.dump(2) + "\n";
}

// =============================================================================================
// Modules. Names are HF's: model.embed_tokens, model.layers.N.{self_attn,mlp,...}, model.norm,
// lm_head.

namespace {

// RMSNorm on float32 with a backward of its own. The forward is the same operations as
// RMSNormImpl's (so the same numbers); through autograd its backward is some ten passes over x
// (pow, mean, rsqrt, two products and their adjoints, the sum of x's two gradients), here four:
// with h = x r, r = (mean(x^2) + eps)^-1/2 per row and dh = dy w,
// dx = r (dh - h mean(dh h)) and dw = sum over rows of dy h.
struct RMSNormFloat : public torch::autograd::Function<RMSNormFloat> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    const torch::Tensor r = torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
    ctx->save_for_backward({x, weight, r});
    return weight * (x * r);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &w = saved[1], &r = saved[2], &dy = grads[0];
    const torch::Tensor h = x * r;
    torch::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      const torch::Tensor dh = dy * w;
      dx = torch::addcmul(dh, h, (dh * h).mean(-1, /*keepdim=*/true), -1).mul_(r);
    }
    if (ctx->needs_input_grad(1)) dw = (dy * h).reshape({-1, h.size(-1)}).sum(0);
    return {dx, dw, torch::Tensor()};
  }
};

// RMSNorm (Zhang & Sennrich 2019) computed in float32 whatever the input dtype, then cast back
// before the gain, as LlamaRMSNorm.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t n, double eps) : eps_(eps) { weight = register_parameter("weight", torch::ones({n})); }
  torch::Tensor forward(const torch::Tensor& x) {
    if (x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat && torch::GradMode::is_enabled() &&
        (x.requires_grad() || weight.requires_grad()))
      return RMSNormFloat::apply(x, weight, eps_);
    torch::Tensor h = x.to(torch::kFloat);
    h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    return weight * h.to(x.scalar_type());
  }
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

v1::Linear linear(int64_t in, int64_t out, bool bias) {
  return v1::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// The second half of the head dimension negated and moved in front of the first: RoPE in the
// layout HF checkpoints store q/k in (pairs (i, i + d/2), not interleaved).
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// RoPE x * cos + rotate_half(x) * sin, as transformers' apply_rotary_pos_emb, with a backward
// of its own: through autograd, rotate_half's two narrow()s each cost a full-size zero tensor and
// a copy, and cat and neg a pass more. rotate_half's adjoint maps [g1, g2] to [g2, -g1], so
// dx = g * cos + adjoint(g * sin).
struct Rope : public torch::autograd::Function<Rope> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return x * cos + rotate_half(x) * sin;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& g = grads[0];
    const torch::Tensor gs = g * saved[1];
    const int64_t h = gs.size(-1) / 2;
    return {g * saved[0] + torch::cat({gs.narrow(-1, h, h), -gs.narrow(-1, 0, h)}, -1), torch::Tensor(),
            torch::Tensor()};
  }
};

#if !TRAINRUN_HAS_SDPA
// Calls fn(s, n, e, m) for each block of up to `block` queries: queries [s, s + n) see keys
// [0, e), e = s + n, and m is that block's part of `blocked` ([T, T] or [B, 1, T, T]).
template <class Fn>
void for_each_query_block(int64_t T, int64_t block, const torch::Tensor& blocked, Fn&& fn) {
  const bool per_row = blocked.dim() == 4;  // [B, 1, T, T] (packed samples) or [T, T]
  for (int64_t s = 0; s < T; s += block) {
    const int64_t n = std::min(block, T - s), e = s + n;
    fn(s, n, e, per_row ? blocked.narrow(2, s, n).narrow(3, 0, e) : blocked.narrow(0, s, n).narrow(1, 0, e));
  }
}

// The blocked causal attention of AttentionImpl::forward (float32, with gradient) with its own
// backward. Through autograd, each block's narrow() of the keys and values is a full-size zero
// tensor plus a copy in the backward, summed over the blocks, and the mask and scale each add a
// pass; here the gradients of all blocks go straight into one dq, dk and dv.
// Grouped-query attention is done by grouping, not by repeating the keys: the rep = nh / nkv
// query heads that share a key/value head are stacked as the rows of one product per block
// ([rep * n, D] x [D, e] instead of rep products of [n, D] x [D, e]), so the keys and values are
// never copied rep times, their gradients come out summed over the group by the products
// themselves, and BLAS gets rep times taller matrices. The scale is folded into the block's copy
// of q (S = (q * scale) k^T), and when `blocked` hides nothing before the block's own columns
// (causal alone: no sliding window or packed samples) only the block's diagonal square is masked.
// (SmolLM2-135M: 9 query heads over 3 key/value heads, T = 512; per layer forward + backward,
// 1 thread, Python prototype of both on the same LibTorch: 16-17 ms at 64 queries per block
// against 20-22 ms for the per-head blocks of 128 with repeated keys this replaced.)
// Forward as attention_math: scores, hidden keys -inf, softmax, times v; the softmax outputs
// are kept for the backward, as autograd keeps them.
// q [B, nh, T, D], k, v [B, nkv, T, D] float32 with nh a multiple of nkv (head h uses key/value
// head h / (nh / nkv), as transformers' repeat_kv), blocked bool [T, T] or [B, 1, T, T]
// (true = hidden; every query sees at least itself, as attention_blocked makes it).
// Returns [B, nh, T, D].
struct BlockedCausalAttention : public torch::autograd::Function<BlockedCausalAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& blocked, double scale, int64_t block) {
    // The backward computes in its inputs' dtype with autocast off: a forward under autocast
    // would save bfloat16 probabilities beside float32 keys (issue 41).
    TORCH_CHECK(q.scalar_type() == torch::kFloat && k.scalar_type() == torch::kFloat &&
                    v.scalar_type() == torch::kFloat &&
                    !v1::compat::autocast_enabled(q.device().type()),
                "BlockedCausalAttention: float32 q/k/v with autocast off only");
    const int64_t B = q.size(0), nh = q.size(1), T = q.size(2), D = q.size(3), nkv = k.size(1), rep = nh / nkv;
    const torch::Tensor qg = q.reshape({B, nkv, rep, T, D});
    const torch::Tensor scale_t = torch::scalar_tensor(scale, q.options());
    std::vector<torch::Tensor> out, probs, qs;
    for_each_query_block(T, block, blocked, [&](int64_t s, int64_t n, int64_t e, const torch::Tensor& m) {
      // Written into a contiguous tensor: an elementwise result keeps its input's (transposed)
      // layout, which the view below cannot take.
      torch::Tensor qb = torch::empty({B, nkv, rep, n, D}, q.options());
      at::mul_out(qb, qg.narrow(3, s, n), scale_t);
      qb = qb.view({B, nkv, rep * n, D});
      torch::Tensor p = torch::matmul(qb, k.narrow(2, 0, e).transpose(-2, -1));
      // [B, nkv, rep, n, e] against m [n, e] or [B, 1, n, e]: one mask for the group's heads.
      torch::Tensor pv = p.view({B, nkv, rep, n, e});
      const torch::Tensor mg = m.dim() == 4 ? m.unsqueeze(1) : m;
      if (s > 0 && !mg.narrow(-1, 0, s).any().item<bool>())
        pv.narrow(-1, s, n).masked_fill_(mg.narrow(-1, s, n), -std::numeric_limits<float>::infinity());
      else
        pv.masked_fill_(mg, -std::numeric_limits<float>::infinity());
      p = torch::softmax(p, -1);
      out.push_back(torch::matmul(p, v.narrow(2, 0, e)).view({B, nkv, rep, n, D}));
      probs.push_back(p);
      qs.push_back(std::move(qb));
    });
    ctx->save_for_backward({k, v});
    ctx->saved_data["probs"] = probs;
    ctx->saved_data["qs"] = qs;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["block"] = block;
    return torch::cat(out, 3).view({B, nh, T, D});
  }

  // With P = softmax(S) of a block and Q_s its scaled queries: dV[:e] += P^T dO,
  // dP = dO V[:e]^T, dS = P * (dP - rowsum(dP * P)) (zero where a key is hidden, as P is),
  // dQ = scale * dS K[:e], dK[:e] += dS^T Q_s. The last block covers every key, so it is done
  // first and starts dk and dv.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &k = saved[0], &v = saved[1];
    const std::vector<torch::Tensor> probs = ctx->saved_data["probs"].toTensorVector();
    const std::vector<torch::Tensor> qs = ctx->saved_data["qs"].toTensorVector();
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t block = ctx->saved_data["block"].toInt();
    const int64_t B = grads[0].size(0), nh = grads[0].size(1), T = grads[0].size(2), D = grads[0].size(3),
                  nkv = k.size(1), rep = nh / nkv;
    const torch::Tensor dg = grads[0].reshape({B, nkv, rep, T, D});
    const torch::Tensor ks = k * scale;
    torch::Tensor dq = torch::empty({B, nkv, rep, T, D}, k.options()), dk, dv;
    for (int64_t i = static_cast<int64_t>(probs.size()) - 1; i >= 0; --i) {
      const int64_t s = i * block, n = std::min(block, T - s), e = s + n;
      const torch::Tensor& p = probs[static_cast<size_t>(i)];
      const torch::Tensor d_o = dg.narrow(3, s, n).reshape({B, nkv, rep * n, D});
      torch::Tensor dpv = torch::matmul(p.transpose(-2, -1), d_o);
      torch::Tensor ds =
          torch::_softmax_backward_data(torch::matmul(d_o, v.narrow(2, 0, e).transpose(-2, -1)), p, -1, p.scalar_type());
      dq.narrow(3, s, n).copy_(torch::matmul(ds, ks.narrow(2, 0, e)).view({B, nkv, rep, n, D}));
      torch::Tensor dkb = torch::matmul(ds.transpose(-2, -1), qs[static_cast<size_t>(i)]);
      if (e == T) {
        dk = std::move(dkb), dv = std::move(dpv);
      } else {
        dk.narrow(2, 0, e).add_(dkb);
        dv.narrow(2, 0, e).add_(dpv);
      }
    }
    return {dq.view({B, nh, T, D}), dk, dv, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
#endif

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaConfig& c)
      : nh_(c.num_attention_heads), nkv_(c.num_key_value_heads), hd_(c.head_dim) {
    q_proj = register_module("q_proj", linear(c.hidden_size, nh_ * hd_, c.qkv_bias));
    k_proj = register_module("k_proj", linear(c.hidden_size, nkv_ * hd_, c.qkv_bias));
    v_proj = register_module("v_proj", linear(c.hidden_size, nkv_ * hd_, c.qkv_bias));
    o_proj = register_module("o_proj", linear(nh_ * hd_, c.hidden_size, c.o_bias));
    if (c.qk_norm) {
      q_norm = register_module("q_norm", RMSNorm(hd_, c.rms_norm_eps));
      k_norm = register_module("k_norm", RMSNorm(hd_, c.rms_norm_eps));
    }
  }

  // x [B, T, hidden], cos/sin [T, head_dim] or [B, 1, T, head_dim], blocked: bool [T, T] or
  // [B, 1, T, T] from v1::attention_blocked (causal, sliding window, packed samples) ->
  // [B, T, hidden].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& blocked) {
    const int64_t B = x.size(0), T = x.size(1);
    // One call for the three projections of x: their LoRA adapters' x A^T run as one product.
    const std::vector<torch::Tensor> qkv =
        v1::LinearImpl::forward_shared(x, {q_proj.get(), k_proj.get(), v_proj.get()});
    torch::Tensor q = qkv[0].view({B, T, nh_, hd_});
    torch::Tensor k = qkv[1].view({B, T, nkv_, hd_});
    torch::Tensor v = qkv[2].view({B, T, nkv_, hd_}).transpose(1, 2);
    if (q_norm) q = q_norm->forward(q), k = k_norm->forward(k);
    q = q.transpose(1, 2);
    k = k.transpose(1, 2);
    const torch::Tensor c = cos.to(q.scalar_type()), s = sin.to(q.scalar_type());
    q = Rope::apply(q, c, s);
    k = Rope::apply(k, c, s);
#if !TRAINRUN_HAS_SDPA
    // Not under autocast: its matmuls would come out bfloat16 inside the Function while the
    // backward (where autocast is off) meets them with float32 gradients. With LoRA under
    // bf16-mixed, q/k/v are float32 (an adapter's float32 output added to the bf16 base output),
    // so the dtype alone does not tell (issue 41); autocast's products go through attend().
    if (T > kGradQueryBlock && k.size(2) == T && torch::GradMode::is_enabled() &&
        q.scalar_type() == torch::kFloat && k.scalar_type() == torch::kFloat &&
        v.scalar_type() == torch::kFloat && !v1::compat::autocast_enabled(q.device().type()) &&
        (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
      const torch::Tensor y = BlockedCausalAttention::apply(q, k, v, blocked, 1.0 / std::sqrt(static_cast<double>(hd_)),
                                                            kGradQueryBlock);
      return o_proj->forward(y.transpose(1, 2).reshape({B, T, nh_ * hd_}));
    }
#endif
    // Grouped-query attention: each key/value head serves nh/nkv consecutive query heads.
    if (nkv_ != nh_) {
      const int64_t rep = nh_ / nkv_;
      k = k.unsqueeze(2).expand({B, nkv_, rep, T, hd_}).reshape({B, nh_, T, hd_});
      v = v.unsqueeze(2).expand({B, nkv_, rep, T, hd_}).reshape({B, nh_, T, hd_});
    }
    torch::Tensor y = attend(q, k, v, blocked).transpose(1, 2).reshape({B, T, nh_ * hd_});
    return o_proj->forward(y);
  }

  // The attention itself, q/k/v [B, nh, T, head_dim] -> [B, nh, T, head_dim], where not
  // `blocked`: the SDK's attention(), scaled_dot_product_attention on LibTorch >= 2.1, on 1.13
  // matmul + softmax in float32 as transformers' eager path.
  static torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& blocked) {
#if !TRAINRUN_HAS_SDPA
    // Without SDPA's causal kernels the math form computes every score and then masks the
    // upper triangle away. `blocked` always hides the keys after a query (attention_blocked is
    // causal, whatever else it adds), so queries in blocks of kQueryBlock need only the keys up
    // to their block's last position: at T = 512 that is 62.5% of the score and value products
    // (SmolLM2-135M, LoRA, seq 512, 1 thread, on a loaded machine: 5.4-5.8 CPU-s per step
    // against 6.0-6.4 before, peak tracked memory 1.82 GB against 1.93 GB). The hidden
    // keys weigh exactly 0 after the softmax either way, so only the summation order of the
    // value product differs.
    const int64_t T = q.size(2);
    if (T > kQueryBlock && k.size(2) == T) {
      // Without gradient (evaluation, generation) or not float32 (the float32 training path is
      // BlockedCausalAttention, taken in forward()): the same blocks through the SDK's
      // attention, which handles every dtype.
      std::vector<torch::Tensor> out;
      for_each_query_block(T, kQueryBlock, blocked, [&](int64_t s, int64_t n, int64_t e, const torch::Tensor& m) {
        out.push_back(attend_all(q.narrow(2, s, n), k.narrow(2, 0, e), v.narrow(2, 0, e), m));
      });
      return torch::cat(out, 2);
    }
#endif
    return attend_all(q, k, v, blocked);
  }

  static torch::Tensor attend_all(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& blocked) {
    v1::AttentionOptions o;
    o.causal = false;  // `blocked` holds the causal (and sliding-window) mask already
    o.mask = blocked.logical_not();
    return v1::attention(q, k, v, o);
  }
  static constexpr int64_t kQueryBlock = 128;
  // BlockedCausalAttention's block: its products are rep times taller than the per-head ones,
  // so smaller blocks skip more hidden keys at no loss of BLAS efficiency (64 against 128:
  // 16-17 against 18-20 ms per SmolLM2-135M layer, forward + backward, T = 512, 1 thread).
  static constexpr int64_t kGradQueryBlock = 64;

  v1::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};

 private:
  int64_t nh_, nkv_, hd_;
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const LlamaConfig& c) {
    gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
    up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
    down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size, c.mlp_bias));
  }
  // SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x)).
  torch::Tensor forward(const torch::Tensor& x) {
    const std::vector<torch::Tensor> gu = v1::LinearImpl::forward_shared(x, {gate_proj.get(), up_proj.get()});
    return down_proj->forward(torch::silu(gu[0]) * gu[1]);
  }
  v1::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const LlamaConfig& c) {
    self_attn = register_module("self_attn", Attention(c));
    mlp = register_module("mlp", Mlp(c));
    input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
    post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& blocked) {
    torch::Tensor h = x + self_attn->forward(input_layernorm->forward(x), cos, sin, blocked);
    return h + mlp->forward(post_attention_layernorm->forward(h));
  }
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

// glibc keeps freed blocks below its (dynamic) mmap threshold resident in the heap: a model built
// and read piece by piece would leave the process holding far more than the pieces it keeps
// (measured on SmolLM2 under fsdp at 2 ranks: peak RSS 1.76x the rank's state without this,
// 1.01x with MALLOC_MMAP_THRESHOLD_ fixed). Returning free pages after each piece keeps the
// peak at what is alive.
void give_back_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// Deferred loading: a submodule's parameters keep their shapes but give their memory back as
// soon as the submodule is built, so building the model never holds more than its largest part.
void release_parameters(torch::nn::Module& m, bool release) {
  if (!release) return;
  for (auto& p : m.parameters(true))
    if (p.defined() && p.numel() > 0) v1::sharding::free_storage(p);
  give_back_free_memory();
}

// LlamaModel in HF's naming (the "model." prefix).
class DecoderImpl : public torch::nn::Module {
 public:
  DecoderImpl(const LlamaConfig& c, bool release) {
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
    release_parameters(*embed_tokens, release);
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      DecoderLayer l(c);
      release_parameters(*l, release);
      layers->push_back(l);
      layer_ptrs.push_back(l.ptr());
    }
    norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
    release_parameters(*norm, release);
  }
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<std::shared_ptr<DecoderLayerImpl>> layer_ptrs;
  RMSNorm norm{nullptr};
};
TORCH_MODULE(Decoder);

class CausalLMImpl : public torch::nn::Module {
 public:
  CausalLMImpl(const LlamaConfig& c, bool release) : cfg(c) {
    model = register_module("model", Decoder(c, release));
    // Tied: the output projection reuses embed_tokens.weight (not registered twice, ModuleModel).
    if (!c.tie_word_embeddings) {
      lm_head = register_module("lm_head", linear(c.hidden_size, c.vocab_size, false));
      release_parameters(*lm_head, release);
    }
    inv_freq = rope_inv_freq(c);
  }

  // RoPE inverse frequencies [head_dim / 2], float32, as transformers' rope init functions
  // (modeling_rope_utils.py: default, linear, llama3).
  static torch::Tensor rope_inv_freq(const LlamaConfig& c) {
    const int64_t dim = c.head_dim;
    torch::Tensor inv = 1.0 / torch::pow(c.rope_theta, torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim);
    if (c.rope_type == "linear") inv = inv / c.rope_factor;
    if (c.rope_type == "llama3") {
      const double old_ctx = static_cast<double>(c.original_max_position_embeddings);
      const double low_wavelen = old_ctx / c.low_freq_factor, high_wavelen = old_ctx / c.high_freq_factor;
      torch::Tensor wavelen = 2 * M_PI / inv;
      torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv / c.rope_factor, inv);
      torch::Tensor smooth = (old_ctx / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
      torch::Tensor smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
      torch::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
      inv = torch::where(medium, smoothed, scaled);
    }
    return inv;
  }

  LlamaConfig cfg;
  Decoder model{nullptr};
  v1::Linear lm_head{nullptr};
  torch::Tensor inv_freq;
};
TORCH_MODULE(CausalLM);

CausalLMImpl& net_of(const std::shared_ptr<torch::nn::Module>& m) {
  return *std::static_pointer_cast<CausalLMImpl>(m);
}

}  // namespace

// =============================================================================================
// The model component

void LlamaModel::declare_options(v1::OptionSchema& s) {
  s.string("path", "", "Hugging Face model directory (config.json + safetensors weights); \"\" = "
                       "build from the inline keys below and initialise randomly");
  s.choice("model_type", "llama", {"llama", "mistral", "qwen2", "qwen3"}, "inline config: architecture variant");
  s.integer("vocab_size", 0, "inline config: vocabulary size; 0 = the dataset's", 0, 1 << 24);
  s.integer("hidden_size", 256, "inline config: model width", 1);
  s.integer("intermediate_size", 688, "inline config: MLP width", 1);
  s.integer("num_hidden_layers", 4, "inline config: decoder layers", 1);
  s.integer("num_attention_heads", 4, "inline config: query heads", 1);
  s.integer("num_key_value_heads", 0, "inline config: key/value heads (GQA); 0 = num_attention_heads", 0);
  s.integer("head_dim", 0, "inline config: per-head width; 0 = hidden_size / num_attention_heads", 0);
  s.integer("max_position_embeddings", 2048, "inline config: longest sequence (written to config.json)", 1);
  s.real("rms_norm_eps", 1e-6, "inline config: RMSNorm epsilon", 0.0);
  s.real("rope_theta", 10000.0, "inline config: RoPE base", 1.0);
  s.boolean("tie_word_embeddings", false, "inline config: lm_head reuses embed_tokens.weight");
  s.boolean("attention_bias", false, "inline config (llama): biases on q/k/v/o_proj");
  s.integer("sliding_window", 0, "inline config (mistral): keys a query sees; 0 = all", 0);
  s.boolean("save_hf", true, "write <run_dir>/hf/ (an HF model directory) at the end of training");
  s.choice("save_dtype", "auto", {"auto", "float32", "bfloat16", "float16"},
           "dtype of the saved weights; auto = the input's (float32 for an inline config)");
  s.string("max_shard_size", "5GB", "largest weight file in <run_dir>/hf/ before sharding (\"5GB\", \"500MB\")");
  s.boolean("fused_head_loss", true,
            "training loss with a frozen head (LoRA, QLoRA): the vocabulary projection and the "
            "cross-entropy in one step whose logits buffer is reused from step to step and "
            "overwritten by their gradient; false = the projection through autograd, then the loss");
}

LlamaModel::LlamaModel(const v1::Options& o, const v1::RunContext& ctx) : run_dir_(ctx.run_dir), rank_(ctx.rank) {
  const v1::DataInfo& data = ctx.data;
  TR_CHECK_TYPED(ConfigError, data.task.empty() || data.task == "language_modeling", o.context(),
                 ": llama needs a language-modelling dataset, but the dataset's task is '", data.task, "'");
  save_hf_ = o.get_bool("save_hf");
  fused_head_loss_ = o.get_bool("fused_head_loss");
  save_dtype_ = o.get_string("save_dtype");
  max_shard_bytes_ = hf::parse_size(o.get_string("max_shard_size"));
  const std::string path = o.get_string("path");
  if (!path.empty()) {
    load(path, /*defer=*/true);  // the host loads them whole, or a sharded strategy by shard
  } else {
    json j;
    j["model_type"] = o.get_string("model_type");
    j["vocab_size"] = o.get_int("vocab_size") > 0 ? o.get_int("vocab_size") : data.vocab_size;
    TR_CHECK_TYPED(ConfigError, j["vocab_size"].get<int64_t>() > 0, o.context(),
                   ": vocab_size = 0 takes the vocabulary from the dataset, which reports none");
    for (const char* k : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "max_position_embeddings"})
      j[k] = o.get_int(k);
    if (o.get_int("num_key_value_heads") > 0) j["num_key_value_heads"] = o.get_int("num_key_value_heads");
    if (o.get_int("head_dim") > 0) j["head_dim"] = o.get_int("head_dim");
    j["rms_norm_eps"] = o.get_double("rms_norm_eps");
    j["rope_theta"] = o.get_double("rope_theta");
    j["tie_word_embeddings"] = o.get_bool("tie_word_embeddings");
    j["attention_bias"] = o.get_bool("attention_bias");
    if (o.get_int("sliding_window") > 0) j["sliding_window"] = o.get_int("sliding_window");
    cfg_ = LlamaConfig::from_json(j.dump(), o.context());
    build(false);
    // transformers' _init_weights: N(0, initializer_range) for Linear and Embedding weights,
    // zero biases, unit RMSNorm gains.
    torch::NoGradGuard no_grad;
    for (auto& item : net_->named_parameters(true)) {
      const std::string& n = item.key();
      torch::Tensor& p = item.value();
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0) p.zero_();
      else if (p.dim() == 1) p.fill_(1.0);
      else p.normal_(0.0, cfg_.initializer_range);
    }
  }
  TR_CHECK_TYPED(ConfigError, data.vocab_size <= cfg_.vocab_size, o.context(), ": the dataset's vocabulary (",
                 data.vocab_size, ") is larger than the model's vocab_size (", cfg_.vocab_size, ")");
}

LlamaModel::LlamaModel(const std::string& dir) : save_hf_(false) { load(dir, /*defer=*/false); }

void LlamaModel::build(bool release) {
  net_ = CausalLM(cfg_, release).ptr();
  set_module(net_);
  units_.clear();
  auto& net = net_of(net_);
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i)
    units_.push_back(std::make_unique<v1::Unit>("model.layers." + std::to_string(i),
                                                net.model->layer_ptrs[static_cast<size_t>(i)]));
}

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
  cfg_ = LlamaConfig::from_json(config_text_, (fs::path(dir) / "config.json").string());
  build(defer);
  std::set<std::string> wanted;
  torch::NoGradGuard no_grad;
  for (auto& item : net_->named_parameters(true)) {
    const std::string& name = item.key();
    wanted.insert(name);
    TR_CHECK_TYPED(ConfigError, md.contains(name), dir, ": tensor '", name, "' is missing from the weights (",
                   cfg_.model_type, " with ", cfg_.num_hidden_layers, " layers", cfg_.qkv_bias ? ", q/k/v biases" : "",
                   cfg_.qk_norm ? ", q/k norms" : "", cfg_.tie_word_embeddings ? ", tied embeddings" : "", ")");
    const hf::TensorEntry& e = md.entry(name);
    TR_CHECK_TYPED(ConfigError, c10::IntArrayRef(e.shape) == item.value().sizes(), md.file_of(name), ": tensor '",
                   name, "' has shape ", c10::IntArrayRef(e.shape), ", config.json makes it ",
                   item.value().sizes());
    TR_CHECK_TYPED(ConfigError, e.dtype == at::kFloat || e.dtype == at::kBFloat16 || e.dtype == at::kHalf,
                   md.file_of(name), ": tensor '", name, "' is ", e.dtype, " (F32, BF16 or F16 expected)");
    deferred_[name] = item.value();
  }
  for (const auto& name : md.tensor_names()) {
    if (wanted.count(name)) continue;
    // Known non-weights: RoPE tables some exporters keep, and the output projection of a tied
    // model (the same matrix as embed_tokens).
    const bool inv_freq = name.size() > 9 && name.compare(name.size() - 9, 9, ".inv_freq") == 0;
    if (inv_freq || (cfg_.tie_word_embeddings && name == "lm_head.weight")) continue;
    TR_CHECK_TYPED(ConfigError, false, md.file_of(name), ": unexpected tensor '", name, "' (not a parameter of ",
                   cfg_.model_type, " as config.json describes it)");
  }
  if (!defer) load_deferred_weights();
}


bool LlamaModel::weight_deferred(const std::string& name) const { return deferred_.count(name) > 0; }

void LlamaModel::read_weight_range(const std::string& name, int64_t offset, const at::Tensor& out) {
  auto it = deferred_.find(name);
  TR_CHECK(it != deferred_.end() && md_ != nullptr, "llama: read_weight_range: '", name,
           "' is not a parameter waiting for its values");
  const int64_t n = it->second.numel();
  TR_CHECK(offset >= 0 && offset + out.numel() <= n, "llama: read_weight_range: elements [", offset, ", ",
           offset + out.numel(), ") lie outside '", name, "' (", n, " elements)");
  if (rchar_start_ < 0) rchar_start_ = rchar_now();
  torch::NoGradGuard no_grad;
  at::Tensor part = out.numel() == n ? md_->read(name).reshape({-1}) : md_->read_range(name, offset, out.numel());
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

at::Tensor LlamaModel::logits(const at::Tensor& ids) {
  v1::Batch b;
  b.input = ids;
  return logits(b);
}

// The training forward: positions from batch.position_ids (restarting per packed sample) and a
// block-diagonal causal mask from batch.segment_ids, both as transformers computes them.
at::Tensor LlamaModel::logits(const v1::Batch& batch) { return head(hidden_states(batch)); }

at::Tensor LlamaModel::head(const at::Tensor& x) {
  auto& net = net_of(net_);
  return cfg_.tie_word_embeddings ? torch::linear(x, net.model->embed_tokens->weight) : net.lm_head->forward(x);
}

at::Tensor LlamaModel::hidden_states(const v1::Batch& batch) {
  const v1::Batch f = fields_of(batch);
  const at::Tensor& ids = f.input;
  TR_CHECK(ids.dim() == 2, "llama: input must be token ids [B, T], got shape ", ids.sizes());
  TR_CHECK(ids.scalar_type() == at::kLong, "llama: token ids must be int64, got ", ids.scalar_type());
  auto& net = net_of(net_);
  const int64_t B = ids.size(0), T = ids.size(1);
  // cos/sin in float32 as transformers computes them (autocast off): [1, 1, T, head_dim] for
  // 0..T-1, [B, 1, T, head_dim] for given positions, broadcasting over the heads.
  torch::Tensor pos = v1::positions_of(f, B, T, ids.device()).to(torch::kFloat);
  torch::Tensor freqs = pos.unsqueeze(-1) * net.inv_freq.to(ids.device());
  torch::Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);
  const torch::Tensor cos = emb.cos(), sin = emb.sin();
  const torch::Tensor blocked = v1::attention_blocked(T, ids.device(), f.segment_ids, cfg_.sliding_window);
  torch::Tensor x = net.model->embed_tokens->forward(ids);
  for (size_t i = 0; i < units_.size(); ++i)
    x = units_[i]->run(x, [layer = net.model->layer_ptrs[i], cos, sin, blocked](const torch::Tensor& in) {
      return layer->forward(in, cos, sin, blocked);
    });
  return net.model->norm->forward(x);
}

namespace {

// sum over targets != kIgnoreIndex of logsumexp(logits) - logits[target], logits float32
// [N, C], target int64 [N]: cross_entropy_sum's loss with a backward of its own. Through
// autograd, log_softmax writes an [N, C] result, the loss's backward fills an [N, C] zero
// gradient and log_softmax's backward reads both; here the forward keeps one logsumexp per
// row and the backward writes the gradient (softmax - one-hot) once, over the logits
// themselves, a few rows at a time so the temporaries stay in cache (SmolLM2: C = 49,152,
// N = 512 per sequence, 100 MB logits).
//
// Writing the gradient over the logits is safe because nothing reads them after this (the
// vocabulary projection's backward needs its input, not its output); a fresh [N, C] buffer
// would be mapped and zero-filled by the kernel page by page every step (41 ms to first touch
// 100 MB here, against 5 ms to fill it again). So a second backward through the same graph
// (retain_graph) would read the gradient as logits: it is refused instead.
struct CrossEntropySum : public torch::autograd::Function<CrossEntropySum> {
  static constexpr int64_t kRows = 8;

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& target) {
    const auto [loss, lse, t, valid] = loss_of(logits, target);
    ctx->save_for_backward({logits, lse, t, valid});
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    once(ctx);
    return {gradient(saved[0], saved[1], saved[2], saved[3], grads[0]), torch::Tensor()};
  }

  // The loss and what its gradient needs: logsumexp per row, the targets with the ignored ones
  // at 0, and which rows count.
  static std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> loss_of(
      const torch::Tensor& logits, const torch::Tensor& target) {
    const int64_t N = logits.size(0);
    const torch::Tensor valid = target.ne(v1::kIgnoreIndex);
    const torch::Tensor t = target.masked_fill(valid.logical_not(), 0);
    torch::Tensor lse = torch::empty({N}, logits.options());
    for (int64_t s = 0; s < N; s += kRows) {
      const int64_t n = std::min(kRows, N - s);
      torch::Tensor out = lse.narrow(0, s, n);
      at::logsumexp_out(out, logits.narrow(0, s, n), {1}, false);
    }
    // gather throws on a target outside [0, C), as cross_entropy does.
    const torch::Tensor picked = logits.gather(1, t.unsqueeze(1)).squeeze(1);
    return {torch::where(valid, lse - picked, torch::zeros({}, lse.options())).sum(), lse, t, valid};
  }

  static void once(torch::autograd::AutogradContext* ctx) {
    TR_CHECK(!ctx->saved_data.count("consumed"), "llama: the cross-entropy's backward ran twice on one "
             "graph (retain_graph); the llama model's training loss supports one backward per forward");
    ctx->saved_data["consumed"] = true;
  }

  // d loss / d logits = (softmax - one-hot) * grad per counted row, written over `logits`
  // (contiguous) and returned.
  static torch::Tensor gradient(torch::Tensor logits, const torch::Tensor& lse, const torch::Tensor& t,
                                const torch::Tensor& valid, const torch::Tensor& grad) {
    const torch::Tensor w = valid.to(logits.scalar_type()).mul(grad);  // d loss / d row
    torch::Tensor d = logits.is_contiguous() ? logits : torch::empty_like(logits, at::MemoryFormat::Contiguous);
    const int64_t N = logits.size(0);
    for (int64_t s = 0; s < N; s += kRows) {
      const int64_t n = std::min(kRows, N - s);
      torch::Tensor out = d.narrow(0, s, n);
      at::sub_out(out, logits.narrow(0, s, n), lse.narrow(0, s, n).unsqueeze(1));
      out.exp_().mul_(w.narrow(0, s, n).unsqueeze(1));
    }
    d.scatter_add_(1, t.unsqueeze(1), w.neg().unsqueeze(1));
    return d;
  }
};

// The vocabulary projection and CrossEntropySum in one: h float32 [N, hidden], weight [C, hidden]
// (frozen: the tied embedding or a plain lm_head, no bias, no adapters), target [N] -> the
// summed loss, with d loss / d h in the backward. The logits go into `buffer`, kept by the model
// from step to step, so the largest tensor of the step is mapped once per run, not twice per
// step (logits, then their gradient). The buffer is used only when no earlier graph still
// holds it (its storage's only owner is the model); otherwise this call takes a fresh one.
struct HeadCrossEntropySum : public torch::autograd::Function<HeadCrossEntropySum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& h,
                               const torch::Tensor& weight, const torch::Tensor& target,
                               std::shared_ptr<torch::Tensor> buffer) {
    const int64_t N = h.size(0), C = weight.size(0);
    const bool free = !buffer->defined() || buffer->storage().use_count() == 1;
    if (free && (!buffer->defined() || buffer->numel() < N * C)) *buffer = torch::empty({N * C}, h.options());
    torch::Tensor logits = free ? buffer->narrow(0, 0, N * C).view({N, C}) : torch::empty({N, C}, h.options());
    at::mm_out(logits, h, weight.t());
    auto [loss, lse, t, valid] = CrossEntropySum::loss_of(logits, target);
    ctx->save_for_backward({weight, lse, t, valid});
    ctx->saved_data["logits"] = logits;  // not a saved variable: the backward overwrites it
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    CrossEntropySum::once(ctx);
    torch::Tensor d = CrossEntropySum::gradient(ctx->saved_data["logits"].toTensor(), saved[1], saved[2],
                                                saved[3], grads[0]);
    torch::Tensor dh = torch::mm(d, saved[0]);
    ctx->saved_data.erase("logits");  // the buffer is free for the next step's forward
    return {dh, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

// The loss only needs the logits of the positions that count: those whose target is
// kIgnoreIndex (prompt tokens of chat data, padding) skip the vocabulary projection altogether,
// which changes no figure (their loss is 0 and their arg-max never equals the target).
v1::ModelOutput LlamaModel::forward(const v1::Batch& b) {
  torch::Tensor h = hidden_states(b);
  TR_CHECK(b.target.sizes() == h.sizes().slice(0, 2), "llama: target must be [B, T] as the input, got ",
           b.target.sizes(), " for input ", h.sizes().slice(0, 2));
  h = h.reshape({-1, h.size(-1)});
  torch::Tensor target = b.target.reshape({-1});
  const torch::Tensor valid = target.ne(v1::kIgnoreIndex);
  if (!valid.all().item<bool>()) {
    const torch::Tensor idx = valid.nonzero().squeeze(1);
    h = h.index_select(0, idx);
    target = target.index_select(0, idx);
  }
  if (fused_head_loss_ && torch::GradMode::is_enabled() && h.requires_grad() && h.scalar_type() == torch::kFloat) {
    auto& net = net_of(net_);
    // The head's weight when the head is a plain product with it (undefined otherwise).
    torch::Tensor w;
    if (cfg_.tie_word_embeddings)
      w = net.model->embed_tokens->weight;
    else if (net.lm_head->adapters().empty() && !net.lm_head->base() && !net.lm_head->bias.defined())
      w = net.lm_head->weight;
    if (w.defined() && !w.requires_grad() && w.scalar_type() == torch::kFloat &&
        !v1::compat::autocast_enabled(h.device().type())) {
      v1::ModelOutput out;
      out.loss_sum = HeadCrossEntropySum::apply(h.contiguous(), w, target, logits_buffer_);
      return out;
    }
  }
  const torch::Tensor logits = head(h);
  if (torch::GradMode::is_enabled() && logits.requires_grad() && logits.scalar_type() == torch::kFloat) {
    v1::ModelOutput out;
    out.loss_sum = CrossEntropySum::apply(logits, target);
    return out;
  }
  return v1::cross_entropy_sum(logits, target);
}

std::vector<v1::Unit*> LlamaModel::units() {
  std::vector<v1::Unit*> out;
  for (auto& u : units_) out.push_back(u.get());
  return out;
}

std::string LlamaModel::describe() const {
  return v1::detail::cat("llama (", cfg_.model_type, "): ", cfg_.num_hidden_layers, " layers, hidden ",
                         cfg_.hidden_size, ", heads ", cfg_.num_attention_heads, "/", cfg_.num_key_value_heads,
                         " (q/kv), head_dim ", cfg_.head_dim, ", vocab ", cfg_.vocab_size,
                         cfg_.tie_word_embeddings ? ", tied embeddings" : "",
                         cfg_.rope_type != "default" ? ", rope " + cfg_.rope_type : std::string(),
                         dir_.empty() ? ", random init" : ", from " + dir_);
}

void LlamaModel::save_hf(const std::string& out, const std::vector<v1::NamedTensor>& state,
                         const std::string& dtype, int64_t max_shard_bytes) const {
  const at::ScalarType st = scalar_type(dtype, "llama save_dtype");
  std::vector<v1::NamedTensor> weights;
  for (const auto& t : state) weights.push_back({t.name, t.tensor.detach().to(at::kCPU).to(st)});
  fs::create_directories(out);
  hf::write_model_weights(out, weights, max_shard_bytes);
  hf::write_text_file((fs::path(out) / "config.json").string(), cfg_.to_json(config_text_, dtype));
  const fs::path gen = fs::path(dir_) / "generation_config.json";
  std::error_code ec;
  if (!dir_.empty() && fs::is_regular_file(gen, ec)) {
    fs::copy_file(gen, fs::path(out) / "generation_config.json", fs::copy_options::overwrite_existing);
  } else {
    json g = json::object();
    if (!config_text_.empty()) {
      const json c = json::parse(config_text_);
      for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
        if (c.contains(k)) g[k] = c[k];
    }
    hf::write_text_file((fs::path(out) / "generation_config.json").string(), g.dump(2) + "\n");
  }
  if (!dir_.empty()) hf::copy_tokenizer_files(dir_, out);
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
    if (params.count(t.name)) weights.push_back(t);
  }
  const std::string dtype = save_dtype_ == "auto" ? cfg_.dtype : save_dtype_;
  const std::string out = (fs::path(run_dir_) / "hf").string();
  save_hf(out, weights, dtype, max_shard_bytes_);
  v1::Logger("llama", rank_)
      .info(v1::detail::cat("wrote ", out, " (", weights.size(), " tensors, ", dtype, ")"));
}

}  // namespace trainrun::llama

// Incremental decoding with a KV cache, kept apart from the training forward.
#include "llama_decode.inc"
