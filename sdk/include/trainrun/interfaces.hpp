#pragma once
// The versioned component interfaces (ABI v1). A published interface is never edited: new
// behaviour arrives as a new version or an added capability interface. Optional operations
// have defaults that throw NotSupportedError naming the operation, never silently do nothing
// where doing nothing would compute a wrong result.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/options.hpp"
#include "trainrun/types.hpp"
#include "trainrun/unit.hpp"

namespace trainrun::v1 {

// ---------------------------------------------------------------------------------------------
// Collectives (owned by the Accelerator). Modelled on c10d's Backend/Work: typed per-operation
// options, asynchronous work with wait(timeout), loud defaults for unsupported operations.

/// Reduction applied by all-reduce and reduce-scatter. Avg divides the sum by world_size.
enum class ReduceOp { Sum, Avg, Min, Max };

/// timeout_s <= 0 means the communicator's default ([accelerator] timeout_s).
struct AllReduceOptions {
  ReduceOp op = ReduceOp::Sum;
  double timeout_s = 0;
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::Sum;
  double timeout_s = 0;
};
struct AllGatherOptions {
  double timeout_s = 0;
};
struct BroadcastOptions {
  int root = 0;
  double timeout_s = 0;
};
struct PointToPointOptions {
  int peer = 0;  ///< the other rank
  int tag = 0;
  double timeout_s = 0;
};
struct BarrierOptions {
  double timeout_s = 0;
};

/// An operation in flight. wait() throws Error naming the operation and the missing peers when
/// the timeout (seconds; <= 0 = the operation's own) expires, or when the operation failed.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait(double timeout_s = 0) = 0;
  virtual bool completed() const = 0;
};

/// A Work that is already complete (what a world of one returns).
class CompletedWork final : public Work {
 public:
  void wait(double = 0) override {}
  bool completed() const override { return true; }
};

/// Collective communication among the ranks of one group. All tensors must be contiguous and
/// live on the accelerator's device; every rank must call the same operations in the same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;

  /// In place: every rank ends with op(tensor of rank 0 .. world_size-1). Any shape and dtype.
  virtual std::shared_ptr<Work> all_reduce(at::Tensor& tensor, const AllReduceOptions& opts = {}) {
    (void)tensor, (void)opts;
    throw NotSupportedError(backend() + " communicator does not support all_reduce");
  }
  /// input: [world_size * n] flat; output: [n], this rank's chunk of op(inputs) (ZeRO's
  /// gradient reduce-scatter).
  virtual std::shared_ptr<Work> reduce_scatter(const at::Tensor& input, at::Tensor& output,
                                               const ReduceScatterOptions& opts = {}) {
    (void)input, (void)output, (void)opts;
    throw NotSupportedError(backend() + " communicator does not support reduce_scatter");
  }
  /// input: [n]; output: [world_size * n], rank r's input at offset r*n.
  virtual std::shared_ptr<Work> all_gather(const at::Tensor& input, at::Tensor& output,
                                           const AllGatherOptions& opts = {}) {
    (void)input, (void)output, (void)opts;
    throw NotSupportedError(backend() + " communicator does not support all_gather");
  }
  /// In place: every rank ends with the root's tensor.
  virtual std::shared_ptr<Work> broadcast(at::Tensor& tensor, const BroadcastOptions& opts = {}) {
    (void)tensor, (void)opts;
    throw NotSupportedError(backend() + " communicator does not support broadcast");
  }
  virtual std::shared_ptr<Work> send(const at::Tensor& tensor, const PointToPointOptions& opts) {
    (void)tensor, (void)opts;
    throw NotSupportedError(backend() + " communicator does not support send");
  }
  virtual std::shared_ptr<Work> recv(at::Tensor& tensor, const PointToPointOptions& opts) {
    (void)tensor, (void)opts;
    throw NotSupportedError(backend() + " communicator does not support recv");
  }
  virtual std::shared_ptr<Work> barrier(const BarrierOptions& opts = {}) {
    (void)opts;
    throw NotSupportedError(backend() + " communicator does not support barrier");
  }
  /// A communicator over a subset of this group's ranks (given as ranks of this group).
  virtual std::shared_ptr<Communicator> new_group(const std::vector<int>& ranks) {
    (void)ranks;
    throw NotSupportedError(backend() + " communicator does not support new_group");
  }
};

