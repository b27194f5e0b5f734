#include "precision.hpp"

#include <trainrun/plugin.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace trainrun::plugins {

bool all_finite_local(const std::vector<at::Tensor>& grads) {
  c10::NoGradGuard no_grad;
  // As DeepSpeed's overflow check (_has_inf_or_nan): a tensor whose sum is not finite holds an
  // inf or a NaN. One reduction per tensor and no bool copy of it (isfinite(g).all() cost ~2x
  // more); finite values whose sum overflows float also count as overflow, which is what a
  // loss scaler wants anyway. The per-tensor sums are checked together: one host read per step.
  std::vector<at::Tensor> sums;
  sums.reserve(grads.size());
  for (const auto& g : grads)
    if (g.defined() && g.numel() > 0) sums.push_back(g.sum().to(at::kFloat).reshape({1}));
  if (sums.empty()) return true;
  return at::cat(sums).isfinite().all().item<bool>();
}

bool all_finite_agreed(const std::vector<at::Tensor>& grads, Communicator& comm) {
  const bool local = all_finite_local(grads);
  if (comm.world_size() == 1) return local;
  // Communicators need the accelerator's device; the gradients live there. Gloo has no bool
  // type (DESIGN), so the flag travels as float32.
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

void Fp32Precision::declare_options(OptionSchema&) {}

Fp32Precision::Fp32Precision(const Options&, const RunContext&) {}

bool Fp32Precision::unscale_and_check(const std::vector<at::Tensor>& grads,
                                      Communicator& comm) {
  // Loss scale is 1: nothing to divide.
  return all_finite_agreed(grads, comm);
}

}  // namespace trainrun::plugins

// The unit tests compile this file into one binary with the other plugins; each plugin's entry
// symbol has the same name, so the tests leave it out.
#ifndef TRAINRUN_NO_PLUGIN_ENTRY
TRAINRUN_PLUGIN("precision", "0.1.0",
                trainrun::v1::component<trainrun::v1::Precision,
                                        trainrun::plugins::Fp32Precision>(
                    "fp32", "float32 weights and compute; skips steps with non-finite gradients"))
#endif
