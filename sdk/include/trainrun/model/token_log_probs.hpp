#pragma once
// What an ObjectiveModel hands an Objective (ABI 1.8, trainrun/objective.hpp), computed from the
// logits of the positions that count: one function every model can share, so that an objective's
// numbers do not depend on which model computed them.
#include <ATen/ops/arange.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <cstdint>

#include "trainrun/error.hpp"
#include "trainrun/objective.hpp"
#include "trainrun/types.hpp"

namespace trainrun::v1 {

/// The flat positions (int64 [N], indices into the R*T positions of `target` [R, T]) whose target
/// counts (!= kIgnoreIndex), in row-major order: the rows of the hidden states a model projects.
inline at::Tensor counted_positions(const at::Tensor& target) {
  return target.reshape({-1}).ne(kIgnoreIndex).nonzero().squeeze(1);
}

/// TokenLogProbs from the logits at the counted positions.
/// logits: floating [N, V] (computed in float32 whatever their dtype, as TRL's log-probabilities
///         are), the rows for `positions` (counted_positions(target)) in that order;
/// target: int64 [R, T] (the batch's targets); wanted: Objective::kEntropy | kMeanLogits | kTop1.
/// token_logps is differentiable through logits; the statistics are computed without autograd.
/// Throws Error when the shapes disagree.
inline TokenLogProbs token_log_probs(const at::Tensor& logits, const at::Tensor& target,
                                     const at::Tensor& positions, uint32_t wanted) {
  TR_CHECK(target.dim() == 2, "token_log_probs: target must be [R, T], got ", target.sizes());
  TR_CHECK(logits.dim() == 2 && logits.size(0) == positions.size(0),
           "token_log_probs: logits must be [N, V] for the N = ", positions.size(0),
           " counted positions, got ", logits.sizes());
  const int64_t R = target.size(0), T = target.size(1);
  const at::Tensor flat_target = target.reshape({-1}).index_select(0, positions);
  const at::Tensor logp = at::log_softmax(logits.to(at::kFloat), -1);          // [N, V]
  const at::Tensor tok = logp.gather(1, flat_target.unsqueeze(1)).squeeze(1);  // [N]
  auto spread = [&](const at::Tensor& values) {  // [N] -> [R, T], 0 where nothing counts
    return at::zeros({R * T}, values.options()).index_put({positions}, values).view({R, T});
  };
  TokenLogProbs lp;
  lp.token_logps = spread(tok);
  lp.logps = lp.token_logps.sum(1);
  lp.num_tokens = at::zeros({R * T}, target.options().dtype(at::kLong))
                      .index_fill_(0, positions, 1)
                      .view({R, T})
                      .sum(1);
  if (wanted != 0) {
    c10::NoGradGuard no_grad;
    const at::Tensor f = logits.detach().to(at::kFloat);
    if (wanted & Objective::kEntropy)
      lp.entropy = spread(-(logp.detach().exp() * logp.detach()).sum(-1));
    if (wanted & Objective::kMeanLogits) lp.mean_logits = spread(f.mean(-1));
    if (wanted & Objective::kTop1) lp.is_top1 = spread(f.argmax(-1).eq(flat_target));
  }
  return lp;
}

}  // namespace trainrun::v1