/// Current and peak bytes allocated on the device; -1 where unknown.
struct MemoryStats {
  int64_t current_bytes = -1;
  int64_t peak_bytes = -1;
  int64_t total_bytes = -1;  ///< device capacity
};

/// A device plus the communicator that connects it to the other ranks.
class Accelerator {
 public:
  virtual ~Accelerator() = default;
  virtual c10::Device device() const = 0;
  virtual Communicator& communicator() = 0;
  virtual MemoryStats memory_stats() const { return {}; }
  /// One line for the start-up banner (device, threads, backend).
  virtual std::string describe() const = 0;
};

// ---------------------------------------------------------------------------------------------
// Data and model (brought by the user, or the shipped mlp/cnn/gpt/idx/text plugins).

/// A finite, indexable collection of samples with a training and an evaluation split.
/// batch() is called from one thread at a time and must be deterministic for given indices.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual DataInfo info() const = 0;
  /// Number of samples in the split (>= 0).
  virtual int64_t size(Split split) const = 0;
  /// The samples at `indices` (each in [0, size(split))) stacked into one batch.
  /// Throws Error on an index out of range.
  virtual Batch batch(Split split, const std::vector<int64_t>& indices) = 0;
};

/// A trainable model. Parameters are CPU float32 leaves with requires_grad when created;
/// strategies and precisions may move, cast or shard them afterwards.
class Model {
 public:
  virtual ~Model() = default;
  /// Parameters in registration order, with state-dict names.
  virtual std::vector<NamedTensor> named_parameters() = 0;
  /// Non-trainable state that travels with the model (e.g. running statistics).
  virtual std::vector<NamedTensor> named_buffers() { return {}; }
  /// Switches dropout and similar layers between training (true) and evaluation (false).
  virtual void train(bool on) = 0;
  /// Forward pass and loss on one micro-batch; see ModelOutput for the loss convention.
  virtual ModelOutput forward(const Batch& batch) = 0;
  /// Sharding units (see unit.hpp); empty means the whole model is one unit.
  virtual std::vector<Unit*> units() { return {}; }
  /// The underlying nn::Module when the model is one (nullptr otherwise, e.g. TorchScript).
  virtual torch::nn::Module* module() { return nullptr; }
  /// One line for the start-up banner.
  virtual std::string describe() const = 0;
};

// ---------------------------------------------------------------------------------------------
// Policies.

/// RAII scope returned by Precision::autocast(); destroying it restores the previous state.
class Scope {
 public:
  virtual ~Scope() = default;
};

/// Numeric format: module conversion, autocast, loss scaling and the finite-gradient check.
class Precision {
 public:
  virtual ~Precision() = default;
  /// Casts or quantizes the model once, before the strategy wraps it.
  virtual void convert(Model& model) { (void)model; }
  /// Active while a forward runs; nullptr = no autocast.
  virtual std::unique_ptr<Scope> autocast() { return nullptr; }
  /// Multiplies the loss by the current loss scale before backward (identity by default).
  virtual at::Tensor scale_loss(const at::Tensor& loss) { return loss; }
  /// Divides the gradients by the loss scale in place and returns whether all are finite,
  /// agreed across ranks through `comm` (a step is skipped on every rank or on none).
  virtual bool unscale_and_check(const std::vector<at::Tensor>& grads, Communicator& comm) {
    (void)grads, (void)comm;
    return true;
  }
  /// Called once per optimizer step with whether the step was skipped (scaler update).
  virtual void update(bool skipped) { (void)skipped; }
  /// The current loss scale (1 without scaling).
  virtual double loss_scale() const { return 1.0; }
};

