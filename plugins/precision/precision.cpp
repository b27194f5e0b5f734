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
  return all_ranks_agree(all_finite_local(grads), grads, comm);
}

bool all_ranks_agree(bool local, const std::vector<at::Tensor>& grads, Communicator& comm) {
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
#include "mixed.hpp"
TRAINRUN_PLUGIN("precision", "0.2.0",
                trainrun::v1::component<trainrun::v1::Precision,
                                        trainrun::plugins::Fp32Precision>(
                    "fp32", "float32 weights and compute; skips steps with non-finite gradients"),
                trainrun::v1::component<trainrun::v1::Precision, trainrun::plugins::Bf16Mixed>(
                    "bf16-mixed", "autocast to bfloat16 for matmul-class ops; float32 weights, "
                    "gradients and optimizer state; no loss scaling"),
                trainrun::v1::component<trainrun::v1::Precision, trainrun::plugins::Bf16True>(
                    "bf16-true", "bfloat16 weights and gradients; the optimizer keeps float32 "
                    "master weights and state"),
                trainrun::v1::component<trainrun::v1::Precision, trainrun::plugins::Fp16Mixed>(
                    "fp16-mixed", "dynamic loss scaling (DeepSpeed semantics); float16 autocast "
                    "on CUDA; on CPU the compute stays float32 (no float16 kernels)"),
                trainrun::v1::component<trainrun::v1::Precision, trainrun::plugins::AutoPrecision>(
                    "auto", "bf16-mixed where the CPU computes bfloat16 natively, else fp32; "
                    "prints the choice"))
#endif
