#pragma once
// Strategy `ring`: data parallelism with Horovod's gradient reduction. Every rank holds the
// whole model (as ddp); gradients are averaged over the ranks by a background thread that
// negotiates which gradients are ready on every rank, fuses them into flat buffers and
// all-reduces each buffer with the bandwidth-optimal ring of <trainrun/collectives/ring.hpp>, built
// on the communicator's send/recv only, so it runs unchanged on every backend that has them.
//
// The algorithm, as in horovod/common/operations.cc (RunLoopOnce) and controller.cc:
//  - A post-hook on each parameter's gradient accumulator marks the gradient ready (on this
//    rank) once this backward's gradient is final. The first hook of a synchronised backward
//    wakes the background thread.
//  - Every cycle_time_ms the background thread runs one negotiation round: a MAX all-reduce of
//    a byte per tensor, "not ready here" (Horovod's coordinator message, without a
//    coordinator: the ring all-reduce gives every rank the same answer). A tensor whose byte
//    comes back 0 is ready on every rank; the agreed tensors are taken in one deterministic
//    order (reverse registration order, the order backward produces them), grouped per dtype
//    into fusion buffers of at most fusion_threshold_mb, and each buffer is copied in, ring
//    all-reduced and copied out. Every rank therefore builds the same buffers in the same order
//    whatever order its own hooks fired in: no deadlock and no mixed tensors.
//  - finish_gradient_sync() marks what backward did not (gradients accumulated in an earlier
//    micro-batch; unused parameters, an error unless find_unused_parameters), lets the thread
//    run rounds back to back until every tensor is reduced, and returns.
//  - All of this strategy's communication runs on the background thread and only between the
//    first hook of a synchronised backward and the end of finish_gradient_sync(); the trainer's
//    own collectives come after finish_gradient_sync() returns (and its batch-size all-reduce
//    before the first hook), so the two threads never use the communicator at the same time
//    (MPI is initialised MPI_THREAD_SERIALIZED) and every rank issues them in the same order.
//  - At setup every rank checks that all ranks hold the same parameters and buffers (names,
//    shapes, dtypes, trainable; the first difference is an error naming the tensor and the
//    ranks), then rank 0's values are broadcast, as ddp does.
//
// The parts, one concern each, tied together by RingStrategy: fusion.hpp (the fusion plan and
// buffers), negotiation.hpp (the vote), hierarchy.hpp (the flat or hierarchical all-reduce of a
// fused buffer) and timeline.hpp (the Chrome trace).
#include <trainrun/interfaces.hpp>
#include <trainrun/strategy/replicated_strategy.hpp>

#include <c10/core/ScalarType.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fusion.hpp"
#include "hierarchy.hpp"
#include "negotiation.hpp"
#include "timeline.hpp"

namespace trainrun::plugins {

/// The `ring` strategy. Options: fusion_threshold_mb (128), cycle_time_ms (1), op
/// ("average" | "sum"), gradient_compression ("none" | "fp16" | "bf16"; `compression` is its
/// deprecated name), hierarchical (false), find_unused_parameters (false), chunk_kb (4096),
/// timeline (""), timeline_max_steps (100).
class RingStrategy final : public v1::ReplicatedStrategy {
 public:
  static void declare_options(v1::OptionSchema& schema);
  RingStrategy(const v1::Options& options, const v1::RunContext& ctx);
  /// Stops the background thread (an active reduction is aborted for every rank), removes the
  /// hooks and writes the timeline.
  ~RingStrategy() override;

  /// ReplicatedStrategy::prepare (CPU only; same model on every rank, rank 0's values
  /// broadcast), then the fusion buffers, the hierarchy's groups, the hooks and the thread.
  /// The reduced gradients are identical on every rank (the ring's result is computed once per
  /// segment and copied), so the base's local grad_norm is the global one.
  void setup(v1::Model& model, v1::Accelerator& accelerator, const v1::TrainPlan& plan) override;
  v1::ModelOutput forward(const v1::Batch& batch) override;
  void before_backward(bool sync) override;
  void finish_gradient_sync() override;
  /// comm_bytes, fused_buffers, fused_buffers_in_backward, negotiation_rounds,
  /// negotiation_s, comm_exposed_s of the step just finished.
  void add_step_metrics(std::map<std::string, double>& extra) override;

