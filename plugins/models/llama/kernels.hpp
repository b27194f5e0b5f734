#pragma once
// The llama plugin's own autograd kernels (private to the plugin): RMSNorm, RoPE, the blocked
// causal attention of the float32 training path without SDPA, and the cross-entropy sums with
// and without the vocabulary projection fused in. Each is the arithmetic transformers' modules
// do through autograd, with a backward written for fewer passes over memory; why each is shaped
// as it is is said where it is defined.
#include <torch/types.h>
#include <torch/utils.h>

#include <limits>
#include <vector>

#include "trainrun/model/activation_checkpointing.hpp"
#include "trainrun/model/attention.hpp"
#include "trainrun/model/packed_batch.hpp"
#include "trainrun/torch_compat.hpp"

namespace trainrun::llama::detail {

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

// The second half of the head dimension negated and moved in front of the first: RoPE in the
// layout HF checkpoints store q/k in (pairs (i, i + d/2), not interleaved).
inline torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// RoPE x * cos + rotate_half(x) * sin, as transformers' apply_rotary_pos_emb, with a backward
// of its own: through autograd, rotate_half's two narrow()s each cost a full-size zero tensor and
// a copy, and cat and neg a pass more. rotate_half's adjoint maps [g1, g2] to [g2, -g1], so
// dx = g * cos + adjoint(g * sin).
struct Rope : public torch::autograd::Function<Rope> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return x * cos + rotate_half(x) * sin;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& g = grads[0];
    const torch::Tensor gs = g * saved[1];
    const int64_t h = gs.size(-1) / 2;
    return {g * saved[0] + torch::cat({gs.narrow(-1, h, h), -gs.narrow(-1, 0, h)}, -1),
            torch::Tensor(), torch::Tensor()};
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
    fn(s, n, e,
       per_row ? blocked.narrow(2, s, n).narrow(3, 0, e) : blocked.narrow(0, s, n).narrow(1, 0, e));
  }
}

