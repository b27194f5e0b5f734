#pragma once
// Strategy `zero`: ZeRO data parallelism, stages 1-3, on the SDK's sharding engine
// (trainrun/strategy/sharding.hpp). Reference: Rajbhandari et al., "ZeRO: Memory Optimizations
// Toward Training Trillion Parameter Models" (SC20); option names and defaults follow DeepSpeed's
// zero_optimization section (sizes in elements).
//
// Every rank owns 1/world_size of each flat parameter and steps only that shard:
//  - stage 1 (P_os): optimizer state sharded. Parameters and gradients stay whole: autograd
//    accumulates the micro-batches into a persistent flat gradient buffer (parameters' .grad
//    are views of it), reduce-scattered once per step, bucket by bucket as backward finishes
//    them; after the optimizer step the updated shards are all-gathered into the parameters.
//  - stage 2 (P_os+g): plus gradients sharded. Every micro-batch's gradients are
//    reduce-scattered bucket by bucket during backward and accumulated into the gradient shard
//    (DeepSpeed refuses no_sync at stage 2; accumulation needs no special case here), and the
//    whole gradients are freed as soon as their bucket is sent.
//  - stage 3 (P_os+g+p): plus parameters sharded. One flat parameter per unit (the model's
//    Unit wrappers; parameters outside units, or shared between units, form a "root" group),
//    gathered before the unit's forward and released after it, gathered again just before the
//    unit's backward (a hook on the unit's output) and released once its gradients are sent.
//    The next units are prefetched (prefetch_bucket_size elements ahead, in forward and in
//    backward order). Parameters smaller than param_persistence_threshold elements stay whole
//    (one persistent group, treated as at stage 2).
// Collectives are issued in a fixed order on every rank: a bucket whose gradients are all in
// waits for every bucket before it in the expected order (reverse registration order).
#include <trainrun/interfaces.hpp>
#include <trainrun/strategy/memory_estimate.hpp>
#include <trainrun/strategy/sharded_runtime.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace trainrun::plugins {

/// The `zero` strategy. Options: stage (1 | 2 | 3 | "auto"), reduce_bucket_size,
/// prefetch_bucket_size, param_persistence_threshold (elements), overlap_comm, memory_budget_gb.
class ZeroStrategy final : public v1::sharding::ShardedStrategy {
 public:
  static void declare_options(v1::OptionSchema& schema);
  ZeroStrategy(const v1::Options& options, const v1::RunContext& ctx);

  /// ShardedStrategy::setup's policy step: chooses the stage ("auto": ConfigError naming the
  /// smallest world size that fits when none does) and the runtime options, over the world.
  Plan plan(v1::Model& model, v1::Communicator& world, const v1::TrainPlan& train) override;
  /// As ShardedStrategy's, measuring the first training forward's live bytes (the one-step
  /// activation probe) when the tracking allocator is there.
  v1::ModelOutput forward(const v1::Batch& batch) override;
  /// ShardedStrategy's (zero_gathers, ...), plus zero_stage, zero_estimate_state_bytes (the
  /// estimator's model state per rank, to set beside mem_model_state_bytes), and with the
  /// tracking allocator zero_activation_bytes (the probe) and zero_estimate_peak_bytes
  /// (estimate total + probe).
  void add_step_metrics(std::map<std::string, double>& extra) override;

  int stage() const { return stage_; }

 private:
  /// Sets stage_ (the configured one, or for "auto" the lowest whose estimate `est` fits the
  /// budget) and returns the banner's reason.
  std::string choose_stage(const v1::memory::ZeroEstimateInputs& in,
                           const std::array<v1::memory::ZeroStageEstimate, 4>& est);

  int64_t requested_stage_;
  int64_t reduce_bucket_elements_;
  int64_t prefetch_elements_;
  int64_t persistence_threshold_;
  bool overlap_;
  double memory_budget_gb_;

  int stage_ = 0;
  double estimate_state_bytes_ = 0;
  double estimate_total_bytes_ = 0;
  double activation_bytes_ = -1;  // the one-step probe; -1 until the first training forward
  bool reported_ = false;
};

}  // namespace trainrun::plugins
