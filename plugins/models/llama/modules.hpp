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
// before the gain, as LlamaRMSNorm; with `plus_one` (Gemma) the gain is stored as w - 1 (zeros at
// initialisation) and applied as (1 + w) in float32 before the cast, as GemmaRMSNorm.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t n, double eps, bool plus_one = false) : eps_(eps), plus_one_(plus_one) {
    weight = register_parameter("weight", plus_one ? torch::zeros({n}) : torch::ones({n}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat &&
        torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad()))
      return RMSNormFloat::apply(x, plus_one_ ? 1.0 + weight : weight, eps_);
    torch::Tensor h = x.to(torch::kFloat);
    h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    if (plus_one_) return (h * (1.0 + weight.to(torch::kFloat))).to(x.scalar_type());
    return weight * h.to(x.scalar_type());
  }
  torch::Tensor weight;

 private:
  double eps_;
  bool plus_one_;
};
TORCH_MODULE(RMSNorm);

inline v1::Linear linear(int64_t in, int64_t out, bool bias) {
  return v1::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// RoPE on the first cos.size(-1) dimensions of each head, the rest passed through (Phi-3's
// partial rotary), as transformers' apply_rotary_pos_emb.
// Without a gradient to keep (evaluation, the decode steps) the same arithmetic runs outside the
// autograd Function, whose bookkeeping costs every decode step of every layer.
inline torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                                const torch::Tensor& sin) {
  const auto rotate = [&](const torch::Tensor& t) {
    if (torch::GradMode::is_enabled() && t.requires_grad()) return Rope::apply(t, cos, sin);
    return t * cos + rotate_half(t) * sin;
  };
  const int64_t rot = cos.size(-1), hd = x.size(-1);
  if (rot == hd) return rotate(x);
  return torch::cat({rotate(x.narrow(-1, 0, rot)), x.narrow(-1, rot, hd - rot)}, -1);
}

