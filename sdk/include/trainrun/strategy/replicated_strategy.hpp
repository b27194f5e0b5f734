#pragma once
// What the replicated strategies (every rank holds the whole model: ddp, ring) do the same way,
// as Lightning's ParallelStrategy is the base of its DDP strategies: the setup prologue (the
// communicator matches the run context, the model on the device, the replica check and rank 0's
// values broadcast, the distinct trainable tensors), the gradient hooks, the Strategy calls that
// only depend on holding whole replicas, and gradient compression on the wire. The sharded
// strategies have their own base, ShardedStrategy (trainrun/strategy/sharded_runtime.hpp).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/options.hpp"
#include "trainrun/strategy/gradient_hooks.hpp"
#include "trainrun/strategy/replicas.hpp"
#include "trainrun/strategy/strategy_helpers.hpp"

namespace trainrun::v1 {

/// Gradient compression on the wire: float32/float64 gradient buffers are sent as float16 or
/// bfloat16 and restored afterwards (PyTorch's fp16/bf16 compress hooks, Horovod's
/// Compression.fp16). One option for every strategy, `gradient_compression` = "none" | "fp16" |
/// "bf16".
struct GradientCompression {
  std::string name = "none";                                  ///< the option's value
  c10::ScalarType wire_dtype = c10::ScalarType::Undefined;    ///< Undefined: no compression

