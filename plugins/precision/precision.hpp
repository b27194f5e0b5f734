#pragma once
// Precision components. `fp32`: the model stays in float32, no autocast, no loss scaling, but
// the finite-gradient check is real, so a NaN/inf loss skips the step visibly instead of
// poisoning the weights.
#include <trainrun/interfaces.hpp>

#include <vector>

namespace trainrun::plugins {

using namespace trainrun::v1;

/// True when every element of every defined tensor in `grads` is finite on this rank. Undefined
/// tensors (parameters without a gradient) count as finite.
bool all_finite_local(const std::vector<at::Tensor>& grads);

/// all_finite_local agreed across the ranks of `comm` (logical AND via a Min all-reduce), so
/// every rank skips the step or none does. Communicates only when world_size > 1.
bool all_finite_agreed(const std::vector<at::Tensor>& grads, Communicator& comm);

class Fp32Precision final : public Precision {
 public:
  static void declare_options(OptionSchema& schema);
  Fp32Precision(const Options& options, const RunContext& ctx);
  bool unscale_and_check(const std::vector<at::Tensor>& grads, Communicator& comm) override;
};

}  // namespace trainrun::plugins