// What a decoder layer reads besides its input, per kind of layer (full or sliding-window
// attention): cos/sin [T, rot] or [B, 1, T, rot] in float32, and `blocked` from
// v1::attention_blocked (bool [T, T] or [B, 1, T, T], true = hidden).
struct LayerInputs {
  torch::Tensor cos, sin, blocked;
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaConfig& c)
      : nh_(c.num_attention_heads),
        nkv_(c.num_key_value_heads),
        hd_(c.head_dim),
        scale_(c.attn_scale > 0 ? c.attn_scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim))),
        softcap_(c.attn_logit_softcapping),
        blocked_attention_(c.blocked_attention) {
    if (c.fused_qkv) {
      qkv_proj =
          register_module("qkv_proj", linear(c.hidden_size, (nh_ + 2 * nkv_) * hd_, c.qkv_bias));
    } else {
      q_proj = register_module("q_proj", linear(c.hidden_size, nh_ * hd_, c.qkv_bias));
      k_proj = register_module("k_proj", linear(c.hidden_size, nkv_ * hd_, c.qkv_bias));
      v_proj = register_module("v_proj", linear(c.hidden_size, nkv_ * hd_, c.qkv_bias));
    }
    o_proj = register_module("o_proj", linear(nh_ * hd_, c.hidden_size, c.o_bias));
    if (c.qk_norm) {
      q_norm = register_module("q_norm", RMSNorm(hd_, c.rms_norm_eps, c.norm_plus_one));
      k_norm = register_module("k_norm", RMSNorm(hd_, c.rms_norm_eps, c.norm_plus_one));
    }
  }

  // q, k, v [B, T, heads * head_dim] of x [B, T, hidden]: one call for the three projections
  // (their LoRA adapters' x A^T run as one product), or Phi-3's fused qkv_proj split.
  // `project` runs one Linear (the decode path's few-row products).
  template <class Project>
  std::vector<torch::Tensor> qkv(const torch::Tensor& x, Project&& project) {
    if (qkv_proj)
      return project(*qkv_proj, x).split_with_sizes({nh_ * hd_, nkv_ * hd_, nkv_ * hd_}, -1);
    return {project(*q_proj, x), project(*k_proj, x), project(*v_proj, x)};
  }

  // x [B, T, hidden] -> [B, T, hidden], with the layer's LayerInputs (causal, sliding window,
  // packed samples in `blocked`).
  torch::Tensor forward(const torch::Tensor& x, const LayerInputs& in) {
    const int64_t B = x.size(0), T = x.size(1);
    const std::vector<torch::Tensor> qkv_ =
        qkv_proj ? qkv_proj->forward(x).split_with_sizes({nh_ * hd_, nkv_ * hd_, nkv_ * hd_}, -1)
                 : v1::LinearImpl::forward_shared(x, {q_proj.get(), k_proj.get(), v_proj.get()});
    torch::Tensor q = qkv_[0].view({B, T, nh_, hd_});
    torch::Tensor k = qkv_[1].view({B, T, nkv_, hd_});
    torch::Tensor v = qkv_[2].view({B, T, nkv_, hd_}).transpose(1, 2);
    if (q_norm) q = q_norm->forward(q), k = k_norm->forward(k);
    q = q.transpose(1, 2);
    k = k.transpose(1, 2);
    const torch::Tensor c = in.cos.to(q.scalar_type()), s = in.sin.to(q.scalar_type());
    q = apply_rope(q, c, s);
    k = apply_rope(k, c, s);
    // Under autocast Qwen3's q/k norms come out float32 (a float32 gain times the bf16 product,
    // as in transformers) while v is the product's dtype: the attention takes them in v's, as
    // autocast's scaled_dot_product_attention casts its inputs.
    if (v1::compat::autocast_enabled(q.device().type()) &&
        (q.scalar_type() != v.scalar_type() || k.scalar_type() != v.scalar_type())) {
      q = q.to(v.scalar_type());
      k = k.to(v.scalar_type());
    }
    const torch::Tensor& blocked = in.blocked;
#if !TRAINRUN_HAS_SDPA
    // Not under autocast: its matmuls would come out bfloat16 inside the Function while the
    // backward (where autocast is off) meets them with float32 gradients. With LoRA under
    // bf16-mixed, q/k/v are float32 (an adapter's float32 output added to the bf16 base output),
    // so the dtype alone does not tell (issue 41); autocast's products go through attend().
    // Soft-capped scores (Gemma 2) go through attend() too.
    if (blocked_attention_ && softcap_ == 0 && T > kGradQueryBlock && k.size(2) == T &&
        torch::GradMode::is_enabled() && q.scalar_type() == torch::kFloat &&
        k.scalar_type() == torch::kFloat && v.scalar_type() == torch::kFloat &&
        !v1::compat::autocast_enabled(q.device().type()) &&
        (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
      const torch::Tensor y =
          BlockedCausalAttention::apply(q, k, v, blocked, scale_, kGradQueryBlock);
      return o_proj->forward(y.transpose(1, 2).reshape({B, T, nh_ * hd_}));
    }
    // Under CPU autocast to bf16 (bf16-mixed, bf16-true): the same blocks in autocast's dtypes.
    if (blocked_attention_ && softcap_ == 0 && T > kGradQueryBlock && k.size(2) == T &&
        torch::GradMode::is_enabled() && q.device().is_cpu() &&
        v1::compat::autocast_enabled(c10::kCPU) &&
        v1::compat::autocast_dtype(c10::kCPU) == torch::kBFloat16 &&
        (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
      const torch::Tensor y =
          BlockedCausalAttentionBf16::apply(q, k, v, blocked, scale_, kQueryBlock);
      return o_proj->forward(y.transpose(1, 2).reshape({B, T, nh_ * hd_}));
    }
#endif
    // Grouped-query attention: each key/value head serves nh/nkv consecutive query heads.
    if (nkv_ != nh_) {
      const int64_t rep = nh_ / nkv_;
      k = k.unsqueeze(2).expand({B, nkv_, rep, T, hd_}).reshape({B, nh_, T, hd_});
      v = v.unsqueeze(2).expand({B, nkv_, rep, T, hd_}).reshape({B, nh_, T, hd_});
    }
    torch::Tensor y =
        attend(q, k, v, blocked, options()).transpose(1, 2).reshape({B, T, nh_ * hd_});
    return o_proj->forward(y);
  }

  // The layer's scaling and soft-capping for v1::attention.
  v1::AttentionOptions options() const {
    v1::AttentionOptions o;
    o.causal = false;  // `blocked` holds the causal (and sliding-window) mask
    o.scale = scale_;
    if (softcap_ > 0) o.softcap = softcap_;
    return o;
  }

  // The attention itself, q/k/v [B, nh, T, head_dim] -> [B, nh, T, head_dim], where not
  // `blocked`: the SDK's attention(), scaled_dot_product_attention on LibTorch >= 2.1, on 1.13
  // matmul + softmax in float32 as transformers' eager path.
  static torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& blocked,
                              const v1::AttentionOptions& o) {
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
            out.push_back(
                attend_all(q.narrow(2, s, n), k.narrow(2, 0, e), v.narrow(2, 0, e), m, o));
          });
      return torch::cat(out, 2);
    }