 private:
  using Clock = std::chrono::steady_clock;

  /// One distinct trainable tensor. `ready`, `used` and `grad` are written by the hook (main
  /// thread) and read by the background thread, under mu_; `done` belongs to the background
  /// thread while a pass runs.
  struct Slot {
    std::string name;
    at::Tensor param;
    int64_t numel = 0;
    int64_t bytes = 0;
    c10::ScalarType dtype = c10::ScalarType::Float;
    // Per pass, under mu_.
    bool ready = false;
    bool used = false;
    at::Tensor grad;
    // Per pass, background thread.
    bool done = false;
  };

  void check_device(c10::Device device) const override;
  void check_parameter(const v1::NamedTensor& p) const override;
  void on_grad_ready(size_t i);
  void mark_ready_locked(size_t i, bool used, double t);
  void start_pass_locked();
  /// Once every tensor is marked: starts the pass if no hook did, lets it run its remaining
  /// rounds back to back and waits for its end.
  void finish_pass_locked(std::unique_lock<std::mutex>& lk);
  /// Ready for the next step: the pass's hand-over state and the tensors' marks cleared.
  void reset_pass_locked();
  /// Background thread: waits for a pass, runs it, reports its end.
  void background_loop();
  /// One whole reduction pass (rounds until every tensor is reduced). Throws on failure.
  void run_pass();
  /// Fuses and reduces the agreed tensors (reduction order) of one round.
  void reduce_agreed(const std::vector<size_t>& agreed, int64_t round);
  /// All-reduces a fused buffer over the world; a failure names the step and what is pending.
  void all_reduce(at::Tensor& wire, v1::ReduceOp op);
  /// "name, name, ... and N more" of the tensors not yet reduced in this pass.
  std::string pending_names() const;
  void write_timeline();

  // Options.
  int64_t threshold_bytes_;
  std::chrono::duration<double, std::milli> cycle_;
  bool average_;
  v1::GradientCompression compression_;
  bool hierarchical_;
  bool find_unused_;
  int64_t chunk_bytes_;
  int local_rank_;
  int local_world_size_;

  std::vector<Slot> slots_;           ///< distinct trainable tensors, registration order
  std::vector<size_t> reduce_order_;  ///< slots_ indices in reduction order (reverse)
  ring_strategy::FusionBuffers fusion_;
  ring_strategy::Hierarchy hierarchy_;

  // Hand-over between the main thread (hooks, finish) and the background thread.
  std::mutex mu_;
  std::condition_variable cv_;       ///< wakes the background thread
  std::condition_variable done_cv_;  ///< wakes finish_gradient_sync
  std::thread thread_;
  bool sync_ = true;
  bool stop_ = false;
  bool pass_active_ = false;
  bool pass_done_ = false;
  bool finishing_ = false;  ///< every tensor is marked: run rounds back to back
  bool abort_ = false;      ///< this rank gives up: tell the others in the next round
  std::exception_ptr pass_error_;
  double t_backward_ = 0;          ///< µs: end of the synchronised micro-batch's forward
  std::vector<uint8_t> used_any_;  ///< find_unused_parameters: used on some rank (per slot)

  // Counters of the current pass (background thread) and of the step just finished.
  struct Stats {
    int64_t comm_bytes = 0;
    int64_t buffers = 0;
    int64_t buffers_in_backward = 0;
    int64_t rounds = 0;
    double negotiation_s = 0;
    double exposed_s = 0;
  };
  Stats cur_, last_;

  // Timeline: what the current pass did when (times_[i].ready under mu_, the rest background
  // thread), and the recorded steps.
  std::vector<ring_strategy::TensorTimes> times_;        ///< per slot
  std::vector<ring_strategy::BufferSpan> buffer_spans_;  ///< current pass
  std::vector<ring_strategy::RoundSpan> round_spans_;    ///< rounds that agreed something
  int64_t step_ = 0;                                     ///< synchronised passes finished
  ring_strategy::Timeline timeline_;
};

}  // namespace trainrun::plugins
