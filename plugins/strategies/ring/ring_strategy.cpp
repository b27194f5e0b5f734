#include "ring_strategy.hpp"

#include <trainrun/strategy/strategy_helpers.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace trainrun::plugins {

using namespace trainrun::v1;
using ring_strategy::now_us;

namespace {

constexpr const char* kName = "strategy 'ring'";
constexpr double kMiB = 1024.0 * 1024.0;
// The round that tells the other ranks this one gives up waits at most this long per message:
// if they are not cycling (dead, or stuck elsewhere), this rank ends with its own error anyway.
constexpr double kAbortRoundTimeoutS = 10;

std::string timeline_file(const Options& o, const RunContext& ctx) {
  const std::string& tl = o.get_string("timeline");
  return tl.empty() ? std::string()
                    : ring_strategy::timeline_path_for_rank(tl, ctx.run_dir, ctx.rank);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

void RingStrategy::declare_options(OptionSchema& s) {
  s.real("fusion_threshold_mb", 128.0,
         "largest fusion buffer in MiB (Horovod's HOROVOD_FUSION_THRESHOLD): gradients agreed in "
         "one cycle are packed into buffers up to this size, one ring all-reduce each; 0 = no "
         "fusion, one all-reduce per tensor",
         0.0, 1e6);
  s.real("cycle_time_ms", 1.0,
         "milliseconds between negotiation rounds while backward runs (Horovod's "
         "HOROVOD_CYCLE_TIME); after backward the rounds run back to back",
         0.0, 1e5);
  s.choice("op", "average", {"average", "sum"},
           "gradient reduction over ranks: average (what the trainer's loss normalisation "
           "expects; reproduces the single-process run) or sum (Horovod's op=Sum: gradients "
           "come out multiplied by the world size, so scale the learning rate down to match)");
  GradientCompression::declare(
      s, "dtype of float32/float64 fusion buffers on the wire (Horovod's Compression.fp16); "
         "averages are divided by the world size before the cast so the 16-bit sum cannot "
         "overflow, and restored to the gradients' dtype afterwards",
      /*deprecated_alias=*/"compression");
  s.boolean("hierarchical", false,
            "when the job spans several nodes: all-reduce within each node, then across nodes "
            "among the ranks with the same local rank (each a 1/local_world_size shard), then "
            "gather within the node (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE); a flat ring on "
            "one node. Needs the launcher's numbering: rank = node_rank x nproc_per_node + "
            "local_rank");
  s.boolean("find_unused_parameters", false,
            "allow parameters that get no gradient in a step: they contribute zeros, and one "
            "that no rank used keeps no gradient (one extra small all-reduce per step)");
  s.integer("chunk_kb", 4096,
            "pipelining unit of the ring all-reduce in KiB: a chunk is forwarded as soon as it "
            "is reduced (4096 measured fastest on gloo-cpu's shared memory at 2 and 4 ranks)",
            1, 1 << 20);
  s.string("timeline", "",
           "write a Chrome trace (open in Perfetto or chrome://tracing) of every tensor's "
           "WAIT_FOR_READY, NEGOTIATE, MEMCPY_IN_FUSION_BUFFER, RING_ALLREDUCE and "
           "MEMCPY_OUT_FUSION_BUFFER; one file per rank, as the metrics callback names them: \"t.json\" becomes t-rank-0.json, ...; "
           "relative to [trainer] run_dir; empty = off");
  s.integer("timeline_max_steps", 100,
            "record the timeline for this many steps (the file is written when they are done "
            "and at the end of the run); 0 = every step",
            0, 1e9);
}

RingStrategy::RingStrategy(const Options& o, const RunContext& ctx)
    : ReplicatedStrategy(kName, "ring", ctx),
      threshold_bytes_(static_cast<int64_t>(o.get_double("fusion_threshold_mb") * kMiB)),
      cycle_(o.get_double("cycle_time_ms")),
      average_(o.get_string("op") == "average"),
      compression_(GradientCompression::from_options(o, ctx.rank, "compression")),
      hierarchical_(o.get_bool("hierarchical")),
      find_unused_(o.get_bool("find_unused_parameters")),
      chunk_bytes_(o.get_int("chunk_kb") * 1024),
      local_rank_(ctx.local_rank),
      local_world_size_(ctx.local_world_size),
      timeline_(kName, timeline_file(o, ctx), o.get_int("timeline_max_steps")) {}

RingStrategy::~RingStrategy() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    // An active pass at destruction means the main thread left mid-step (an exception): tell
    // the other ranks in the next round rather than leave them waiting for this one.
    if (pass_active_) abort_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  hooks_.remove();
  try {
    if (timeline_.dirty()) write_timeline();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: could not write the timeline: %s\n", kName, rank_, e.what());
  }
}

void RingStrategy::check_device(c10::Device device) const {
  // The ring stages chunks in host tensors and reduces them with ATen on the calling thread;
  // a device model would work the same way but is untested until a device backend exists.
  TR_CHECK(device.is_cpu(), kName, ": runs on CPU accelerators only for now (device ", device,
           ")");
}

void RingStrategy::check_parameter(const NamedTensor& p) const {
  TR_CHECK(communicator_dtype(p.tensor.scalar_type()), kName, ": parameter '", p.name, "' is ",
           dtype_name(p.tensor.scalar_type()), ", which the communicators do not reduce");
}

// ---------------------------------------------------------------------------------------------
// Setup

void RingStrategy::setup(Model& model, Accelerator& accelerator, const TrainPlan&) {
  // The replica check is also the "order check" of the negotiation: identical tensor lists
  // mean a tensor index names the same tensor on every rank, so the byte-per-tensor vote and
  // the fusion order agree everywhere.
  prepare(model, accelerator);
  std::vector<at::Tensor> tensors;
  std::vector<std::string> names;
  std::vector<int64_t> bytes;
  for (const auto& p : distinct()) {
    Slot s;
    s.name = p.name;
    s.param = p.tensor;
    s.numel = p.tensor.numel();
    s.dtype = p.tensor.scalar_type();
    s.bytes = s.numel * static_cast<int64_t>(p.tensor.element_size());
    tensors.push_back(s.param);
    names.push_back(s.name);
    bytes.push_back(s.bytes);
    slots_.push_back(std::move(s));
  }
  times_.resize(slots_.size());
  timeline_.set_tensors(std::move(names), std::move(bytes));
  // Reduction order: reverse registration order, roughly the order backward produces the
  // gradients, so the first agreed tensors fill the first buffers.
  reduce_order_.resize(slots_.size());
  std::iota(reduce_order_.rbegin(), reduce_order_.rend(), size_t{0});
  fusion_.allocate(tensors, threshold_bytes_, compression_, device_);
  if (hierarchical_) hierarchy_.setup(*comm_, device_, local_rank_, local_world_size_, kName);
  install_gradient_hooks([this](size_t i) { on_grad_ready(i); });
  thread_ = std::thread([this] { background_loop(); });
}

// ---------------------------------------------------------------------------------------------
// Main thread: forward, hooks, finish

ModelOutput RingStrategy::forward(const Batch& batch) {
  check_setup("forward");
  ModelOutput out = model_->forward(batch_to_device(batch, device_));
  std::lock_guard<std::mutex> g(mu_);
  if (sync_) t_backward_ = now_us();  // WAIT_FOR_READY starts when backward can start
  return out;
}

void RingStrategy::before_backward(bool sync) {
  check_setup("before_backward");
  std::lock_guard<std::mutex> g(mu_);
  sync_ = sync;
}

void RingStrategy::on_grad_ready(size_t i) {
  std::lock_guard<std::mutex> g(mu_);
  // Accumulation micro-batches: autograd sums into .grad locally; nothing to send yet.
  if (!sync_) return;
  check_gradient_once(i, slots_[i].ready);
  mark_ready_locked(i, /*used=*/true, now_us());
  // The first gradient of the synchronised backward starts the pass. Not earlier: the
  // trainer's batch-size all-reduce may still be in flight until the forward has run, and the
  // communicator must not be used by two threads at once.
  if (!pass_active_ && !pass_done_) start_pass_locked();
}

void RingStrategy::mark_ready_locked(size_t i, bool used, double t) {
  Slot& s = slots_[i];
  const at::Tensor& grad = s.param.grad();
  TR_CHECK(grad.defined(), kName, ": internal error: parameter '", s.name,
           "' marked ready without a gradient");
  TR_CHECK(grad.layout() == c10::kStrided && grad.numel() == s.numel, kName, ": parameter '",
           s.name, "' has a sparse or misshaped gradient; ring reduces dense gradients only");
  s.grad = grad;  // the background thread reads and writes it in place: .grad is final now
  s.ready = true;
  s.used = used;
  times_[i].ready = t;
}

void RingStrategy::start_pass_locked() {
  for (auto& s : slots_) s.done = false;
  pass_active_ = true;
  pass_done_ = false;
  pass_error_ = nullptr;
  cv_.notify_all();
}

void RingStrategy::finish_pass_locked(std::unique_lock<std::mutex>& lk) {
  if (!pass_active_ && !pass_done_) start_pass_locked();
  finishing_ = true;
  cv_.notify_all();
  done_cv_.wait(lk, [&] { return pass_done_; });
}

void RingStrategy::reset_pass_locked() {
  abort_ = false;
  finishing_ = false;
  pass_done_ = false;
  pass_error_ = nullptr;
  sync_ = true;
  t_backward_ = 0;
  for (auto& s : slots_) s.ready = false, s.grad = at::Tensor();
}

void RingStrategy::finish_gradient_sync() {
  check_setup("finish_gradient_sync");
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  const double t = now_us();
  if (t_backward_ == 0) t_backward_ = t;
  // Gradients whose hook did not fire in the synchronised backward: one accumulated in an
  // earlier micro-batch still counts; otherwise the parameter got no gradient this step.
  std::vector<size_t> missing;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].ready) continue;
    if (slots_[i].param.grad().defined())
      mark_ready_locked(i, /*used=*/true, t);
    else
      missing.push_back(i);
  }
  if (!missing.empty() && !find_unused_) {
    const std::string names = missing_names(missing);
    // Tell the other ranks (their rounds would otherwise wait for these tensors until the
    // collective timeout), then raise this rank's own error.
    abort_ = true;
    finish_pass_locked(lk);
    reset_pass_locked();
    TR_CHECK_TYPED(ConfigError, false, kName, ": parameters that received no gradient this step "
                   "on rank ", rank_, ": ", names, ". Set [strategy] find_unused_parameters = "
                   "true if the model does not use every parameter in every step");
  }
  for (size_t i : missing) {
    slots_[i].param.mutable_grad() = at::zeros_like(slots_[i].param);  // contributes zeros
    mark_ready_locked(i, /*used=*/false, t);
  }
  finish_pass_locked(lk);
  cur_.exposed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::exception_ptr err = pass_error_;
  reset_pass_locked();  // ready for the next step, whatever happened
  if (err) std::rethrow_exception(err);

  if (find_unused_) {
    // A parameter no rank used keeps no gradient, as in a single process (the optimizer then
    // skips it); one used somewhere has the average including the others' zeros.
    for (size_t i = 0; i < slots_.size(); ++i)
      if (!used_any_[i]) slots_[i].param.mutable_grad() = at::Tensor();
  }
  last_ = cur_;
  cur_ = Stats{};
  ++step_;
  if (timeline_.due(step_)) write_timeline();
}

