#pragma once
// trainrun::v1::attention: scaled dot-product attention for the model plugins, one function for
// every LibTorch trainrun builds against.
//
//   out = softmax(q k^T * scale + mask) v        (Vaswani et al. 2017, eq. 1)
//
// On LibTorch >= 2.1 it calls at::scaled_dot_product_attention (fused flash / memory-efficient
// kernels where the device and dtype allow, the math kernel elsewhere); on older LibTorch
// (Debian's 1.13 has no public SDPA, and 2.0's has no `scale` argument) it runs the same
// computation as matmul + masked softmax, as transformers' "eager" attention does.
// attention_math() is that explicit form on every version, so a test can compare the two.
//
// Causal masking is aligned to the bottom right, as a KV cache needs: with Tq queries and Tk >=
// Tq keys, query i stands at absolute position Tk - Tq + i and sees keys 0 .. Tk - Tq + i. (For
// Tq == Tk this is the usual lower triangle, what SDPA's is_causal means; SDPA's is_causal is
// top-left aligned for Tq != Tk, so that case goes through an explicit mask.)
#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <optional>

#include "trainrun/error.hpp"

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define TRAINRUN_HAS_SDPA 1
#else
#define TRAINRUN_HAS_SDPA 0
#endif

namespace trainrun::v1 {

/// Options of attention(); one struct so call sites stay readable.
struct AttentionOptions {
  /// Query i may not see keys after its own position (bottom-right aligned, see above).
  bool causal = true;
  /// Optional extra mask, broadcastable to [B, H, Tq, Tk]: bool (true = may attend, SDPA's
  /// convention) or floating point (added to the scores; -inf removes a key). Combined with
  /// `causal` (both must allow a key).
  std::optional<at::Tensor> mask;
  /// Sliding window (Mistral): > 0 also hides keys at distance >= window behind the query.
  int64_t window = 0;
  /// Dropout on the attention weights; applied only when `training` is true.
  double dropout_p = 0.0;
  bool training = false;
  /// Multiplier of q k^T; default 1/sqrt(head_dim).
  std::optional<double> scale;
  /// Soft-capping of the scaled scores before the mask, cap * tanh(s / cap) (Gemma 2's
  /// attn_logit_softcapping); computed by attention_math() on every LibTorch (SDPA has none).
  std::optional<double> softcap;
};

namespace detail {

// The keys each query may see as a bool [Tq, Tk] (true = may attend), or undefined when
// nothing is masked.
inline at::Tensor attention_visibility(int64_t tq, int64_t tk, const AttentionOptions& o,
                                       c10::Device device) {
  if (!o.causal && o.window <= 0) return {};
  const auto idx = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor i = at::arange(tk - tq, tk, idx).unsqueeze(1);  // absolute query positions
  at::Tensor j = at::arange(tk, idx).unsqueeze(0);
  at::Tensor ok = at::ones({tq, tk}, idx.dtype(at::kBool));
  if (o.causal) ok = ok & (j <= i);
  if (o.window > 0) ok = ok & ((i - j) < o.window);
  return ok;
}

// Grouped-query attention: each of the Hkv key/value heads serves H/Hkv consecutive query heads.
inline at::Tensor repeat_kv(const at::Tensor& t, int64_t h) {
  const int64_t hkv = t.size(1);
  if (hkv == h) return t;
  return t.unsqueeze(2)
      .expand({t.size(0), hkv, h / hkv, t.size(2), t.size(3)})
      .reshape({t.size(0), h, t.size(2), t.size(3)});
}

inline void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionOptions& o) {
  TR_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
           "attention: q, k, v must be [batch, heads, tokens, head_dim], got q ", q.sizes(),
           ", k ", k.sizes(), ", v ", v.sizes());
  TR_CHECK(k.sizes() == v.sizes(), "attention: k ", k.sizes(), " and v ", v.sizes(),
           " differ in shape");
  TR_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), "attention: q ", q.sizes(),
           " and k ", k.sizes(), " differ in batch or head_dim");
  TR_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "attention: ", q.size(1),
           " query heads are not a multiple of ", k.size(1), " key/value heads");
  TR_CHECK(!o.causal || k.size(2) >= q.size(2), "attention: causal with ", q.size(2),
           " queries needs at least as many keys, got ", k.size(2));
  TR_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
           "attention: q, k, v dtypes differ (", q.scalar_type(), ", ", k.scalar_type(), ", ",
           v.scalar_type(), ")");
  TR_CHECK(o.dropout_p >= 0.0 && o.dropout_p < 1.0, "attention: dropout_p ", o.dropout_p,
           " is outside [0, 1)");
  TR_CHECK(!o.softcap || *o.softcap > 0, "attention: softcap must be positive, got ",
           o.softcap.value_or(0.0));
}