/// A Precision whose forward computes float32 Linear weights in a lower dtype (bf16-mixed: CPU
/// autocast casts a weight at every call, and keeps no cast of a weight that does not require
/// grad). When it answers a dtype, the core keeps each frozen Linear weight of the model in that
/// dtype for the run (LinearImpl::keep_frozen_weight_copy: resident float32 weights that do not
/// require grad, e.g. a LoRA base), once the strategy has set the model up, and only for a model
/// plugin built for ABI >= 1.11 (the copy lives in the layer). The products are the same as
/// autocast's, the casts are made once instead of every step; each copy costs the dtype's bytes
/// per element. ABI 1.11, queried by core/src/run/build.cpp.
class FrozenWeightCopies {
 public:
  virtual ~FrozenWeightCopies() = default;
  /// The dtype (at::kBFloat16) to keep frozen Linear weights in, or nullopt for none.
  virtual std::optional<at::ScalarType> frozen_weight_dtype() const = 0;
};

/// The update rule and learning-rate schedule for the parameters it is given (all of them, or
/// this rank's shard under ZeRO).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Called once, before the first step. Parameters are float32 leaves.
  virtual void init(const std::vector<NamedTensor>& params, const TrainPlan& plan) = 0;
  /// The learning rate used by step `step` (0-based).
  virtual double lr(int64_t step) const = 0;
  /// Applies one update with lr(step) to every parameter that has a gradient.
  virtual void step(int64_t step) = 0;
  /// Optimizer state as named tensors (for checkpoints); default: none.
  virtual std::vector<NamedTensor> state() { return {}; }
};

/// How parameters, gradients and optimizer state are replicated or sharded, and when they are
/// communicated.
class Strategy {
 public:
  virtual ~Strategy() = default;
  /// Wraps the model: moves it to the accelerator's device, broadcasts or shards parameters,
  /// installs gradient hooks. Called once, after Precision::convert and Callback::on_setup.
  virtual void setup(Model& model, Accelerator& accelerator, const TrainPlan& plan) = 0;
  /// Parameters this rank's optimizer updates (a shard under ZeRO), with requires_grad.
  virtual std::vector<NamedTensor> optimizer_parameters() = 0;
  /// The batch moved to the device and run through the model.
  virtual ModelOutput forward(const Batch& batch) = 0;
  /// Called before the backward of each micro-batch; `sync` is false for the first
  /// accumulation_steps - 1 micro-batches (no communication needed yet, as DDP's no_sync).
  /// The loss each rank backpropagates is its loss_sum x world_size / (targets in the global
  /// batch), so the AVERAGE over ranks of the accumulated gradients is the gradient of the mean
  /// loss over the global batch: data-parallel strategies all-reduce with ReduceOp::Avg.
  virtual void before_backward(bool sync) { (void)sync; }
  /// After the last micro-batch's backward: gradients of optimizer_parameters() are complete
  /// and reduced (averaged over ranks) when this returns.
  virtual void finish_gradient_sync() = 0;
  /// Global L2 norm of the gradients of optimizer_parameters() across all ranks and shards.
  virtual double grad_norm() = 0;
  /// After Optimizer::step (e.g. ZeRO-1/2 all-gather updated parameter shards).
  virtual void after_optimizer_step() {}
  /// Drops the gradients of every parameter before the next step.
  virtual void zero_grad() = 0;
  /// The full model state with unsharded names (gathered where sharded). Default: unsupported.
  virtual std::vector<NamedTensor> full_state_dict() {
    throw NotSupportedError("this strategy does not support full_state_dict");
  }
};

/// Observes (and, in on_setup, may transform) the run. Default methods do nothing.
class Callback {
 public:
  virtual ~Callback() = default;
  /// Before the strategy wraps the model; may replace or freeze layers (e.g. LoRA).
  virtual void on_setup(Model& model, const RunContext& ctx) { (void)model, (void)ctx; }
  virtual void on_train_start(const TrainPlan& plan) { (void)plan; }
  virtual void on_step_end(const StepMetrics& metrics) { (void)metrics; }
  virtual void on_eval_end(const EvalMetrics& metrics) { (void)metrics; }
  virtual void on_train_end(const TrainSummary& summary) { (void)summary; }
};