// ---------------------------------------------------------------------------------------------
// Background thread: negotiation, fusion, ring all-reduce

void RingStrategy::background_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || pass_active_; });
    if (!pass_active_) return;
    lk.unlock();
    std::exception_ptr err;
    try {
      run_pass();
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    pass_active_ = false;
    pass_done_ = true;
    pass_error_ = err;
    done_cv_.notify_all();
  }
}

std::string RingStrategy::pending_names() const {
  std::string out;
  size_t k = 0, n = 0;
  for (size_t i : reduce_order_) {
    if (slots_[i].done) continue;
    ++n;
    if (k < 10) {
      out += (k ? ", " : "") + slots_[i].name;
      ++k;
    }
  }
  if (n > k) out += detail::cat(" and ", n - k, " more");
  return n ? out : "none";
}

void RingStrategy::run_pass() {
  const size_t T = slots_.size();
  buffer_spans_.clear();
  round_spans_.clear();
  // The first round comes one cycle after the first gradient, as in Horovod's loop (a tensor
  // waits for the next cycle tick), so the first buffer holds what backward produced meanwhile
  // rather than the first gradient alone.
  auto next_cycle = Clock::now() + std::chrono::duration_cast<Clock::duration>(cycle_);
  size_t reduced = 0;
  bool abort_sent = false;
  for (int64_t round = 1;; ++round) {
    ring_strategy::Vote vote(T, world_size_);
    {
      std::unique_lock<std::mutex> lk(mu_);
      // Horovod's cycle: sleep the rest of cycle_time between rounds while backward runs; no
      // sleep once every tensor is marked (finish_gradient_sync waits for us) or on abort.
      cv_.wait_until(lk, next_cycle, [&] { return finishing_ || abort_; });
      for (size_t i = 0; i < T; ++i) vote.set_ready(i, slots_[i].ready);
      if (abort_) {
        vote.give_up(rank_);
        abort_sent = true;
      }
    }
    next_cycle = Clock::now() + std::chrono::duration_cast<Clock::duration>(cycle_);
    const double r0 = now_us();
    try {
      vote.exchange(*comm_, chunk_bytes_, abort_sent ? kAbortRoundTimeoutS : 0);
    } catch (const std::exception& e) {
      if (abort_sent) return;  // this rank ends with its own error anyway
      std::string here;
      {
        std::lock_guard<std::mutex> g(mu_);
        for (size_t i : reduce_order_)
          if (!slots_[i].done && !slots_[i].ready) here += (here.empty() ? "" : ", ") + slots_[i].name;
      }
      TR_FAIL(kName, ": rank ", rank_, ": negotiation round ", round, " of step ", step_ + 1,
              " failed: ", e.what(), ". Tensors not yet reduced: ", pending_names(),
              here.empty() ? std::string(" (all ready on this rank)")
                           : " (not ready on this rank: " + here + ")");
    }
    const double r1 = now_us();
    ++cur_.rounds;
    cur_.negotiation_s += (r1 - r0) * 1e-6;
    const std::vector<int> quitters = vote.quitters();
    if (!quitters.empty()) {
      if (abort_sent) return;  // the main thread raises this rank's error
      std::string who;
      for (int r : quitters) who += (who.empty() ? "" : ", ") + std::to_string(r);
      TR_FAIL(kName, ": rank(s) ", who, " stopped the gradient reduction of step ", step_ + 1,
              " with an error (see their messages); tensors not yet reduced: ", pending_names());
    }
    std::vector<size_t> agreed;
    for (size_t i : reduce_order_)
      if (!slots_[i].done && vote.ready_everywhere(i)) agreed.push_back(i);
    if (!agreed.empty()) {
      round_spans_.push_back({r0, r1, round});
      for (size_t i : agreed) times_[i].agreed = r1;
      reduce_agreed(agreed, round);
      reduced += agreed.size();
    }
    if (reduced == T) break;
  }
  if (find_unused_) {
    std::vector<uint8_t> used(T);
    {
      std::lock_guard<std::mutex> g(mu_);
      for (size_t i = 0; i < T; ++i) used[i] = slots_[i].used ? 1 : 0;
    }
    used_any_ = ring_strategy::used_anywhere(*comm_, used);
  }
  if (timeline_.records(step_ + 1)) {
    double t_backward;
    {
      std::lock_guard<std::mutex> g(mu_);
      t_backward = t_backward_;
    }
    timeline_.record(step_ + 1, t_backward, times_, round_spans_, buffer_spans_);
  }
}

