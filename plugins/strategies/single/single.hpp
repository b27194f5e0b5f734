#pragma once
// Strategy `single`: one process, the whole model, no communication. The reference every other
// strategy must reproduce (docs/design.md, invariant 1).
#include <trainrun/interfaces.hpp>

#include <vector>

namespace trainrun::plugins {

class SingleStrategy final : public v1::Strategy, public v1::CheckpointableStrategy {
 public:
  static void declare_options(v1::OptionSchema& schema);
  SingleStrategy(const v1::Options& options, const v1::RunContext& ctx);

  void setup(v1::Model& model, v1::Accelerator& accelerator, const v1::TrainPlan& plan) override;
  std::vector<v1::NamedTensor> optimizer_parameters() override;
  v1::ModelOutput forward(const v1::Batch& batch) override;
  void finish_gradient_sync() override {}
  double grad_norm() override;
  void zero_grad() override;
  std::vector<v1::NamedTensor> full_state_dict() override;
  /// ABI 1.4 (checkpoints): replicated, so every tensor whole at offset 0, written by rank 0
  /// and loaded on every rank from the same bytes (the replicas stay identical).
  std::vector<v1::CheckpointPiece> optimizer_parameter_pieces() override;
  std::vector<v1::CheckpointPiece> model_checkpoint_pieces() override;
  void after_checkpoint_load() override {}

 private:
  void check_setup(const char* what) const;

  v1::Model* model_ = nullptr;
  c10::Device device_{c10::kCPU};
  std::vector<v1::NamedTensor> params_;     ///< every parameter, trainable or frozen
  std::vector<v1::NamedTensor> trainable_;  ///< those with requires_grad, for the optimizer
};

}  // namespace trainrun::plugins