// ---------------------------------------------------------------------------------------------
// Capabilities (ABI 1.1). A component may also derive from one of these; the core finds it
// with dynamic_cast, so components built against ABI 1.0 keep working unchanged.
// trainrun/capabilities.hpp indexes every capability interface of the SDK: who implements it,
// who queries it, since which ABI minor.

/// A Strategy, Precision or Optimizer that adds its own figures to every step's metrics.
/// Example (ddp): "comm_bytes" (bytes this rank sent in gradient all-reduces during the step)
/// and "comm_exposed_s" (seconds the step waited for communication after backward, i.e. the
/// part not hidden behind computation).
class StepMetricsSource {
 public:
  virtual ~StepMetricsSource() = default;
  /// Called once per optimizer step, after Optimizer::step; adds name -> value pairs to
  /// `extra` (StepMetrics::extra). Values describe the step just finished, on this rank.
  virtual void add_step_metrics(std::map<std::string, double>& extra) = 0;
};

/// ABI 1.3. An Optimizer that decides per parameter from the parameter's shape (AdamW's
/// no_decay_1d) and must keep deciding the same way when a sharding strategy (ZeRO, FSDP) hands
/// it 1-D pieces of flat parameters named after the parameters they come from. The core calls
/// it once, before init(), with every model parameter's name and shape as the model created
/// them (after Precision::convert and Callback::on_setup, before Strategy::setup).
class ParameterShapesAware {
 public:
  virtual ~ParameterShapesAware() = default;
  virtual void set_parameter_shapes(const std::map<std::string, std::vector<int64_t>>& shapes) = 0;
};

/// ABI 1.3. What a Precision keeps per parameter, for memory estimates (the Psi formulas of
/// ZeRO, Rajbhandari et al. SC20, section 3.1). Bytes per parameter.
class PrecisionBytes {
 public:
  virtual ~PrecisionBytes() = default;
  /// Weights the model computes with: 4 (fp32), 2 (bf16/fp16), ~0.5 (4-bit).
  virtual double param_bytes() const = 0;
  /// Gradients the strategy reduces: 4 or 2.
  virtual double grad_bytes() const = 0;
  /// fp32 master weights kept beside low-precision ones: 4, or 0 when the weights are fp32.
  /// The paper counts these in its K (K = 12 for mixed-precision Adam).
  virtual double master_bytes() const = 0;
};

/// ABI 1.3. An Optimizer's state per parameter it steps, in bytes, excluding master weights
/// (Adam/AdamW: 8 = exp_avg + exp_avg_sq in fp32; SGD with momentum: 4; plain SGD: 0).
class OptimizerStateBytes {
 public:
  virtual ~OptimizerStateBytes() = default;
  virtual double state_bytes_per_param() const = 0;
};

/// ABI 1.3. What the core knows about the other components that a Strategy may need for its
/// memory estimate (ZeRO stage "auto", FSDP sharding_strategy "auto"). Fields are only ever
/// appended. Bytes are per parameter unless named otherwise.
struct MemoryInputs {
  double param_bytes = 4;           ///< from PrecisionBytes (4 when the precision says nothing)
  double grad_bytes = 4;            ///< from PrecisionBytes
  double master_bytes = 0;          ///< from PrecisionBytes
  double optimizer_bytes = -1;      ///< from OptimizerStateBytes; -1 = unknown
  int64_t memory_budget_bytes = -1; ///< per rank: accelerator capacity / local ranks; -1 unknown
  int local_world_size = 1;         ///< ranks on this node
  int nnodes = 1;                   ///< nodes in the job
};

/// ABI 1.3. A Strategy that wants MemoryInputs; the core calls it once, before setup().
class MemoryInputsAware {
 public:
  virtual ~MemoryInputsAware() = default;
  virtual void set_memory_inputs(const MemoryInputs& inputs) = 0;
};

/// ABI 1.3. A component (a Precision's dynamic loss scaler, say) whose state lives outside the
/// model and optimizer tensors but must travel in every checkpoint, so that a resumed run
/// continues exactly. Found with dynamic_cast. The state is a flat map of named float64 values
/// (integers up to 2^53 are exact), owned and named by the component; a checkpoint writer
/// stores it beside the component's name and gives it back before the first resumed step.
class CheckpointState {
 public:
  virtual ~CheckpointState() = default;
  /// The state now (between optimizer steps).
  virtual std::map<std::string, double> checkpoint_state() const = 0;
  /// Restores a state from checkpoint_state(). Throws Error naming a missing or invalid key.
  virtual void load_checkpoint_state(const std::map<std::string, double>& state) = 0;
};