#endif
    return attend_all(q, k, v, blocked, o);
  }

  static torch::Tensor attend_all(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const torch::Tensor& blocked,
                                  v1::AttentionOptions o) {
    o.mask = blocked.logical_not();
    return v1::attention(q, k, v, o);
  }
  static constexpr int64_t kQueryBlock = 128;
  // BlockedCausalAttention's block: its products are rep times taller than the per-head ones,
  // so smaller blocks skip more hidden keys at no loss of BLAS efficiency (64 against 128:
  // 16-17 against 18-20 ms per SmolLM2-135M layer, forward + backward, T = 512, 1 thread).
  static constexpr int64_t kGradQueryBlock = 64;

  v1::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  v1::Linear qkv_proj{nullptr};  ///< Phi-3: q, k, v in one projection
  RMSNorm q_norm{nullptr}, k_norm{nullptr};

 private:
  int64_t nh_, nkv_, hd_;
  double scale_, softcap_;
  bool blocked_attention_;  ///< [model] blocked_attention: the kernels above, else autograd
};
TORCH_MODULE(Attention);

// The gated MLP: down(act(gate(x)) * up(x)), SwiGLU (Shazeer 2020) with silu, GeGLU with
// Gemma's tanh-approximated gelu; gate and up as Phi-3's one gate_up_proj (gate first) or two.
// An expert of a MoE block is one too, of the experts' width and under the family's names
// (Mixtral: w1 gate, w3 up, w2 down).
class MlpImpl : public torch::nn::Module {
 public:
  struct Names {
    const char *gate = "gate_proj", *up = "up_proj", *down = "down_proj";
  };
  explicit MlpImpl(const LlamaConfig& c)
      : MlpImpl(c, c.intermediate_size, Names{}, c.mlp_bias, c.fused_gate_up) {}
  MlpImpl(const LlamaConfig& c, int64_t width, Names names, bool bias, bool fused)
      : gelu_(c.hidden_act == "gelu_pytorch_tanh") {
    if (fused) {
      gate_up_proj = register_module("gate_up_proj", linear(c.hidden_size, 2 * width, bias));
    } else {
      gate_proj = register_module(names.gate, linear(c.hidden_size, width, bias));
      up_proj = register_module(names.up, linear(c.hidden_size, width, bias));
    }
    down_proj = register_module(names.down, linear(width, c.hidden_size, bias));
  }
  torch::Tensor act(const torch::Tensor& g) const {
    return gelu_ ? torch::gelu(g, "tanh") : torch::silu(g);
  }
  // `project` runs one Linear (the decode path's few-row products).
  template <class Project>
  torch::Tensor forward_with(const torch::Tensor& x, Project&& project) {
    if (gate_up_proj) {
      const std::vector<torch::Tensor> gu = project(*gate_up_proj, x).chunk(2, -1);
      return project(*down_proj, act(gu[0]) * gu[1]);
    }
    return project(*down_proj, act(project(*gate_proj, x)) * project(*up_proj, x));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (gate_up_proj) return forward_with(x, plain_forward);
    const std::vector<torch::Tensor> gu =
        v1::LinearImpl::forward_shared(x, {gate_proj.get(), up_proj.get()});
    return down_proj->forward(act(gu[0]) * gu[1]);
  }
  static torch::Tensor plain_forward(v1::LinearImpl& l, const torch::Tensor& x) {
    return l.forward(x);
  }
  v1::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  v1::Linear gate_up_proj{nullptr};  ///< Phi-3: gate and up in one projection

