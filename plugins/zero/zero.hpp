#pragma once
// Strategy `zero`: ZeRO data parallelism, stages 1-3, on the SDK's sharding engine
// (trainrun/sharding.hpp). Reference: Rajbhandari et al., "ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models" (SC20); option names and defaults follow DeepSpeed's
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
#include <trainrun/sharding.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace trainrun::plugins {

using namespace trainrun::v1;

/// The `zero` strategy. Options: stage (1 | 2 | 3 | "auto"), reduce_bucket_size,
/// prefetch_bucket_size, param_persistence_threshold (elements), overlap_comm, memory_budget_gb.
class ZeroStrategy final : public Strategy,
                           public StepMetricsSource,
                           public MemoryInputsAware,
                           public UnitHooks,
                           public UnitOutputHooks {
 public:
  static void declare_options(OptionSchema& schema);
  ZeroStrategy(const Options& options, const RunContext& ctx);
  /// Removes the gradient hooks and unit hooks: they point at this object.
  ~ZeroStrategy() override;

  void set_memory_inputs(const MemoryInputs& inputs) override;
  /// Checks the model is the same on every rank, broadcasts rank 0's values, chooses the stage
  /// ("auto"), builds the flat parameters and installs the hooks.
  void setup(Model& model, Accelerator& accelerator, const TrainPlan& plan) override;
  /// This rank's pieces of every flat parameter (1-D, named like their parameters).
  std::vector<NamedTensor> optimizer_parameters() override;
  /// Stage 3 gathers the root group first (and keeps it until backward ends).
  ModelOutput forward(const Batch& batch) override;
  void before_backward(bool sync) override;
  void finish_gradient_sync() override;
  double grad_norm() override;
  void after_optimizer_step() override;
  void zero_grad() override;
  std::vector<NamedTensor> full_state_dict() override;
  /// comm_bytes, comm_exposed_s, stage, gathers (all-gathers this step), and per-rank bytes of
  /// model state held by the flat parameters (zero_state_bytes).
  void add_step_metrics(std::map<std::string, double>& extra) override;

  // Stage 3 unit hooks.
  void pre_forward(Unit& unit) override;
  void post_forward(Unit& unit) override;
  void on_output(Unit& unit, at::Tensor& output) override;

  int stage() const { return stage_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Group {
    std::unique_ptr<sharding::FlatParameter> flat;
    std::vector<size_t> params;  // indices into grads_
    size_t pending = 0;          // parameters whose gradient has not arrived in this pass
    int unit = -1;               // stage 3: index into units_, -1 for root/persistent/buckets
    bool root = false;
  };

  void build_groups(Model& model);
  void install_hooks();
  void on_grad_ready(size_t param);
  void launch_ready_locked(bool flush);
  void drain_locked();
  void start_pass_locked();
  void prefetch_forward(int unit);
  void prefetch_backward(int unit);
  void check_setup(const char* what) const;

  // Options.
  int64_t requested_stage_;
  int64_t reduce_bucket_elements_;
  int64_t prefetch_elements_;
  int64_t persistence_threshold_;
  bool overlap_;
  double memory_budget_gb_;
  int rank_, world_size_;
  MemoryInputs memory_inputs_;

  int stage_ = 0;
  std::string stage_reason_;
  Model* model_ = nullptr;
  Communicator* comm_ = nullptr;
  c10::Device device_{c10::kCPU};
  std::vector<NamedTensor> all_params_;   // as the model lists them
  std::vector<NamedTensor> frozen_;       // requires_grad = false: left whole, replicated
  std::vector<NamedTensor> grads_;        // trainable, de-duplicated (tied weights once)
  std::vector<size_t> group_of_;          // grads_ index -> group index
  std::vector<Group> groups_;             // in reduce order
  std::vector<int> unit_group_;           // stage 3: unit index -> group index
  std::vector<Unit*> units_;
  std::map<const Unit*, int> unit_index_;
  int root_group_ = -1;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  std::mutex mu_;
  bool sync_ = true;
  bool pass_open_ = false;
  size_t next_launch_ = 0;
  std::vector<size_t> in_flight_;  // groups with a reduce-scatter started, in launch order

  // Metrics of the current step.
  double comm_bytes_ = 0;
  double exposed_s_ = 0;
  double gathers_ = 0;
};

}  // namespace trainrun::plugins
