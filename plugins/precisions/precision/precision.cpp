#include "precision.hpp"

#include <trainrun/plugin.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace trainrun::plugins {

using namespace trainrun::v1;

void Fp32Precision::declare_options(OptionSchema&) {}

Fp32Precision::Fp32Precision(const Options&, const RunContext&) {}

bool Fp32Precision::unscale_and_check(const std::vector<at::Tensor>& grads,
                                      Communicator& comm) {
  // Loss scale is 1: nothing to divide.
  return all_finite_agreed(grads, comm);
}

}  // namespace trainrun::plugins
