#include "precision.hpp"

#include <trainrun/plugin.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace trainrun::plugins {

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