void RingStrategy::reduce_agreed(const std::vector<size_t>& agreed, int64_t round) {
  torch::NoGradGuard no_grad;
  bool in_backward;
  std::vector<at::Tensor> grads(slots_.size());
  {
    std::lock_guard<std::mutex> g(mu_);
    in_backward = !finishing_;
    for (size_t i : agreed) grads[i] = slots_[i].grad;
  }
  std::vector<ring_strategy::FusionItem> items;
  for (size_t i : agreed) items.push_back({i, slots_[i].bytes, slots_[i].dtype});
  const ReduceOp op = average_ ? ReduceOp::Avg : ReduceOp::Sum;
  const auto reduce = [this](at::Tensor& wire, ReduceOp o) { all_reduce(wire, o); };
  for (const auto& members : ring_strategy::plan_fusion(items, threshold_bytes_)) {
    const int buffer_no = static_cast<int>(cur_.buffers);
    ring_strategy::BufferSpan span = fusion_.reduce(slots_[members.front()].dtype, members, grads,
                                                    times_, op, world_size_, reduce);
    span.round = round;
    for (size_t i : members) {
      times_[i].buffer = buffer_no;
      slots_[i].done = true;
    }
    cur_.comm_bytes += span.bytes;
    buffer_spans_.push_back(std::move(span));
    ++cur_.buffers;
    if (in_backward) ++cur_.buffers_in_backward;
  }
}

