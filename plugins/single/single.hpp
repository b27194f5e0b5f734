#pragma once
// Strategy `single`: one process, the whole model, no communication. The reference every other
// strategy must reproduce (DESIGN invariant 1).
#include <trainrun/interfaces.hpp>

#include <vector>

namespace trainrun::plugins {

using namespace trainrun::v1;

class SingleStrategy final : public Strategy, public CheckpointableStrategy {
 public:
  static void declare_options(OptionSchema& schema);
  SingleStrategy(const Options& options, const RunContext& ctx);

  void setup(Model& model, Accelerator& accelerator, const TrainPlan& plan) override;
  std::vector<NamedTensor> optimizer_parameters() override;
  ModelOutput forward(const Batch& batch) override;
  void finish_gradient_sync() override {}
  double grad_norm() override;
  void zero_grad() override;
  std::vector<NamedTensor> full_state_dict() override;
  /// ABI 1.4 (checkpoints): replicated, so every tensor whole at offset 0, written by rank 0
  /// and loaded on every rank from the same bytes (the replicas stay identical).
  std::vector<CheckpointPiece> optimizer_parameter_pieces() override;
  std::vector<CheckpointPiece> model_checkpoint_pieces() override;
  void after_checkpoint_load() override {}

 private:
  void check_setup(const char* what) const;

  Model* model_ = nullptr;
  c10::Device device_{c10::kCPU};
  std::vector<NamedTensor> params_;     ///< every parameter, trainable or frozen
  std::vector<NamedTensor> trainable_;  ///< those with requires_grad, for the optimizer
};

}  // namespace trainrun::plugins
