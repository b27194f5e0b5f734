#pragma once
// The llama family's modules (private to the plugin). Names are HF's: model.embed_tokens,
// model.layers.N.{self_attn,mlp,...}, model.norm, lm_head, so loading, saving and LoRA targeting
// need no mapping tables.
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <cmath>
#include <memory>
#include <vector>

#include "kernels.hpp"
#include "llama.hpp"
#include "trainrun/model/attention.hpp"
#include "trainrun/model/linear.hpp"
#include "trainrun/strategy/sharding.hpp"

namespace trainrun::llama::detail {

// RMSNorm (Zhang & Sennrich 2019) computed in float32 whatever the input dtype, then cast back
// before the gain, as LlamaRMSNorm.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t n, double eps) : eps_(eps) {
    weight = register_parameter("weight", torch::ones({n}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat &&
        torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad()))
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

inline v1::Linear linear(int64_t in, int64_t out, bool bias) {
  return v1::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaConfig& c)
      : nh_(c.num_attention_heads),
        nkv_(c.num_key_value_heads),
        hd_(c.head_dim),
        blocked_attention_(c.blocked_attention) {
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
    if (blocked_attention_ && T > kGradQueryBlock && k.size(2) == T &&
        torch::GradMode::is_enabled() && q.scalar_type() == torch::kFloat &&
        k.scalar_type() == torch::kFloat && v.scalar_type() == torch::kFloat &&
        !v1::compat::autocast_enabled(q.device().type()) &&
        (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
      const torch::Tensor y = BlockedCausalAttention::apply(
          q, k, v, blocked, 1.0 / std::sqrt(static_cast<double>(hd_)), kGradQueryBlock);
      return o_proj->forward(y.transpose(1, 2).reshape({B, T, nh_ * hd_}));
    }
    // Under CPU autocast to bf16 (bf16-mixed, bf16-true): the same blocks in autocast's dtypes.
    if (blocked_attention_ && T > kGradQueryBlock && k.size(2) == T &&
        torch::GradMode::is_enabled() && q.device().is_cpu() &&
        v1::compat::autocast_enabled(c10::kCPU) &&
        v1::compat::autocast_dtype(c10::kCPU) == torch::kBFloat16 &&
        (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
      const torch::Tensor y = BlockedCausalAttentionBf16::apply(
          q, k, v, blocked, 1.0 / std::sqrt(static_cast<double>(hd_)), kQueryBlock);
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
  static torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& blocked) {
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
      for_each_query_block(
          T, kQueryBlock, blocked, [&](int64_t s, int64_t n, int64_t e, const torch::Tensor& m) {
            out.push_back(attend_all(q.narrow(2, s, n), k.narrow(2, 0, e), v.narrow(2, 0, e), m));
          });
      return torch::cat(out, 2);
    }
#endif
    return attend_all(q, k, v, blocked);
  }

  static torch::Tensor attend_all(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const torch::Tensor& blocked) {
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
  bool blocked_attention_;  ///< [model] blocked_attention: the kernels above, else autograd
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const LlamaConfig& c) {
    gate_proj =
        register_module("gate_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
    up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
    down_proj =
        register_module("down_proj", linear(c.intermediate_size, c.hidden_size, c.mlp_bias));
  }
  // SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x)).
  torch::Tensor forward(const torch::Tensor& x) {
    const std::vector<torch::Tensor> gu =
        v1::LinearImpl::forward_shared(x, {gate_proj.get(), up_proj.get()});
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
    post_attention_layernorm =
        register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
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
inline void give_back_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// Deferred loading: a submodule's parameters keep their shapes but give their memory back as
// soon as the submodule is built, so building the model never holds more than its largest part.
inline void release_parameters(torch::nn::Module& m, bool release) {
  if (!release) return;
  for (auto& p : m.parameters(true))
    if (p.defined() && p.numel() > 0) v1::sharding::free_storage(p);
  give_back_free_memory();
}

// LlamaModel in HF's naming (the "model." prefix).
class DecoderImpl : public torch::nn::Module {
 public:
  DecoderImpl(const LlamaConfig& c, bool release) {
    embed_tokens =
        register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
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
    if (c.num_labels > 0) {
      // *ForSequenceClassification: `score` instead of lm_head.
      score = register_module("score", linear(c.hidden_size, c.num_labels, false));
      release_parameters(*score, release);
    } else if (!c.tie_word_embeddings) {
      lm_head = register_module("lm_head", linear(c.hidden_size, c.vocab_size, false));
      release_parameters(*lm_head, release);
    }
    inv_freq = rope_inv_freq(c);
  }

  // RoPE inverse frequencies [head_dim / 2], float32, as transformers' rope init functions
  // (modeling_rope_utils.py: default, linear, llama3).
  static torch::Tensor rope_inv_freq(const LlamaConfig& c) {
    const int64_t dim = c.head_dim;
    torch::Tensor inv =
        1.0 /
        torch::pow(c.rope_theta, torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim);
    if (c.rope_type == "linear") inv = inv / c.rope_factor;
    if (c.rope_type == "llama3") {
      const double old_ctx = static_cast<double>(c.original_max_position_embeddings);
      const double low_wavelen = old_ctx / c.low_freq_factor,
                   high_wavelen = old_ctx / c.high_freq_factor;
      torch::Tensor wavelen = 2 * M_PI / inv;
      torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv / c.rope_factor, inv);
      torch::Tensor smooth =
          (old_ctx / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
      torch::Tensor smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
      torch::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
      inv = torch::where(medium, smoothed, scaled);
    }
    return inv;
  }

  LlamaConfig cfg;
  Decoder model{nullptr};
  v1::Linear lm_head{nullptr};
  v1::Linear score{nullptr};  ///< sequence classification only (cfg.num_labels > 0)
  torch::Tensor inv_freq;
};
TORCH_MODULE(CausalLM);

inline CausalLMImpl& net_of(const std::shared_ptr<torch::nn::Module>& m) {
  return *std::static_pointer_cast<CausalLMImpl>(m);
}

}  // namespace trainrun::llama::detail
