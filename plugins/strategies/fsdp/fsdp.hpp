#pragma once
// Strategy `fsdp`: fully sharded data parallelism as PyTorch FSDP users know it, as a policy over
// the SDK's sharding engine (trainrun/strategy/sharded_runtime.hpp) — the same mechanics as `zero`
// stage 3, with FSDP's configuration surface. Reference: Zhao et al., "PyTorch FSDP:
// Experiences on Scaling Fully Sharded Data Parallel" (VLDB 2023); torch.distributed.fsdp.
//
// sharding_strategy:
//  - FULL_SHARD: parameters, gradients and optimizer state sharded over all ranks; a unit's
//    parameters are gathered for its forward, freed after it, gathered again for its backward.
//  - SHARD_GRAD_OP: as FULL_SHARD, but a unit's parameters stay gathered from its forward until
//    its gradients are reduced (no second gather; more memory between forward and backward).
//  - NO_SHARD: every rank keeps everything (DDP-like); gradients are all-reduced per unit.
//  - HYBRID_SHARD: FULL_SHARD within a shard group (the node, or shard_group_size ranks), and
//    replicated across groups: gradients reduce-scattered within the group, then the shard
//    all-reduced across the groups that hold it.
//  - auto: the first of NO_SHARD, SHARD_GRAD_OP, HYBRID_SHARD (several nodes), FULL_SHARD whose
//    memory estimate fits the per-rank budget, with the reason printed.
// Units are the model's Unit wrappers (the gpt's blocks; a model without units is one unit),
// merged in forward order until each holds at least min_num_params parameters.
#include <trainrun/interfaces.hpp>
#include <trainrun/strategy/memory_estimate.hpp>
#include <trainrun/strategy/sharded_runtime.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace trainrun::plugins {

/// The `fsdp` strategy. Options: sharding_strategy, min_num_params, backward_prefetch,
/// forward_prefetch, limit_all_gathers, shard_group_size, memory_budget_gb, and mixed precision
/// as FSDP's MixedPrecision: param_dtype, reduce_dtype, buffer_dtype.
class FsdpStrategy final : public v1::sharding::ShardedStrategy {
 public:
  static void declare_options(v1::OptionSchema& schema);
  FsdpStrategy(const v1::Options& options, const v1::RunContext& ctx);

  /// ShardedStrategy::setup's policy step: the strategy chosen ("auto"), buffers cast, shard
  /// and replicate groups created (HYBRID_SHARD, NO_SHARD), the runtime options. Throws
  /// ConfigError for a shard_group_size that does not divide the world size, when "auto" finds
  /// nothing that fits (naming the smallest world size that would), or for
  /// param_dtype/buffer_dtype fp16 on CPU.
  Plan plan(v1::Model& model, v1::Communicator& world, const v1::TrainPlan& train) override;
  /// ShardedStrategy's (fsdp_gathers, fsdp_flat_bytes, fsdp_max_unit_full_bytes: peak bytes of
  /// gathered unit parameters this step) plus fsdp_unit_bytes (the largest unit).
  void add_step_metrics(std::map<std::string, double>& extra) override;

  const std::string& sharding_strategy() const { return strategy_; }

 private:
  /// Per-rank memory estimates (bytes) of the sharding strategies "auto" chooses from, and the
  /// estimator's inputs at the current world size.
  struct Estimates {
    double no_shard = 0, grad_op = 0, hybrid = 0, full = 0;
    v1::memory::ZeroEstimateInputs world;
  };

  /// Refuses param_dtype/buffer_dtype fp16 on CPU, then casts the floating buffers to
  /// buffer_dtype.
  void apply_dtypes(v1::Model& model) const;
  /// The estimates for shard groups of `group` ranks; sets largest_unit_bytes_.
  Estimates estimate_memory(v1::Model& model, int group);
  /// Sets strategy_ (the configured one, or for "auto" the first that fits the budget) and
  /// returns the banner's reason.
  std::string choose_strategy(const Estimates& est, int group);
  /// The shard and replicate groups of strategy_ with shard groups of `group` ranks, into `p`.
  void create_groups(v1::Communicator& world, int group, Plan& p);

  std::string requested_;
  int64_t min_num_params_;
  std::string backward_prefetch_;
  bool forward_prefetch_;
  bool limit_all_gathers_;
  int64_t shard_group_size_;
  double memory_budget_gb_;
  std::string param_dtype_, reduce_dtype_, buffer_dtype_;  ///< fp32 | bf16 | fp16 (| unchanged)
  std::string context_;

  std::string strategy_;
  double largest_unit_bytes_ = 0;
  std::shared_ptr<v1::Communicator> shard_group_, replicate_group_;
};

}  // namespace trainrun::plugins
