#pragma once
// Strategy `ddp`: data parallelism with PyTorch DistributedDataParallel's reducer behaviour.
// Every rank holds the whole model; after setup (same shapes checked, rank 0's values
// broadcast) each rank backpropagates its own share of the global batch, and the gradients are
// averaged over the ranks in flat buckets whose all-reduces start while backward still runs.
//
// The algorithm, as in torch/csrc/distributed/c10d/reducer.cpp:
//  - Trainable parameters are grouped, in the order their gradients are expected to become
//    ready (reverse registration order at first), into buckets of at most bucket_cap_mb, the
//    first one capped at first_bucket_mb so that communication starts early in backward.
//  - A post-hook on each parameter's gradient accumulator fires once the gradient of this
//    backward is final. On a sync backward the hook copies it into its bucket slot; a bucket
//    whose every parameter is in is all-reduced asynchronously, strictly in bucket order, so
//    every rank issues the same collectives in the same order (the backends check it).
//  - finish_gradient_sync() launches what is left, waits, and points each parameter's gradient
//    at its averaged slot. After the first step the buckets are rebuilt once in the order the
//    gradients actually arrived on rank 0 (broadcast, so every rank builds the same buckets).
#include <trainrun/interfaces.hpp>
#include <trainrun/strategy/replicated_strategy.hpp>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace trainrun::plugins {

namespace ddp {

/// One gradient to be placed in a bucket: its index (in the caller's numbering), its size in
/// bytes and its dtype (a bucket is one flat tensor, so it holds a single dtype).
struct BucketItem {
  size_t index = 0;
  int64_t bytes = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

/// Groups gradients into buckets, PyTorch's compute_bucket_assignment_by_size with a strict
/// cap. `order` is the order the gradients are expected to become ready (reverse registration
/// order, or the order observed in a step); each dtype fills its own open bucket in that order,
/// the first bucket of a dtype up to `first_cap_bytes`, later ones up to `cap_bytes`. A bucket
/// is closed before an item would push it over its cap, so no bucket exceeds its cap except
/// one holding a single item larger than the cap (that item gets a bucket of its own).
/// Buckets are returned in the order of their first item in `order`, which is the order they
/// are launched. Pure function (unit-tested); caps must be > 0.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketItem>& order,
                                                int64_t first_cap_bytes, int64_t cap_bytes);

}  // namespace ddp

/// The `ddp` strategy. Options: bucket_cap_mb (25), first_bucket_mb (1), overlap (true),
/// find_unused_parameters (false), gradient_compression ("none" | "fp16" | "bf16").
class DdpStrategy final : public v1::ReplicatedStrategy {
 public:
  static void declare_options(v1::OptionSchema& schema);
  DdpStrategy(const v1::Options& options, const v1::RunContext& ctx);

  /// ReplicatedStrategy::prepare (same model on every rank, rank 0's values broadcast), then
  /// builds the buckets and installs the gradient-ready hooks.
  void setup(v1::Model& model, v1::Accelerator& accelerator, const v1::TrainPlan& plan) override;
  /// The batch moved to the device and run through the model (as `single`).
  v1::ModelOutput forward(const v1::Batch& batch) override;
  /// sync = false: the coming backward only accumulates locally (no communication).
  void before_backward(bool sync) override;
  /// Launches the buckets not yet launched, waits for all, and leaves every trainable
  /// parameter's gradient averaged over the ranks (undefined for one no rank used).
  void finish_gradient_sync() override;
  /// comm_bytes, comm_exposed_s, buckets and buckets_overlapped of the step just finished.
  void add_step_metrics(std::map<std::string, double>& extra) override;

  /// Parameter names per bucket, in launch order (for tests and diagnostics).
  std::vector<std::vector<std::string>> bucket_layout() const;
  /// Buckets launched from the backward hooks (before finish_gradient_sync) in the last step.
  int64_t buckets_launched_in_backward() const { return last_launched_in_backward_; }

 private:
  /// A flat gradient buffer of one dtype and the all-reduce that averages it.
  struct Bucket {
    std::vector<size_t> params;  ///< indices into grads_, in slot order
    at::Tensor flat;             ///< the gradients, in the parameters' dtype
    at::Tensor wire;             ///< what is all-reduced: `flat`, or its compressed copy
    size_t pending = 0;          ///< parameters not yet ready in this sync pass
    std::shared_ptr<v1::Work> work;  ///< set once launched
  };
  /// Per trainable parameter (deduplicated by tensor): where its slot is and its state in the
  /// current sync pass.
  struct GradSlot {
    std::string name;
    at::Tensor param;
    size_t bucket = 0;
    int64_t offset = 0;
    bool ready = false;  ///< its hook fired in the current sync backward
  };

  /// (Re)allocates the buckets for gradients expected in `order` (grads_ indices).
  void build_buckets(const std::vector<size_t>& order);
  /// Clears the per-step state before the next sync backward.
  void reset_pass();
  /// The hook body: called after parameter `i`'s gradient was accumulated.
  void on_grad_ready(size_t i);
  /// Puts parameter i's gradient (used) or zeros (unused) into its bucket slot.
  void mark_ready_locked(size_t i, bool used);
  /// Launches, in bucket order, every bucket whose parameters are all ready.
  void launch_ready_buckets_locked(bool from_backward);
  void launch_locked(Bucket& b);
  /// Once, after the first step: buckets in the order rank 0 observed (broadcast).
  void rebuild_buckets_locked();

  // Options.
  int64_t cap_bytes_;
  int64_t first_cap_bytes_;
  bool overlap_;
  bool find_unused_;
  v1::GradientCompression compression_;

  std::vector<GradSlot> grads_;         ///< distinct trainable tensors, registration order
  std::vector<Bucket> buckets_;

  // State of the current step, guarded by mu_ (hooks may run on autograd's device threads).
  std::mutex mu_;
  bool sync_ = true;
  size_t next_launch_ = 0;              ///< buckets are launched strictly in index order
  std::vector<size_t> ready_order_;     ///< grads_ indices in the order they became ready
  std::vector<uint8_t> used_;           ///< per grads_ entry: got a gradient on this rank
  int64_t cur_bytes_ = 0;               ///< all-reduced payload so far in this step
  int64_t cur_launched_in_backward_ = 0;
  bool rebuilt_ = false;

  // Metrics of the step just finished.
  int64_t last_comm_bytes_ = 0;
  double exposed_s_ = 0;
  int64_t last_launched_in_backward_ = 0;
};

}  // namespace trainrun::plugins
