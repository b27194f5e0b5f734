#pragma once
// Precision components. `fp32`: the model stays in float32, no autocast, no loss scaling, but
// the finite-gradient check is real, so a NaN/inf loss skips the step visibly instead of
// poisoning the weights.
#include <trainrun/interfaces.hpp>
#include <trainrun/precision/finite_check.hpp>

#include <vector>

namespace trainrun::plugins {

// all_finite_local, all_ranks_agree and all_finite_agreed come from
// trainrun/precision/finite_check.hpp.

class Fp32Precision final : public v1::Precision, public v1::PrecisionBytes {
 public:
  static void declare_options(v1::OptionSchema& schema);
  Fp32Precision(const v1::Options& options, const v1::RunContext& ctx);
  bool unscale_and_check(const std::vector<at::Tensor>& grads, v1::Communicator& comm) override;
  /// float32 weights and gradients, no master copy.
  double param_bytes() const override { return 4; }
  double grad_bytes() const override { return 4; }
  double master_bytes() const override { return 0; }
};

}  // namespace trainrun::plugins
