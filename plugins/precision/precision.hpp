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

/// Logical AND of `local` over the ranks of `comm` (a Min all-reduce of one float32 on the
/// device of the first defined tensor in `grads`, CPU when none). Communicates only when
/// world_size > 1; every rank must call it.
bool all_ranks_agree(bool local, const std::vector<at::Tensor>& grads, Communicator& comm);

class Fp32Precision final : public Precision, public PrecisionBytes {
 public:
  static void declare_options(OptionSchema& schema);
  Fp32Precision(const Options& options, const RunContext& ctx);
  bool unscale_and_check(const std::vector<at::Tensor>& grads, Communicator& comm) override;
  /// float32 weights and gradients, no master copy.
  double param_bytes() const override { return 4; }
  double grad_bytes() const override { return 4; }
  double master_bytes() const override { return 0; }
};

}  // namespace trainrun::plugins