 private:
  bool gelu_;
};
TORCH_MODULE(Mlp);

// A sparse mixture-of-experts block (Mixtral's block_sparse_moe, Qwen3-MoE's mlp): the router
// `gate` scores the experts of each token, softmax in float32, the top num_experts_per_tok are
// kept (renormalised where the family says) and each token's output is the weighted sum of its
// experts' MLPs, every token computed (dropless), as transformers' *SparseMoeBlock.
// Expert parallelism (experts.cpp): rows [sum(send[:r]), + send[r]) of x [rows, hidden] go to
// rank r of `group` and recv[r] rows come from it, in rank order; the backward sends the
// gradient back the same way. v1::all_to_all underneath.
torch::Tensor exchange_rows(const torch::Tensor& x, const std::vector<int64_t>& send,
                            const std::vector<int64_t>& recv, v1::Communicator& group);
// counts int64 [ep * per]: this rank's rows for each expert, the experts of rank r at
// [r * per, (r + 1) * per) -> [ep, per]: the rows each rank sends to this rank's experts.
torch::Tensor exchange_counts(const torch::Tensor& counts, v1::Communicator& group);

class SparseMoeImpl : public torch::nn::Module {
 public:
  explicit SparseMoeImpl(const LlamaConfig& c)
      : top_k_(c.num_experts_per_tok),
        num_experts_(c.num_experts),
        norm_topk_(c.norm_topk_prob),
        weights_float_(c.routing_weights_float) {
    gate = register_module("gate", linear(c.hidden_size, c.num_experts, false));
    torch::nn::ModuleList list;
    const MlpImpl::Names names =
        c.model_type == "mixtral" ? MlpImpl::Names{"w1", "w3", "w2"} : MlpImpl::Names{};
    for (int64_t e = 0; e < c.num_experts; ++e) {
      Mlp m(c, c.moe_intermediate_size, names, false, false);
      list->push_back(m);
      expert_ptrs.push_back(m.ptr());
    }
    experts = register_module("experts", list.ptr());
  }
  // Expert parallelism: keeps experts [first, first + count) under their own indices and frees
  // the others; later forwards route over `group` (group.rank() holds these experts).
  void keep_experts(int64_t first, int64_t count, v1::Communicator* group) {
    auto kept = std::make_shared<torch::nn::Module>();
    for (int64_t e = 0; e < num_experts_; ++e) {
      if (e >= first && e < first + count)
        kept->register_module(std::to_string(e), expert_ptrs[static_cast<size_t>(e)]);
      else
        expert_ptrs[static_cast<size_t>(e)].reset();
    }
    experts = replace_module("experts", kept);
    first_local_ = first;
    group_ = group;
  }
  // x [B, T, hidden] -> [B, T, hidden]; router_logits keeps this call's [B * T, num_experts].
  template <class Project>
  torch::Tensor forward_with(const torch::Tensor& x, Project&& project) {
    const torch::Tensor h = x.reshape({-1, x.size(-1)});
    router_logits = project(*gate, h);
    auto [weights, chosen] = torch::softmax(router_logits, -1, torch::kFloat).topk(top_k_, -1);
    if (norm_topk_) weights = weights / weights.sum(-1, /*keepdim=*/true);
    if (!weights_float_) weights = weights.to(router_logits.scalar_type());
    if (group_ != nullptr) return forward_parallel(h, weights, chosen, project).view(x.sizes());
    torch::Tensor out = torch::zeros_like(h);
    // The experts some token chose, in ascending order (as transformers visits them).
    const torch::Tensor hit =
        std::get<0>(torch::_unique(chosen.flatten(), /*sorted=*/true)).to(torch::kCPU);
    for (const int64_t e :
         std::vector<int64_t>(hit.data_ptr<int64_t>(), hit.data_ptr<int64_t>() + hit.numel())) {
      const torch::Tensor where = chosen.eq(e).nonzero();  // [n, 2]: token, slot
      const torch::Tensor rows = where.select(1, 0), slots = where.select(1, 1);
      torch::Tensor y =
          expert_ptrs[static_cast<size_t>(e)]->forward_with(h.index_select(0, rows), project);
      y = y * weights.index({rows, slots}).unsqueeze(1);
      out = out.index_add(0, rows, y.to(out.scalar_type()));
    }
    return out.view(x.sizes());
  }
  torch::Tensor forward(const torch::Tensor& x) { return forward_with(x, MlpImpl::plain_forward); }