/// ABI 1.3. One contiguous piece of a (possibly sharded) tensor held by this rank: elements
/// [offset, offset + data.numel()) of the row-major flattening of a tensor of `shape`. Every
/// element of every tensor is held by exactly one rank; the pieces of all ranks rebuild the full
/// state dict under any other layout (PyTorch FSDP's SHARDED_STATE_DICT, flattened).
struct ShardedTensor {
  std::string name;            ///< as in the full state dict ("blocks.0.attn.c_attn.weight")
  std::vector<int64_t> shape;  ///< the whole tensor's shape
  int64_t offset = 0;          ///< first element of this piece in the flattened tensor
  at::Tensor data;             ///< 1-D, this rank's elements, the tensor's dtype
};

/// ABI 1.3. A Strategy that can hand out its state without gathering it: each rank its own
/// pieces (a replicated tensor, e.g. a buffer, is held by rank 0 only). Collective-free.
class ShardedStateDictSource {
 public:
  virtual ~ShardedStateDictSource() = default;
  virtual std::vector<ShardedTensor> sharded_state_dict() = 0;
};

// ---------------------------------------------------------------------------------------------
// ABI 1.4 (adapters). The replaceable pieces of the SDK's Linear layer (trainrun/model/linear.hpp):
// a model built on trainrun::v1::Linear lets a Precision swap the dense weight for a frozen
// quantized one (quant-nf4, quant-int8) and a Callback add low-rank adapters (lora), without the
// model's help: C++ modules have no forward hooks (docs/design.md), so the layer itself has the
// seams.

/// A frozen replacement of a Linear layer's dense weight W [out, in]: packed storage plus its
/// quantization state, registered as buffers of the layer (LinearImpl::set_base), never
/// updated and never given a gradient. Gradients still flow to the layer's input.
class LinearBase {
 public:
  virtual ~LinearBase() = default;
  /// x: floating [..., in] -> x W^T + bias: [..., out] in x's dtype. bias: undefined or [out]
  /// (a parameter of the layer, which may be trainable). Differentiable with respect to x and
  /// bias only.
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& bias) = 0;
  /// W as this base computes with it: float32 [out, in], no gradient (for merging and tests).
  virtual at::Tensor dequantized_weight() = 0;
  /// Short name of the storage format: "nf4", "nf4+dq", "int8".
  virtual std::string format() const = 0;
  /// Bytes of the packed weight and its per-layer quantization state (what a rank holds at
  /// rest for this layer's weight; constant code tables excluded).
  virtual int64_t storage_bytes() const = 0;
};

/// A trainable addition to a Linear layer's output (LoRA: x -> dropout -> A -> B x scaling,
/// Hu et al. 2021). Its submodules are registered on the layer itself (LinearImpl::add_adapter),
/// so their parameters are named "<layer>.<submodule>.<param>" ("blocks.0.attn.c_attn.lora_A.
/// weight", PEFT's names without the adapter name).
class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  /// x: [..., in] -> [..., out], added to the base output. `training`: the layer's mode
  /// (dropout active).
  virtual at::Tensor forward(const at::Tensor& x, bool training) = 0;
  /// The change this adapter makes to W, as a dense float32 [out, in] matrix: merging it
  /// (W + delta) gives the same outputs with dropout off.
  virtual at::Tensor delta_weight() = 0;
  /// Submodules to register on the layer, in order, by name ("lora_A", "lora_B").
  virtual std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules() = 0;
};

// ---------------------------------------------------------------------------------------------
// ABI 1.4 (checkpoints). Capabilities the core's checkpoint writer and loader use to save a
// strategy's state without gathering it and to load a checkpoint written by any strategy at
// any world size into any other (resharding). Found with dynamic_cast.