// Hides (-inf) the keys a block's part m of `blocked` marks in its scores pv [B, nkv, rep, n, e]
// (queries [s, s + n)): only the block's diagonal square when nothing before it is hidden
// (causal alone: no sliding window or packed samples).
inline void mask_block_scores(torch::Tensor pv, const torch::Tensor& m, int64_t s, int64_t n) {
  const torch::Tensor mg = m.dim() == 4 ? m.unsqueeze(1) : m;
  if (s > 0 && !mg.narrow(-1, 0, s).any().item<bool>())
    pv.narrow(-1, s, n).masked_fill_(mg.narrow(-1, s, n), -std::numeric_limits<float>::infinity());
  else
    pv.masked_fill_(mg, -std::numeric_limits<float>::infinity());
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
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& blocked, double scale, int64_t block) {
    // The backward computes in its inputs' dtype with autocast off: a forward under autocast
    // would save bfloat16 probabilities beside float32 keys (issue 41).
    TORCH_CHECK(q.scalar_type() == torch::kFloat && k.scalar_type() == torch::kFloat &&
                    v.scalar_type() == torch::kFloat &&
                    !v1::compat::autocast_enabled(q.device().type()),
                "BlockedCausalAttention: float32 q/k/v with autocast off only");
    const int64_t B = q.size(0), nh = q.size(1), T = q.size(2), D = q.size(3), nkv = k.size(1),
                  rep = nh / nkv;
    const torch::Tensor qg = q.reshape({B, nkv, rep, T, D});
    const torch::Tensor scale_t = torch::scalar_tensor(scale, q.options());
    std::vector<torch::Tensor> out, probs, qs;
    for_each_query_block(
        T, block, blocked, [&](int64_t s, int64_t n, int64_t e, const torch::Tensor& m) {
          // Written into a contiguous tensor: an elementwise result keeps its input's (transposed)
          // layout, which the view below cannot take.
          torch::Tensor qb = torch::empty({B, nkv, rep, n, D}, q.options());
          at::mul_out(qb, qg.narrow(3, s, n), scale_t);
          qb = qb.view({B, nkv, rep * n, D});
          torch::Tensor p = torch::matmul(qb, k.narrow(2, 0, e).transpose(-2, -1));
          // [B, nkv, rep, n, e] against m [n, e] or [B, 1, n, e]: one mask for the group's heads.
          mask_block_scores(p.view({B, nkv, rep, n, e}), m, s, n);
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
    const int64_t B = grads[0].size(0), nh = grads[0].size(1), T = grads[0].size(2),
                  D = grads[0].size(3), nkv = k.size(1), rep = nh / nkv;
    const torch::Tensor dg = grads[0].reshape({B, nkv, rep, T, D});
    const torch::Tensor ks = k * scale;
    torch::Tensor dq = torch::empty({B, nkv, rep, T, D}, k.options()), dk, dv;
    for (int64_t i = static_cast<int64_t>(probs.size()) - 1; i >= 0; --i) {
      const int64_t s = i * block, n = std::min(block, T - s), e = s + n;
      const torch::Tensor& p = probs[static_cast<size_t>(i)];
      const torch::Tensor d_o = dg.narrow(3, s, n).reshape({B, nkv, rep * n, D});
      torch::Tensor dpv = torch::matmul(p.transpose(-2, -1), d_o);
      torch::Tensor ds = torch::_softmax_backward_data(
          torch::matmul(d_o, v.narrow(2, 0, e).transpose(-2, -1)), p, -1, p.scalar_type());
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

// BlockedCausalAttention for a forward under CPU autocast to bfloat16, with autocast's dtypes:
// the score and value products in bf16 (float32 accumulation), the mask and softmax in float32
// on the bf16 scores, the probabilities rounded to bf16 for the value product; the same blocks,
// query-head grouping (no repeated keys) and diagonal-only mask as the float32 kernel, and a
// backward of its own in the same dtypes (gradient products in bf16, dk/dv/dq summed in
// float32). Through autograd, autocast's path repeats the keys and values per query head,
// masks every score, and casts each block's operands and gradients. q [B, nh, T, D], k, v
// [B, nkv, T, D] of any floating dtype; returns bf16 [B, nh, T, D]; the gradients come back in
// the inputs' dtypes.
struct BlockedCausalAttentionBf16 : public torch::autograd::Function<BlockedCausalAttentionBf16> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& blocked, double scale, int64_t block) {
    // CPU autocast off inside (the SDK's AutocastRestore): every cast here is explicit.
    v1::detail::AutocastRestore off(false, at::kBFloat16, v1::compat::autocast_enabled(c10::kCUDA),
                                    v1::compat::autocast_dtype(c10::kCUDA),
                                    at::autocast::is_autocast_cache_enabled());
    const int64_t B = q.size(0), nh = q.size(1), T = q.size(2), D = q.size(3), nkv = k.size(1),
                  rep = nh / nkv;
    const torch::Tensor qg = q.reshape({B, nkv, rep, T, D});
    const torch::Tensor kb = k.to(torch::kBFloat16), vb = v.to(torch::kBFloat16);
    std::vector<torch::Tensor> out, probs, qs;
    for_each_query_block(
        T, block, blocked, [&](int64_t s, int64_t n, int64_t e, const torch::Tensor& m) {
          const torch::Tensor qb = qg.narrow(3, s, n)
                                       .mul(scale)
                                       .to(torch::kBFloat16)
                                       .contiguous()
                                       .view({B, nkv, rep * n, D});
          torch::Tensor p =
              torch::matmul(qb, kb.narrow(2, 0, e).transpose(-2, -1)).to(torch::kFloat);
          mask_block_scores(p.view({B, nkv, rep, n, e}), m, s, n);
          p = torch::softmax(p, -1);
          out.push_back(
              torch::matmul(p.to(torch::kBFloat16), vb.narrow(2, 0, e)).view({B, nkv, rep, n, D}));
          probs.push_back(p);
          qs.push_back(qb);
        });
    ctx->save_for_backward({kb, vb});
    ctx->saved_data["probs"] = probs;
    ctx->saved_data["qs"] = qs;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["block"] = block;
    ctx->saved_data["dtypes"] = std::vector<int64_t>{static_cast<int64_t>(q.scalar_type()),
                                                     static_cast<int64_t>(k.scalar_type()),
                                                     static_cast<int64_t>(v.scalar_type())};
    return torch::cat(out, 3).view({B, nh, T, D});
  }

  // BlockedCausalAttention's backward with bf16 products: dV[:e] += P^T dO, dP = dO V[:e]^T,
  // dS = P * (dP - rowsum(dP * P)) in float32, dQ = scale * dS K[:e], dK[:e] += dS^T Q_s.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // CPU autocast off inside (the SDK's AutocastRestore): every cast here is explicit.
    v1::detail::AutocastRestore off(false, at::kBFloat16, v1::compat::autocast_enabled(c10::kCUDA),
                                    v1::compat::autocast_dtype(c10::kCUDA),
                                    at::autocast::is_autocast_cache_enabled());
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &kb = saved[0], &vb = saved[1];
    const std::vector<torch::Tensor> probs = ctx->saved_data["probs"].toTensorVector();
    const std::vector<torch::Tensor> qs = ctx->saved_data["qs"].toTensorVector();
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t block = ctx->saved_data["block"].toInt();
    const std::vector<int64_t> dtypes = ctx->saved_data["dtypes"].toIntVector();
    const int64_t B = grads[0].size(0), nh = grads[0].size(1), T = grads[0].size(2),
                  D = grads[0].size(3), nkv = kb.size(1), rep = nh / nkv;
    const torch::Tensor dg = grads[0].to(torch::kBFloat16).reshape({B, nkv, rep, T, D});
    torch::Tensor dq = torch::empty({B, nkv, rep, T, D}, kb.options().dtype(torch::kFloat)), dk, dv;
    for (int64_t i = static_cast<int64_t>(probs.size()) - 1; i >= 0; --i) {
      const int64_t s = i * block, n = std::min(block, T - s), e = s + n;
      const torch::Tensor& p = probs[static_cast<size_t>(i)];
      const torch::Tensor d_o = dg.narrow(3, s, n).reshape({B, nkv, rep * n, D});
      torch::Tensor dpv = torch::matmul(p.to(torch::kBFloat16).transpose(-2, -1), d_o);
      const torch::Tensor ds =
          torch::_softmax_backward_data(
              torch::matmul(d_o, vb.narrow(2, 0, e).transpose(-2, -1)).to(torch::kFloat), p, -1,
              torch::kFloat)
              .to(torch::kBFloat16);
      dq.narrow(3, s, n).copy_(
          torch::matmul(ds, kb.narrow(2, 0, e)).view({B, nkv, rep, n, D}).to(torch::kFloat) *
          scale);
      torch::Tensor dkb = torch::matmul(ds.transpose(-2, -1), qs[static_cast<size_t>(i)]);
      if (e == T) {
        dk = dkb.to(torch::kFloat), dv = dpv.to(torch::kFloat);
      } else {
        dk.narrow(2, 0, e).add_(dkb);
        dv.narrow(2, 0, e).add_(dpv);
      }
    }
    auto as = [&](const torch::Tensor& t, size_t i) {
      return t.to(static_cast<torch::ScalarType>(dtypes[i]));
    };
    return {as(dq.view({B, nh, T, D}), 0),
            as(dk, 1),
            as(dv, 2),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};
#endif

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
  // at 0, and which rows count. Float32 whatever the logits' dtype (bf16 logits are widened
  // kRows rows at a time; for float32 ones .to() is the tensor itself).
  static std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> loss_of(
      const torch::Tensor& logits, const torch::Tensor& target) {
    const int64_t N = logits.size(0);
    const torch::Tensor valid = target.ne(v1::kIgnoreIndex);
    const torch::Tensor t = target.masked_fill(valid.logical_not(), 0);
    torch::Tensor lse = torch::empty({N}, logits.options().dtype(torch::kFloat));
    for (int64_t s = 0; s < N; s += kRows) {
      const int64_t n = std::min(kRows, N - s);
      torch::Tensor out = lse.narrow(0, s, n);
      at::logsumexp_out(out, logits.narrow(0, s, n).to(torch::kFloat), {1}, false);
    }
    // gather throws on a target outside [0, C), as cross_entropy does.
    const torch::Tensor picked = logits.gather(1, t.unsqueeze(1)).squeeze(1).to(torch::kFloat);
    return {torch::where(valid, lse - picked, torch::zeros({}, lse.options())).sum(), lse, t,
            valid};
  }

  static void once(torch::autograd::AutogradContext* ctx) {
    TR_CHECK(
        !ctx->saved_data.count("consumed"),
        "llama: the cross-entropy's backward ran twice on one "
        "graph (retain_graph); the llama model's training loss supports one backward per forward");
    ctx->saved_data["consumed"] = true;
  }

  // d loss / d logits = (softmax - one-hot) * grad per counted row, written over `logits`
  // (contiguous) and returned.
  static torch::Tensor gradient(torch::Tensor logits, const torch::Tensor& lse,
                                const torch::Tensor& t, const torch::Tensor& valid,
                                const torch::Tensor& grad) {
    const torch::Tensor w = valid.to(logits.scalar_type()).mul(grad);  // d loss / d row
    torch::Tensor d =
        logits.is_contiguous() ? logits : torch::empty_like(logits, at::MemoryFormat::Contiguous);
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
// summed loss, with d loss / d h (float32) in the backward. The logits go into `buffer`, kept by
// the model from step to step, so the largest tensor of the step is mapped once per run, not
// twice per step (logits, then their gradient). The buffer is used only when no earlier graph
// still holds it (its storage's only owner is the model); otherwise this call takes a fresh one.
// `bf16`: for a forward under CPU autocast to bfloat16, autocast's numbers without its float32
// [N, C] tensors: the product in bf16 (float32 accumulation, bf16 logits in a bf16 buffer), the
// log-sum-exp and softmax - one-hot in float32 kRows rows at a time (as autocast's float32
// log_softmax of those logits), the gradient rounded to bf16 over the logits for the backward
// product (as autocast's backward casts it). The float32 copy of the logits, its gradient and
// the casts between them were ~10 % of a SmolLM2-135M LoRA step at seq 512.
struct HeadCrossEntropySum : public torch::autograd::Function<HeadCrossEntropySum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& h,
                               const torch::Tensor& weight, const torch::Tensor& target,
                               std::shared_ptr<torch::Tensor> buffer, bool bf16) {
    const int64_t N = h.size(0), C = weight.size(0);
    const torch::ScalarType dt = bf16 ? torch::kBFloat16 : h.scalar_type();
    const torch::Tensor hc = h.to(dt), wc = weight.to(dt);  // the same tensors in float32
    const bool free = !buffer->defined() || buffer->storage().use_count() == 1;
    if (free && (!buffer->defined() || buffer->scalar_type() != dt || buffer->numel() < N * C))
      *buffer = torch::empty({N * C}, hc.options());
    torch::Tensor logits =
        free ? buffer->narrow(0, 0, N * C).view({N, C}) : torch::empty({N, C}, hc.options());
    at::mm_out(logits, hc, wc.t());
    auto [loss, lse, t, valid] = CrossEntropySum::loss_of(logits, target);
    ctx->save_for_backward({wc, lse, t, valid});
    ctx->saved_data["logits"] = logits;  // not a saved variable: the backward overwrites it
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    CrossEntropySum::once(ctx);
    torch::Tensor logits = ctx->saved_data["logits"].toTensor();
    torch::Tensor d;
    if (logits.scalar_type() == torch::kFloat) {
      d = CrossEntropySum::gradient(logits, saved[1], saved[2], saved[3], grads[0]);
    } else {
      const torch::Tensor& lse = saved[1];
      const torch::Tensor& t = saved[2];
      const torch::Tensor w = saved[3].to(torch::kFloat).mul(grads[0]);  // d loss / d row
      constexpr int64_t kRows = CrossEntropySum::kRows;
      for (int64_t s = 0; s < logits.size(0); s += kRows) {
        const int64_t n = std::min(kRows, logits.size(0) - s);
        torch::Tensor rows = logits.narrow(0, s, n).to(torch::kFloat);
        rows.sub_(lse.narrow(0, s, n).unsqueeze(1)).exp_().mul_(w.narrow(0, s, n).unsqueeze(1));
        rows.scatter_add_(1, t.narrow(0, s, n).unsqueeze(1), w.narrow(0, s, n).neg().unsqueeze(1));
        logits.narrow(0, s, n).copy_(rows);
      }
      d = logits;
    }
    torch::Tensor dh = torch::mm(d, saved[0]).to(torch::kFloat);
    ctx->saved_data.erase("logits");  // the buffer is free for the next step's forward
    return {dh, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace trainrun::llama::detail