  v1::Linear gate{nullptr};  ///< the router: hidden -> num_experts, no bias
  /// "experts": every expert, or with expert parallelism this rank's under their indices.
  std::shared_ptr<torch::nn::Module> experts;
  std::vector<std::shared_ptr<MlpImpl>> expert_ptrs;  ///< by index; null where not held
  torch::Tensor router_logits;  ///< the last forward's, for the load-balancing loss

 private:
  // Dropless expert parallelism: every (token, slot) pair travels, sorted by expert, to the
  // rank holding its expert with its routing weight, is computed and weighted there with the
  // rows other ranks sent to the same expert, and comes back to be summed as in the local path.
  template <class Project>
  torch::Tensor forward_parallel(const torch::Tensor& h, const torch::Tensor& weights,
                                 const torch::Tensor& chosen, Project&& project) {
    const int64_t ep = group_->world_size(), per = num_experts_ / ep;
    const torch::Tensor flat = chosen.flatten();
    const torch::Tensor order = std::get<1>(torch::sort(flat, c10::optional<bool>(true), 0, false));
    const torch::Tensor token = order.div(top_k_, "floor");
    const torch::Tensor counts = torch::bincount(flat, {}, num_experts_).to(torch::kCPU);
    const torch::Tensor from = exchange_counts(counts, *group_);  // [ep, per]
    std::vector<int64_t> send(static_cast<size_t>(ep)), recv(static_cast<size_t>(ep));
    const auto* c = counts.data_ptr<int64_t>();
    const auto* f = from.data_ptr<int64_t>();
    for (int64_t r = 0; r < ep; ++r)
      for (int64_t j = 0; j < per; ++j) {
        send[static_cast<size_t>(r)] += c[r * per + j];
        recv[static_cast<size_t>(r)] += f[r * per + j];
      }
    const torch::Tensor x_in = exchange_rows(h.index_select(0, token), send, recv, *group_);
    // The routing weights travel too: the expert's output is weighted where it is computed, in
    // the expert's output dtype, as the local path does, and comes back in h's.
    const torch::Tensor w_in =
        exchange_rows(weights.flatten().index_select(0, order).unsqueeze(1), send, recv, *group_);
    // The rows for local expert j: in each source's block, after the rows for experts < j.
    torch::Tensor y_in = torch::zeros_like(x_in);
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(per));
    int64_t start = 0;
    for (int64_t r = 0; r < ep; ++r)
      for (int64_t j = 0; j < per; ++j)
        for (int64_t n = 0; n < f[r * per + j]; ++n)
          rows[static_cast<size_t>(j)].push_back(start++);
    for (int64_t j = 0; j < per; ++j) {
      if (rows[static_cast<size_t>(j)].empty()) continue;
      const torch::Tensor idx =
          torch::tensor(rows[static_cast<size_t>(j)], torch::kLong).to(x_in.device());
      const torch::Tensor y = expert_ptrs[static_cast<size_t>(first_local_ + j)]->forward_with(
          x_in.index_select(0, idx), project);
      y_in = y_in.index_copy(0, idx, (y * w_in.index_select(0, idx)).to(y_in.scalar_type()));
    }
    const torch::Tensor y = exchange_rows(y_in, recv, send, *group_);
    return torch::zeros_like(h).index_add(0, token, y);
  }

  int64_t top_k_, num_experts_;
  bool norm_topk_, weights_float_;
  int64_t first_local_ = 0;
  v1::Communicator* group_ = nullptr;  ///< expert parallelism's group; null = every expert here
};
TORCH_MODULE(SparseMoe);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const LlamaConfig& c, int64_t index)
      : sliding(c.layer_is_sliding(index)), sandwich_(c.sandwich_norms) {
    self_attn = register_module("self_attn", Attention(c));
    if (c.layer_is_moe(index))
      moe = register_module(c.model_type == "mixtral" ? "block_sparse_moe" : "mlp", SparseMoe(c));
    else
      mlp = register_module("mlp", Mlp(c));
    const auto norm = [&](const char* name) {
      return register_module(name, RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_plus_one));
    };
    input_layernorm = norm("input_layernorm");
    post_attention_layernorm = norm("post_attention_layernorm");
    if (sandwich_) {
      pre_feedforward_layernorm = norm("pre_feedforward_layernorm");
      post_feedforward_layernorm = norm("post_feedforward_layernorm");
    }
  }
  torch::Tensor forward(const torch::Tensor& x, const LayerInputs& in) {
    torch::Tensor a = self_attn->forward(input_layernorm->forward(x), in);
    return mlp_residual(
        x, a, [&](const torch::Tensor& t) { return moe ? moe->forward(t) : mlp->forward(t); });
  }
  // The residual adds around the attention's output `attn` and the MLP: Llama's pre-norm, or
  // Gemma 2/3's sandwich (each output normed before its add, the MLP's input by its own norm).
  template <class MlpFn>
  torch::Tensor mlp_residual(const torch::Tensor& x, const torch::Tensor& attn, MlpFn&& run_mlp) {
    if (!sandwich_) {
      const torch::Tensor h = x + attn;
      return h + run_mlp(post_attention_layernorm->forward(h));
    }
    const torch::Tensor h = x + post_attention_layernorm->forward(attn);
    return h + post_feedforward_layernorm->forward(run_mlp(pre_feedforward_layernorm->forward(h)));
  }
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
  SparseMoe moe{nullptr};  ///< instead of mlp on a mixture-of-experts layer
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  RMSNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};
  const bool sliding;  ///< attends through the sliding window (LayerInputs of that kind)

 private:
  bool sandwich_;
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
      DecoderLayer l(c, i);
      release_parameters(*l, release);
      layers->push_back(l);
      layer_ptrs.push_back(l.ptr());
    }
    norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_plus_one));
    release_parameters(*norm, release);
  }
  // ids [B, T] -> embeddings [B, T, hidden], times Gemma's sqrt(hidden_size) rounded to the
  // weights' dtype as transformers' scaled embedding does.
  torch::Tensor embed(const torch::Tensor& ids, double scale) {
    torch::Tensor x = embed_tokens->forward(ids);
    if (scale == 1.0) return x;
    return x * torch::scalar_tensor(scale, torch::kFloat).to(x.scalar_type()).to(x.device());
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
    inv_freq = rope_inv_freq(c.rope, c.head_dim, false);
    if (c.rope.type == "longrope") inv_freq_long = rope_inv_freq(c.rope, c.head_dim, true);
    if (!c.rope_local.type.empty()) inv_freq_local = rope_inv_freq(c.rope_local, c.head_dim, false);
  }

  // RoPE inverse frequencies [rotary_dim / 2], float32, as transformers' rope init functions
  // (modeling_rope_utils.py: default, linear, llama3, longrope with its short or `long_set`).
  static torch::Tensor rope_inv_freq(const RopeConfig& r, int64_t head_dim, bool long_set) {
    const int64_t dim = r.rotary_dim(head_dim);
    const torch::Tensor shape = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim;
    if (r.type == "longrope") {
      const std::vector<double>& f = long_set ? r.long_factor : r.short_factor;
      const torch::Tensor ext = torch::tensor(f, torch::kDouble).to(torch::kFloat);
      return 1.0 / (ext * torch::pow(r.theta, shape));
    }
    torch::Tensor inv = 1.0 / torch::pow(r.theta, shape);
    if (r.type == "linear") inv = inv / r.factor;
    if (r.type == "llama3") {
      const double old_ctx = static_cast<double>(r.original_max_position_embeddings);
      const double low_wavelen = old_ctx / r.low_freq_factor,
                   high_wavelen = old_ctx / r.high_freq_factor;
      torch::Tensor wavelen = 2 * M_PI / inv;
      torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv / r.factor, inv);
      torch::Tensor smooth =
          (old_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      torch::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
      torch::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
      inv = torch::where(medium, smoothed, scaled);
    }
    return inv;
  }

  // cos and sin [..., T, rotary_dim] in float32 of positions `pos` float [..., T, 1], for the
  // sliding-window layers' RoPE (`local`) or the others'. longrope takes its long set when the
  // longest position + 1 exceeds the pretraining context, as transformers decides per forward.
  std::pair<torch::Tensor, torch::Tensor> rope_cos_sin(const torch::Tensor& pos, bool local) const {
    const bool own = local && inv_freq_local.defined();
    const RopeConfig& r = own ? cfg.rope_local : cfg.rope;
    torch::Tensor inv = own ? inv_freq_local : inv_freq;
    if (r.type == "longrope" && pos.numel() > 0 &&
        pos.max().item<double>() + 1 > static_cast<double>(r.original_max_position_embeddings))
      inv = inv_freq_long;
    const torch::Tensor freqs = pos * inv.to(pos.device());
    const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
    if (r.attention_factor == 1.0) return {emb.cos(), emb.sin()};
    return {emb.cos() * r.attention_factor, emb.sin() * r.attention_factor};
  }

  // hidden [..., hidden_size] -> logits [..., vocab_size]: lm_head (or the tied embedding), then
  // Gemma 2's final soft-capping.
  torch::Tensor head(const torch::Tensor& x) {
    torch::Tensor logits = cfg.tie_word_embeddings ? torch::linear(x, model->embed_tokens->weight)
                                                   : lm_head->forward(x);
    return softcap_logits(logits);
  }
  torch::Tensor softcap_logits(const torch::Tensor& logits) const {
    const double cap = cfg.final_logit_softcapping;
    if (cap <= 0) return logits;
    return torch::tanh(logits / cap) * cap;
  }

  LlamaConfig cfg;
  Decoder model{nullptr};
  v1::Linear lm_head{nullptr};
  v1::Linear score{nullptr};     ///< sequence classification only (cfg.num_labels > 0)
  torch::Tensor inv_freq;        ///< every layer's, or the full-attention layers'
  torch::Tensor inv_freq_local;  ///< Gemma 3's sliding-window layers' (undefined: inv_freq)
  torch::Tensor inv_freq_long;   ///< longrope's long set (undefined otherwise)
};
TORCH_MODULE(CausalLM);

inline CausalLMImpl& net_of(const std::shared_ptr<torch::nn::Module>& m) {
  return *std::static_pointer_cast<CausalLMImpl>(m);
}

}  // namespace trainrun::llama::detail
