#include "precision.hpp"

#include <trainrun/plugin.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace trainrun::plugins {

bool all_finite_local(const std::vector<at::Tensor>& grads) {
  c10::NoGradGuard no_grad;
  // One flag per tensor, reduced on the tensors' device, then a single host read: a device run
  // synchronises once per step rather than once per parameter.
  std::vector<at::Tensor> flags;
  flags.reserve(grads.size());
  for (const auto& g : grads)
    if (g.defined() && g.numel() > 0) flags.push_back(at::isfinite(g).all());
  if (flags.empty()) return true;
  return at::stack(flags).all().item<bool>();
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