// The user mask and the causal/window visibility as one mask: bool when the user's is bool
// (or absent), else additive in q's dtype.
inline std::optional<at::Tensor> combined_mask(const at::Tensor& q, const at::Tensor& k,
                                               const AttentionOptions& o) {
  at::Tensor vis = attention_visibility(q.size(2), k.size(2), o, q.device());
  if (!o.mask) {
    if (!vis.defined()) return std::nullopt;
    return vis;
  }
  const at::Tensor& m = *o.mask;
  if (m.scalar_type() == at::kBool) return vis.defined() ? at::Tensor(m & vis) : m;
  TR_CHECK(at::isFloatingType(m.scalar_type()), "attention: mask has dtype ", m.scalar_type(),
           "; expected bool (true = may attend) or floating point (added to the scores)");
  at::Tensor add = m.to(q.scalar_type());
  if (vis.defined())
    add = add.masked_fill(vis.logical_not(), -std::numeric_limits<double>::infinity());
  return add;
}

}  // namespace detail

/// The explicit form on every LibTorch, step for step as transformers' eager attention:
/// scores = q k^T * scale in q's dtype, the mask applied (-inf where a bool mask is false, an
/// additive mask added), softmax in float32, cast back to q's dtype, times v.
/// q: [B, H, Tq, D]; k, v: [B, Hkv, Tk, D] with H a multiple of Hkv (grouped-query attention);
/// any floating dtype, all three equal. Returns [B, H, Tq, D] in q's dtype. Throws Error on
/// mismatched shapes or dtypes.
inline at::Tensor attention_math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const AttentionOptions& o = {}) {
  detail::check_attention_inputs(q, k, v, o);
  const int64_t h = q.size(1);
  const at::Tensor kk = detail::repeat_kv(k, h), vv = detail::repeat_kv(v, h);
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  at::Tensor att = at::matmul(q, kk.transpose(-2, -1)) * scale;
  if (o.softcap) att = at::tanh(att / *o.softcap) * *o.softcap;
  if (auto m = detail::combined_mask(q, k, o)) {
    if (m->scalar_type() == at::kBool)
      att = att.masked_fill(m->logical_not(), -std::numeric_limits<float>::infinity());
    else
      att = att + *m;
  }
  att = at::softmax(att, -1, at::kFloat).to(q.scalar_type());
  if (o.training && o.dropout_p > 0) att = at::dropout(att, o.dropout_p, /*train=*/true);
  return at::matmul(att, vv);
}

/// Scaled dot-product attention; shapes, dtypes and masking as attention_math(). On LibTorch
/// >= 2.1 at::scaled_dot_product_attention (TRAINRUN_HAS_SDPA == 1), else attention_math().
/// The two agree to rounding (tests/unit/unit_attention.cpp); dropout draws differ between them.
inline at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionOptions& o = {}) {
#if TRAINRUN_HAS_SDPA
  if (o.softcap) return attention_math(q, k, v, o);
  detail::check_attention_inputs(q, k, v, o);
  const double p = o.training ? o.dropout_p : 0.0;
  const int64_t h = q.size(1);
  const at::Tensor kk = detail::repeat_kv(k, h), vv = detail::repeat_kv(v, h);
  // The plain causal square is SDPA's is_causal, which lets it pick the fused kernels.
  if (!o.mask && o.causal && o.window <= 0 && q.size(2) == k.size(2))
    return at::scaled_dot_product_attention(q, kk, vv, std::nullopt, p, /*is_causal=*/true,
                                            o.scale);
  return at::scaled_dot_product_attention(q, kk, vv, detail::combined_mask(q, k, o), p,
                                          /*is_causal=*/false, o.scale);
#else
  return attention_math(q, k, v, o);
#endif
}

}  // namespace trainrun::v1