/// ABI 1.4. One piece of a full tensor held by this rank for checkpointing: `piece` says which
/// tensor (name as in the full state dict), its full shape, the offset of the piece in the
/// row-major flattening and `data`, 1-D, ALIASING the live storage (the loader copies into it).
/// `writer` marks the one rank that writes these elements into a checkpoint: across all ranks
/// every element of every tensor has exactly one writer (replicas of it have writer = false but
/// are still filled on load).
struct CheckpointPiece {
  ShardedTensor piece;
  bool writer = true;
};

/// ABI 1.4. A Strategy whose state the core can checkpoint piece by piece and restore under a
/// different layout. Calls are collective only where said.
class CheckpointableStrategy {
 public:
  virtual ~CheckpointableStrategy() = default;
  /// One entry per element of Strategy::optimizer_parameters(), in the same order: the full
  /// model parameter that optimizer parameter is (offset 0, the parameter's shape, for a
  /// replicated strategy) or a 1-D piece of (a flat-parameter shard under ZeRO/FSDP), with
  /// `data` the optimizer parameter itself flattened. The core names optimizer state
  /// "<parameter>.<state>" and saves a state tensor of the parameter's numel as a piece of a
  /// tensor of the parameter's full shape at the same offset; state of another size (a step
  /// counter) is saved whole by the writer of the piece at offset 0.
  virtual std::vector<CheckpointPiece> optimizer_parameter_pieces() = 0;
  /// Every piece of the model's parameters (frozen ones included) and buffers this rank holds,
  /// replicas included, aliasing live storage: what save writes (writer == true) and what load
  /// fills (all). No communication.
  virtual std::vector<CheckpointPiece> model_checkpoint_pieces() = 0;
  /// Called on every rank after the loader copied a checkpoint into model_checkpoint_pieces()
  /// and the optimizer state, before the first resumed step: makes derived copies consistent
  /// (ZeRO-1/2 re-gather whole parameters from the loaded shards). May be collective.
  virtual void after_checkpoint_load() = 0;
};

/// ABI 1.4. Why the core is asking a CheckpointPolicy.
enum class CheckpointReason { Step, Signal, End };

/// ABI 1.4. Where and how checkpoints are kept, as a CheckpointPolicy decides.
struct CheckpointSettings {
  std::string dir;            ///< absolute or relative to the working directory; "" = <run_dir>/checkpoints
  int64_t keep_last = 0;      ///< complete checkpoints kept (older ones pruned after a save); 0 = all
};

/// ABI 1.4. A Callback that decides when the core writes a checkpoint (the core does the I/O,
/// atomically, and the ranks agree: a checkpoint is written when rank 0's policy says so).
/// Found with dynamic_cast; at most one per job.
class CheckpointPolicy {
 public:
  virtual ~CheckpointPolicy() = default;
  virtual CheckpointSettings checkpoint_settings() const = 0;
  /// After optimizer step `step` (1-based count of steps done) completed, `elapsed_s` seconds
  /// (wall clock) since the training loop started: whether to save now. With
  /// CheckpointReason::Signal (SIGTERM/SIGINT received; the run stops after) or End (the last
  /// step is done) the policy says whether that case saves.
  virtual bool should_save(int64_t step, double elapsed_s, CheckpointReason reason) = 0;
  /// Called after a checkpoint of `step` was completed (renamed into place), on every rank.
  virtual void on_checkpoint_saved(int64_t step, const std::string& path) { (void)step, (void)path; }
};

/// ABI 1.4. A Callback that wants the trained model's full state dict: every parameter and
/// buffer named like the unwrapped model, whole (gathered by the strategy where it shards them,
/// as Strategy::full_state_dict). LoRA saves its adapters from it: under zero/fsdp its live
/// parameters are views of flat parameters that are released between uses. Found with
/// dynamic_cast. The core calls it on rank 0 only, once training ended without interruption,
/// before on_train_end, with the tensors the final model.safetensors is written from (CPU or
/// the accelerator's device; read-only). Not called when the strategy has no full_state_dict.
/// Since ABI 1.5 a Model may implement it too (the llama plugin writes <run_dir>/hf/ from it);
/// the model is called before the callbacks.
class FinalStateDictConsumer {
 public:
  virtual ~FinalStateDictConsumer() = default;
  virtual void on_final_state_dict(const std::vector<NamedTensor>& state) = 0;
};

