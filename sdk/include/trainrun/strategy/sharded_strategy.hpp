#pragma once
// ShardedStrategy, the base of the strategies built on ShardedRuntime (zero, fsdp, a third
// party's): setup() as a template method over the derived strategy's plan(), and the Strategy
// calls delegated to the runtime; with model_statistics, the model figures their memory
// estimates start from.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "trainrun/deferred_weights.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/strategy/replicas.hpp"
#include "trainrun/strategy/sharded_engine.hpp"
#include "trainrun/strategy/sharded_policy.hpp"
#include "trainrun/strategy/sharding.hpp"
#include "trainrun/strategy/strategy_helpers.hpp"

namespace trainrun::v1::sharding {

/// The model figures the sharded strategies' memory estimates need, in elements: trainable
/// parameters (a tied tensor once), those below `persistence_threshold` (kept whole, never
/// sharded), and the largest unit's trainable parameters at or above the threshold (a model
/// without units: every trainable parameter that is not kept whole).
struct ModelStatistics {
  int64_t params = 0;
  int64_t persistent = 0;
  int64_t largest_unit = 0;
  /// Frozen parameters (a LoRA base, quantized or not) as the sharded engine holds them: those
  /// of exactly one unit (sharded with it at stage 3: count and bytes as stored, e.g. NF4's
  /// packed codes), and the bytes of the others (kept whole on every rank).
  int64_t frozen = 0;
  double frozen_bytes = 0, whole_frozen_bytes = 0;
};
inline ModelStatistics model_statistics(Model& model, int64_t persistence_threshold = 0) {
  ModelStatistics s;
  std::set<const void*> seen;
  std::map<const void*, int64_t> numel_of;
  const auto units = model.units();
  const std::map<const void*, int> unit_of = unit_of_each_parameter(units);  // -1: several units
  for (const auto& p : model.named_parameters()) {
    if (!seen.insert(p.tensor.unsafeGetTensorImpl()).second) continue;
    if (!p.tensor.requires_grad()) {
      const double bytes =
          static_cast<double>(p.tensor.numel()) * static_cast<double>(p.tensor.element_size());
      auto it = unit_of.find(p.tensor.unsafeGetTensorImpl());
      if (it == unit_of.end() || it->second < 0) {
        s.whole_frozen_bytes += bytes;
      } else {
        s.frozen += p.tensor.numel();
        s.frozen_bytes += bytes;
      }
      continue;
    }
    s.params += p.tensor.numel();
    numel_of[p.tensor.unsafeGetTensorImpl()] = p.tensor.numel();
    if (p.tensor.numel() < persistence_threshold) s.persistent += p.tensor.numel();
  }
  for (Unit* u : units) {
    int64_t n = 0;
    for (const auto& t : u->module().parameters(true)) {
      auto it = numel_of.find(t.unsafeGetTensorImpl());
      if (it != numel_of.end() && it->second >= persistence_threshold) n += it->second;
    }
    s.largest_unit = std::max(s.largest_unit, n);
  }
  if (units.empty()) s.largest_unit = s.params - s.persistent;
  return s;
}

/// What every strategy built on ShardedRuntime does the same way: setup() as a template method
/// (prepare(), then the derived strategy's plan(), then the runtime), the Strategy calls
/// delegated to the runtime, metrics, memory inputs and the sharded state dict. A derived
/// strategy implements plan() and adds its own figures in add_step_metrics(). zero and fsdp
/// are the two shipped ones.
class ShardedStrategy : public Strategy,
                        public StepMetricsSource,
                        public MemoryInputsAware,
                        public ShardedStateDictSource,
                        public CheckpointableStrategy,
                        public DeferredWeightsLoader,
                        public FullParameters {
 public:
  /// `name` for messages, e.g. "strategy 'zero'".
  ShardedStrategy(std::string name, const RunContext& ctx)
      : name_(std::move(name)), rank_(ctx.rank), world_size_(ctx.world_size) {
    memory_inputs_.local_world_size = std::max(1, ctx.local_world_size);
    memory_inputs_.nnodes = std::max(1, ctx.world_size / memory_inputs_.local_world_size);
  }

  /// What plan() decides: the runtime's policy and the groups it runs over.
  struct Plan {
    RuntimeOptions options;
    Communicator* shard = nullptr;      ///< flat parameters are sharded over it (null: world)
    Communicator* replicate = nullptr;  ///< ranks holding the same shard (null: none)
  };

  /// prepare() (the same model on every rank, rank 0's values broadcast), then plan(), then
  /// the ShardedRuntime that builds the flat parameters and installs the hooks.
  void setup(Model& model, Accelerator& accelerator, const TrainPlan& train) override {
    Communicator& world = prepare(model, accelerator);
    Plan p = plan(model, world, train);
    runtime_ = std::make_unique<ShardedRuntime>(std::move(p.options), model,
                                                p.shard ? *p.shard : world, p.replicate);
  }

  /// ABI 1.7: setup() fills a deferred model itself, each rank reading its shards only.
  bool loads_deferred_weights() const override { return true; }
  void set_memory_inputs(const MemoryInputs& inputs) override { memory_inputs_ = inputs; }
  std::vector<NamedTensor> optimizer_parameters() override {
    return rt("optimizer_parameters").optimizer_parameters();
  }
  ModelOutput forward(const Batch& batch) override {
    return rt("forward").forward(batch_to_device(batch, device_));
  }
  void before_backward(bool sync) override { rt("before_backward").before_backward(sync); }
  void finish_gradient_sync() override { rt("finish_gradient_sync").finish_gradient_sync(); }
  double grad_norm() override { return rt("grad_norm").grad_norm(); }
  void after_optimizer_step() override { rt("after_optimizer_step").after_optimizer_step(); }
  void zero_grad() override { rt("zero_grad").zero_grad(); }
  /// Gathered on every rank (collective), named like the unwrapped model.
  std::vector<NamedTensor> full_state_dict() override {
    return rt("full_state_dict").full_state_dict();
  }
  /// This rank's pieces, no communication (buffers and frozen parameters on rank 0).
  std::vector<ShardedTensor> sharded_state_dict() override {
    return rt("sharded_state_dict").sharded_state_dict(rank_ == 0);
  }
  /// ABI 1.4: pieces of the shards (see ShardedRuntime::checkpoint_pieces).
  std::vector<CheckpointPiece> optimizer_parameter_pieces() override {
    return rt("optimizer_parameter_pieces").optimizer_parameter_pieces();
  }
  std::vector<CheckpointPiece> model_checkpoint_pieces() override {
    return rt("model_checkpoint_pieces").checkpoint_pieces(rank_ == 0);
  }
  void after_checkpoint_load() override { rt("after_checkpoint_load").after_checkpoint_load(); }
  /// ABI 1.12: every parameter whole until the scope ends (collective; see FullParameters).
  std::unique_ptr<Scope> full_parameters() override {
    struct Whole final : Scope {
      explicit Whole(ShardedRuntime& r) : rt(r) { rt.gather_all(); }
      ~Whole() override { rt.release_all(); }
      ShardedRuntime& rt;
    };
    return std::make_unique<Whole>(rt("full_parameters"));
  }
  /// comm_bytes, comm_exposed_s, then <prefix>_gathers, <prefix>_flat_bytes,
  /// <prefix>_max_unit_full_bytes, <prefix>_frozen_bytes (see RuntimeMetrics).
  void add_step_metrics(std::map<std::string, double>& extra) override {
    if (!runtime_) return;
    const RuntimeMetrics m = runtime_->take_metrics();
    extra["comm_bytes"] = m.comm_bytes;
    extra["comm_exposed_s"] = m.exposed_s;
    extra[metrics_prefix_ + "_gathers"] = m.gathers;
    extra[metrics_prefix_ + "_flat_bytes"] = m.flat_bytes;
    extra[metrics_prefix_ + "_max_unit_full_bytes"] = m.max_unit_full_bytes;
    extra[metrics_prefix_ + "_frozen_bytes"] = m.frozen_bytes;
  }

 protected:
  /// The first part of every setup(): checks the communicator matches the run context, moves
  /// an nn::Module model to the accelerator's device, checks the model is the same on every
  /// rank and broadcasts rank 0's values (replicate_from_rank0). Returns the world communicator.
  Communicator& prepare(Model& model, Accelerator& accelerator) {
    TR_CHECK(model_ == nullptr, name_, ": setup() called twice");
    model_ = &model;
    device_ = accelerator.device();
    Communicator& comm = accelerator.communicator();
    TR_CHECK(comm.world_size() == world_size_ && comm.rank() == rank_, name_,
             ": the accelerator's communicator is rank ", comm.rank(), " of ", comm.world_size(),
             ", but this process is rank ", rank_, " of ", world_size_);
    auto* deferred = dynamic_cast<DeferredWeights*>(&model);
    const bool defer = deferred != nullptr && deferred->weights_deferred();
    std::vector<NamedTensor> params = model.named_parameters();
    if (!device_.is_cpu()) {
      torch::nn::Module* m = model.module();
      TR_CHECK(m != nullptr, name_,
               ": the model is not a torch::nn::Module, so it cannot be "
               "moved to ",
               device_);
      if (defer) {
        // Parameters without values move as sizes only: the runtime fills them on the device.
        c10::NoGradGuard no_grad;
        for (auto& p : params)
          if (p.tensor.device() != device_) {
            p.tensor.set_data(at::empty(p.tensor.sizes(), p.tensor.options().device(device_)));
            free_storage(p.tensor);
          }
      }
      m->to(device_);
    }
    std::vector<NamedTensor> buffers = model.named_buffers();
    if (defer) {
      // Every rank reads its values from the same files: only the shapes are compared, and
      // only buffers are broadcast.
      if (comm.world_size() > 1) {
        check_same_model_on_all_ranks(comm, device_, name_, params, buffers);
        std::vector<at::Tensor> state;
        for (const auto& b : buffers) state.push_back(b.tensor);
        if (!state.empty()) broadcast_from_rank0(comm, state);
      }
    } else {
      replicate_from_rank0(comm, device_, name_, params, buffers);
    }
    return comm;
  }
  /// The derived strategy's policy, called by setup() once the model is replicated: what to
  /// shard over which groups (created here, collectively, when it needs sub-groups). The
  /// default fails loudly: a strategy that overrides setup() itself never reaches it.
  virtual Plan plan(Model& model, Communicator& world, const TrainPlan& train) {
    (void)model, (void)world, (void)train;
    throw NotSupportedError(name_ + ": plan() is not implemented");
  }
  ShardedRuntime& rt(const char* what) {
    TR_CHECK(runtime_ != nullptr, name_, ": ", what, "() called before setup()");
    return *runtime_;
  }

  std::string name_;
  std::string metrics_prefix_ = "sharded";
  int rank_, world_size_;
  MemoryInputs memory_inputs_;
  Model* model_ = nullptr;
  c10::Device device_{c10::kCPU};
  std::unique_ptr<ShardedRuntime> runtime_;
};

}  // namespace trainrun::v1::sharding