void RingStrategy::all_reduce(at::Tensor& wire, ReduceOp op) {
  try {
    hierarchy_.all_reduce(*comm_, wire, op, chunk_bytes_);
  } catch (const std::exception& e) {
    TR_FAIL(kName, ": rank ", rank_, ": ring all-reduce of a fused buffer (", wire.numel(), " ",
            dtype_name(wire.scalar_type()), ") in step ", step_ + 1, " failed: ", e.what(),
            ". Tensors not yet reduced: ", pending_names());
  }
}

void RingStrategy::write_timeline() {
  ring_strategy::TimelineRun run;
  run.rank = rank_;
  run.world_size = world_size_;
  run.fusion_threshold_bytes = threshold_bytes_;
  run.cycle_time_ms = cycle_.count();
  run.compression = compression_.name;
  run.hierarchical = hierarchy_.active();
  timeline_.write(run);
}

// ---------------------------------------------------------------------------------------------
// The rest of the Strategy interface

void RingStrategy::add_step_metrics(std::map<std::string, double>& extra) {
  extra["comm_bytes"] = static_cast<double>(last_.comm_bytes);
  extra["comm_exposed_s"] = last_.exposed_s;
  extra["fused_buffers"] = static_cast<double>(last_.buffers);
  extra["fused_buffers_in_backward"] = static_cast<double>(last_.buffers_in_backward);
  extra["negotiation_rounds"] = static_cast<double>(last_.rounds);
  extra["negotiation_s"] = last_.negotiation_s;
}

}  // namespace trainrun::plugins