/// ABI 1.5. A Communicator whose recv can combine the message into the destination instead of
/// overwriting it: `tensor` = op(tensor, message), element-wise. The ring all-reduce's
/// reduce-scatter (trainrun/collectives/ring.hpp) uses it when present, so that a transport which
/// receives through a staging area (gloo-cpu's shared memory) reduces straight from it and saves a
/// copy of every received byte; without it the ring receives into a buffer and reduces after.
/// Matched with the peer's send exactly as recv is (tag, dtype, size). Found with dynamic_cast.
/// `op` is Sum, Min or Max; Avg throws Error (sum, then divide). Same errors as recv.
class RecvReduceCommunicator {
 public:
  virtual ~RecvReduceCommunicator() = default;
  virtual std::shared_ptr<Work> recv_reduce(at::Tensor& tensor, ReduceOp op,
                                            const PointToPointOptions& opts) = 0;
};

/// Options of AllToAllCommunicator::all_to_all. Split sizes count rows (slices along dim 0) and
/// hold one entry per rank; empty = world_size equal parts.
struct AllToAllOptions {
  std::vector<int64_t> input_split_sizes;   ///< rows of `input` for rank 0, 1, ...
  std::vector<int64_t> output_split_sizes;  ///< rows of `output` from rank 0, 1, ...
  double timeout_s = 0;
};

/// ABI 1.13. A Communicator with an all-to-all of uneven parts, as MPI_Alltoallv and c10d's
/// all_to_all_single: rank r sends rows [sum(input_split_sizes[:p]), + input_split_sizes[p]) of
/// `input` to rank p and receives rank p's part for it into `output` at row
/// sum(output_split_sizes[:p]); input_split_sizes[p] on rank r must equal output_split_sizes[r] on
/// rank p (expert parallelism: tokens to the ranks holding their experts and back). `input` and
/// `output` are contiguous, of one dtype, equal in every dimension but the first (any shape: a
/// row is the product of the others). Errors (Error naming the backend, the op and the sizes):
/// splits of another length than world_size, negative, or not adding up to the rows; `output`
/// overlapping `input`. Found with dynamic_cast; v1::all_to_all() falls back to send/recv.
class AllToAllCommunicator {
 public:
  virtual ~AllToAllCommunicator() = default;
  virtual std::shared_ptr<Work> all_to_all(const at::Tensor& input, at::Tensor& output,
                                           const AllToAllOptions& opts = {}) = 0;
};

/// ABI 1.6. A Model that reads Batch::position_ids and Batch::segment_ids (packing). A Batch
/// copied by a strategy built against an older SDK ends before those fields, so reading them
/// there would read past the object: the core calls set_batch_fields_available(false) before
/// training when the strategy's plugin is older than ABI 1.6, and the model must then neither
/// read those fields nor accept batches that need them (the core refuses such a dataset first).
/// Without the call (the default) the fields are available. Found with dynamic_cast.
class BatchFieldsReader {
 public:
  virtual ~BatchFieldsReader() = default;
  virtual void set_batch_fields_available(bool available) = 0;
};

/// ABI 1.12. A Strategy that shards parameters (fsdp, zero-3) and can make every one of them
/// whole on every rank for a while, as FSDP's summon_full_params: what generation with a KV
/// cache needs, since it reads the weights outside Strategy::forward (an online objective's
/// rollouts, rollout.hpp). Found with dynamic_cast on the Strategy.
class FullParameters {
 public:
  virtual ~FullParameters() = default;
  /// Gathers every parameter (trainable and frozen) into the model's tensors and keeps them
  /// whole until the returned scope is destroyed, which releases them to their shards.
  /// Collective over the strategy's shard group: every rank calls it at the same point, and
  /// nothing inside the scope may run Strategy::forward. Memory: the whole model per rank.
  virtual std::unique_ptr<Scope> full_parameters() = 0;
};

}  // namespace trainrun::v1
