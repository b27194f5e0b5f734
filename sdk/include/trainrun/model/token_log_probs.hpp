#pragma once
// What an ObjectiveModel hands an Objective (ABI 1.8, trainrun/objective.hpp), computed from the
// logits of the positions that count: one function every model can share, so that an objective's
// numbers do not depend on which model computed them.
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/ones.h>
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

/// ABI 1.10. `lp` of a packed batch (`target` int64 [R, T], Batch::segment_ids int64 [R, T])
/// with one row per sequence:
/// each run of equal segment ids within a row is one sequence, numbered in row-major order, and
/// becomes row k of the result, left-aligned and zero-filled to the longest sequence's length L
/// (float32/int64/bool [S, L] like token_log_probs' tensors; logps and num_tokens [S]). A
/// dataset that packs objective batches should not pad them: a padding run (a segment of its own)
/// becomes a sequence without a counted token. Differentiable through lp.token_logps. Throws
/// Error when segment_ids is not [R, T] like lp.token_logps. Reference: TRL's padding_free
/// batches (one flattened row, position_ids restarting per sequence), whose per-sequence
/// log-probability sums are those of the padded batch.
inline TokenLogProbs per_sequence(const TokenLogProbs& lp, const at::Tensor& target,
                                  const at::Tensor& segment_ids) {
  TR_CHECK(segment_ids.dim() == 2 && segment_ids.sizes() == lp.token_logps.sizes() &&
               target.sizes() == segment_ids.sizes(),
           "per_sequence: segment_ids and target must be [R, T] like the log-probabilities ",
           lp.token_logps.sizes(), ", got ", segment_ids.sizes(), " and ", target.sizes());
  const at::Tensor seg = segment_ids.to(lp.token_logps.device(), at::kLong);
  const int64_t R = seg.size(0), T = seg.size(1);
  // A position starts a sequence at column 0 or where the segment id changes.
  const at::Tensor starts = at::cat({at::ones({R, 1}, seg.options().dtype(at::kBool)),
                                     seg.slice(1, 1, T).ne(seg.slice(1, 0, T - 1))},
                                    1)
                                .reshape({-1});
  const at::Tensor seq = starts.cumsum(0) - 1;           // [R*T]: sequence of each
  const at::Tensor first = starts.nonzero().squeeze(1);  // [S]: its first position
  const at::Tensor col = at::arange(R * T, seq.options()) - first.index_select(0, seq);
  const int64_t S = first.size(0), L = col.max().item<int64_t>() + 1;
  const at::Tensor dest = seq * L + col;
  auto regroup = [&](const at::Tensor& t) {  // [R, T] -> [S, L]
    if (!t.defined()) return t;
    return at::zeros({S * L}, t.options()).index_put({dest}, t.reshape({-1})).view({S, L});
  };
  TokenLogProbs out;
  out.token_logps = regroup(lp.token_logps);
  out.logps = out.token_logps.sum(1);
  out.num_tokens = regroup(target.to(seg.device()).ne(kIgnoreIndex).to(at::kLong)).sum(1);
  out.entropy = regroup(lp.entropy);
  out.mean_logits = regroup(lp.mean_logits);
  out.is_top1 = regroup(lp.is_top1);
  return out;
}

}  // namespace trainrun::v1
