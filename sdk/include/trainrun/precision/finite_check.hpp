#pragma once
// The finite-gradient check every Precision owes (Precision::unscale_and_check), shared by the
// shipped precisions so that a third-party one can agree on overflow the same way.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <vector>

#include "trainrun/interfaces.hpp"

namespace trainrun::v1 {

/// True when every element of every defined tensor in `grads` is finite on this rank. Undefined
/// or empty tensors (parameters without a gradient) count as finite. As DeepSpeed's overflow
/// check (_has_inf_or_nan): a tensor whose sum is not finite holds an inf or a NaN; one
/// reduction per tensor (isfinite(g).all() costs about 2x more) and one host read for all of
/// them. Finite values whose float32 sum overflows also count as overflow, which is what a loss
/// scaler wants anyway.
inline bool all_finite_local(const std::vector<at::Tensor>& grads) {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> sums;
  sums.reserve(grads.size());
  for (const auto& g : grads)
    if (g.defined() && g.numel() > 0) sums.push_back(g.sum().to(at::kFloat).reshape({1}));
  if (sums.empty()) return true;
  return at::cat(sums).isfinite().all().item<bool>();
}

/// Logical AND of `local` over the ranks of `comm`: a Min all-reduce of one float32 (Gloo has
/// no bool type) on the device of the first defined tensor in `grads`, CPU when none, so every
/// rank skips a step or none does. Communicates only when world_size > 1; every rank must call
/// it. Throws what the communicator throws (a timeout names the missing ranks).
inline bool all_ranks_agree(bool local, const std::vector<at::Tensor>& grads, Communicator& comm) {
  if (comm.world_size() == 1) return local;
  c10::Device device(c10::kCPU);
  for (const auto& g : grads)
    if (g.defined()) {
      device = g.device();
      break;
    }
  at::Tensor flag = at::full({1}, local ? 1.0f : 0.0f, at::TensorOptions().device(device));
  AllReduceOptions opts;
  opts.op = ReduceOp::Min;
  comm.all_reduce(flag, opts)->wait();
  return flag.item<float>() > 0.5f;
}

/// all_finite_local agreed across the ranks of `comm`.
inline bool all_finite_agreed(const std::vector<at::Tensor>& grads, Communicator& comm) {
  return all_ranks_agree(all_finite_local(grads), grads, comm);
}

}  // namespace trainrun::v1