  /// Declares `gradient_compression` with `help`. With `deprecated_alias` (an older name of
  /// the same option, e.g. ring's "compression"), declares that name too; from_options()
  /// warns when it is used.
  static void declare(OptionSchema& s, const std::string& help,
                      const char* deprecated_alias = nullptr) {
    s.choice("gradient_compression", "none", {"none", "fp16", "bf16"}, help);
    if (deprecated_alias)
      s.choice(deprecated_alias, "none", {"none", "fp16", "bf16"},
               "deprecated name of gradient_compression (used when that one is \"none\")");
  }
  /// Reads what declare() declared. A value under the deprecated alias is used when
  /// gradient_compression is "none", with a warning on stderr from rank 0; both set to
  /// different values is a ConfigError naming both.
  static GradientCompression from_options(const Options& o, int rank,
                                          const char* deprecated_alias = nullptr) {
    GradientCompression c;
    c.name = o.get_string("gradient_compression");
    if (deprecated_alias) {
      const std::string old = o.get_string(deprecated_alias);
      if (old != "none") {
        TR_CHECK_TYPED(ConfigError, c.name == "none" || c.name == old, o.context(),
                       ": gradient_compression = \"", c.name, "\" and its deprecated name ",
                       deprecated_alias, " = \"", old, "\" disagree; set gradient_compression only");
        if (rank == 0)
          std::fprintf(stderr, "trainrun: warning: %s: option '%s' is deprecated; write "
                       "gradient_compression = \"%s\" instead\n", o.context().c_str(),
                       deprecated_alias, old.c_str());
        c.name = old;
      }
    }
    if (c.name == "fp16") c.wire_dtype = c10::ScalarType::Half;
    if (c.name == "bf16") c.wire_dtype = c10::ScalarType::BFloat16;
    return c;
  }
  /// Whether a buffer of `dtype` travels compressed: only where it shrinks the payload
  /// (floating dtypes wider than the wire dtype).
  bool applies_to(c10::ScalarType dtype) const {
    return wire_dtype != c10::ScalarType::Undefined && at::isFloatingType(dtype) &&
           c10::elementSize(dtype) > c10::elementSize(wire_dtype);
  }
  /// Fills `wire` (the compressed twin of `flat`, same numel) for an all-reduce with `op` over
  /// `world_size` ranks and returns the op to run on it. An average is divided in the full
  /// dtype first and then summed, so no precision is lost in the division and the 16-bit sum
  /// cannot overflow.
  static ReduceOp fill_wire(at::Tensor& wire, const at::Tensor& flat, ReduceOp op,
                            int world_size) {
    if (op == ReduceOp::Avg) {
      wire.copy_(flat.div(static_cast<double>(world_size)));
      return ReduceOp::Sum;
    }
    wire.copy_(flat);
    return op;
  }
};

/// Base of the strategies that keep a whole replica of the model on every rank. A derived
/// strategy calls prepare() first in its setup(), then installs its gradient hooks with
/// install_gradient_hooks(), and implements forward, before_backward, finish_gradient_sync and
/// add_step_metrics; the rest of the Strategy interface is here.
class ReplicatedStrategy : public Strategy,
                           public StepMetricsSource,
                           public CheckpointableStrategy {
 public:
  /// `name` for messages ("strategy 'ddp'"); `short_name` where a message names the strategy
  /// in a sentence ("ddp reduces dense gradients only").
  ReplicatedStrategy(std::string name, std::string short_name, const RunContext& ctx)
      : name_(std::move(name)), short_name_(std::move(short_name)), rank_(ctx.rank),
        world_size_(ctx.world_size) {}
  /// Removes the gradient hooks: they point at this object and the model may outlive it.
  ~ReplicatedStrategy() override { hooks_.remove(); }

  /// Every trainable parameter: each rank updates all of them.
  std::vector<NamedTensor> optimizer_parameters() override {
    check_setup("optimizer_parameters");
    return trainable_;
  }
  /// The reduced gradients are identical on every rank, so the local norm is the global one.
  double grad_norm() override {
    check_setup("grad_norm");
    return local_grad_norm(trainable_);
  }
  /// Gradients become undefined (as `single`), so the next backward writes fresh ones (and
  /// never adds into a view of a communication buffer).
  void zero_grad() override {
    check_setup("zero_grad");
    drop_grads(params_);
  }
  /// Parameters and buffers; every rank holds the full model.
  std::vector<NamedTensor> full_state_dict() override {
    check_setup("full_state_dict");
    return replicated_state_dict(params_, *model_);
  }
  /// ABI 1.4 (checkpoints): replicated, so every tensor whole at offset 0, written by rank 0
  /// and loaded on every rank from the same bytes (the replicas stay identical).
  std::vector<CheckpointPiece> optimizer_parameter_pieces() override {
    check_setup("optimizer_parameter_pieces");
    return replicated_optimizer_pieces(trainable_, rank_);
  }
  std::vector<CheckpointPiece> model_checkpoint_pieces() override {
    check_setup("model_checkpoint_pieces");
    return replicated_checkpoint_pieces(params_, *model_, rank_);
  }
  void after_checkpoint_load() override {}

 protected:
  /// The first part of every setup(): checks that setup runs once and that the accelerator's
  /// communicator is this process's rank, calls check_device(), moves an nn::Module model to
  /// the device, checks that every rank holds the same parameters and buffers and broadcasts
  /// rank 0's values (replicate_from_rank0, before any other collective: a model that differs
  /// across ranks would otherwise fail later far from the cause, or train garbage), then lists
  /// the trainable parameters and the distinct ones (a tied tensor once), each checked to be a
  /// dense leaf and by check_parameter(). Throws Error / ConfigError naming the strategy.
  void prepare(Model& model, Accelerator& accelerator) {
    TR_CHECK(model_ == nullptr, name_, ": setup() called twice");
    model_ = &model;
    device_ = accelerator.device();
    comm_ = &accelerator.communicator();
    TR_CHECK(comm_->world_size() == world_size_ && comm_->rank() == rank_, name_,
             ": the accelerator's communicator is rank ", comm_->rank(), " of ",
             comm_->world_size(), ", but this process is rank ", rank_, " of ", world_size_);
    check_device(device_);
    if (!device_.is_cpu()) {
      // As `single`: only an nn::Module can be moved without the model's help, and to() keeps
      // the parameter objects, so names and optimizer identity survive.
      torch::nn::Module* m = model.module();
      TR_CHECK(m != nullptr, name_, ": the model is not a torch::nn::Module, so it cannot be "
               "moved to ", device_);
      m->to(device_);
    }
    params_ = model.named_parameters();
    std::vector<NamedTensor> buffers = model.named_buffers();
    replicate_from_rank0(*comm_, device_, name_, params_, buffers);

    trainable_.clear();
    for (const auto& p : params_)
      if (p.tensor.requires_grad()) trainable_.push_back(p);
    TR_CHECK(!trainable_.empty(), name_, ": the model has no parameter with requires_grad (",
             params_.size(), " parameters, all frozen)");
    distinct_.clear();
    std::vector<const void*> seen;  // a tensor registered twice (tied weights) is reduced once
    for (const auto& p : trainable_) {
      const void* impl = p.tensor.unsafeGetTensorImpl();
      if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
      seen.push_back(impl);
      TR_CHECK(p.tensor.is_leaf(), name_, ": parameter '", p.name, "' is not a leaf tensor, "
               "so its gradient cannot be observed");
      TR_CHECK(p.tensor.layout() == c10::kStrided, name_, ": parameter '", p.name,
               "' is not dense; ", short_name_, " reduces dense gradients only");
      check_parameter(p);
      distinct_.push_back(p);
    }
  }
  /// Called by prepare() before the model moves; throws to refuse a device. Default: any.
  virtual void check_device(c10::Device device) const { (void)device; }
  /// Called by prepare() for each distinct trainable parameter after the dense-leaf checks;
  /// throws to refuse one. Default: any.
  virtual void check_parameter(const NamedTensor& p) const { (void)p; }
  /// Hooks on the distinct trainable parameters: on_ready(i) runs once distinct()[i]'s
  /// gradient of the running backward is accumulated (trainrun/strategy/gradient_hooks.hpp).
  void install_gradient_hooks(std::function<void(size_t)> on_ready) {
    hooks_.install(distinct_, name_, std::move(on_ready));
  }
  /// Throws Error when a Strategy call comes before setup().
  void check_setup(const char* what) const {
    TR_CHECK(model_ != nullptr, name_, ": ", what, "() called before setup()");
  }
  /// The distinct trainable parameters, in registration order.
  const std::vector<NamedTensor>& distinct() const { return distinct_; }
  /// For a gradient hook of a synchronised backward: throws Error when distinct()[i] already has
  /// its gradient of this backward (`already_ready`). A hook fires once per backward, so this is
  /// a second backward without before_backward() in between, which no reduction can undo.
  void check_gradient_once(size_t i, bool already_ready) const {
    TR_CHECK(!already_ready, name_, ": parameter '", distinct_[i].name,
             "' received a gradient twice in one synchronised backward (one backward per "
             "micro-batch, with before_backward() before each)");
  }
  /// "a, b, c and 3 more": the names of `missing` (indices into distinct()), at most 20, for
  /// the error about parameters that received no gradient in a step.
  std::string missing_names(const std::vector<size_t>& missing) const {
    std::string names;
    for (size_t k = 0; k < missing.size(); ++k) {
      if (k == 20) {
        names += detail::cat(" and ", missing.size() - 20, " more");
        break;
      }
      names += (k ? ", " : "") + distinct_[missing[k]].name;
    }
    return names;
  }

  std::string name_;
  std::string short_name_;
  int rank_;
  int world_size_;
  Model* model_ = nullptr;
  Communicator* comm_ = nullptr;
  c10::Device device_{c10::kCPU};
  std::vector<NamedTensor> params_;     ///< every parameter, trainable or frozen
  std::vector<NamedTensor> trainable_;  ///< requires_grad, as registered (may repeat a tensor)
  GradientHooks hooks_;

 private:
  std::vector<NamedTensor> distinct_;
};

}  // namespace trainrun::v1
