#include "ring_strategy.hpp"

#include <trainrun/collectives/ring.hpp>
#include <trainrun/collectives/ring_all_gather.hpp>
#include <trainrun/strategy/strategy_helpers.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Pure helpers

namespace ring_strategy {

std::vector<std::vector<size_t>> plan_fusion(const std::vector<FusionItem>& items,
                                             int64_t threshold_bytes) {
  TR_CHECK(threshold_bytes >= 0, "plan_fusion: negative threshold (", threshold_bytes, " bytes)");
  struct Open {
    std::vector<size_t> positions;
    int64_t bytes = 0;
  };
  std::map<c10::ScalarType, Open> open;  // one open buffer per dtype (a buffer is one tensor)
  std::vector<std::vector<size_t>> closed;
  auto close = [&](Open& b) {
    if (!b.positions.empty()) closed.push_back(std::move(b.positions));
    b.positions.clear();
    b.bytes = 0;
  };
  for (size_t pos = 0; pos < items.size(); ++pos) {
    Open& b = open[items[pos].dtype];
    // Close rather than overshoot: a buffer never exceeds the threshold unless it holds a
    // single tensor that is larger by itself (Horovod reduces such a tensor on its own).
    if (!b.positions.empty() && b.bytes + items[pos].bytes > threshold_bytes) close(b);
    b.positions.push_back(pos);
    b.bytes += items[pos].bytes;
  }
  for (auto& [dtype, b] : open) close(b);
  std::sort(closed.begin(), closed.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  std::vector<std::vector<size_t>> out;
  for (const auto& positions : closed) {
    out.emplace_back();
    for (size_t pos : positions) out.back().push_back(items[pos].index);
  }
  return out;
}

std::string timeline_path_for_rank(const std::string& path, const std::string& run_dir, int rank) {
  fs::path p(path);
  if (p.is_relative() && !run_dir.empty()) p = fs::path(run_dir) / p;
  const std::string ext = p.extension().string();
  const std::string stem = p.stem().string();
  return (p.parent_path() / (stem + "-rank-" + std::to_string(rank) + ext)).string();
}

}  // namespace ring_strategy

namespace {

constexpr const char* kName = "strategy 'ring'";
constexpr double kMiB = 1024.0 * 1024.0;
// Point-to-point tags. Negotiation and data never overlap in time (one thread issues both), but
// distinct tags make a stray message a timeout instead of a silently mixed tensor.
constexpr int kNegotiateTag = 0x524e;  // "RN"
constexpr int kDataTag = 0x5244;       // "RD"
constexpr int kGatherTag = 0x5247;     // "RG"
constexpr int kUsedTag = 0x5255;       // "RU"
// The round that tells the other ranks this one gives up waits at most this long per message:
// if they are not cycling (dead, or stuck elsewhere), this rank ends with its own error anyway.
constexpr double kAbortRoundTimeoutS = 10;

std::string json_escape(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o;
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
      timeline_max_steps_(o.get_int("timeline_max_steps")),
      local_rank_(ctx.local_rank),
      local_world_size_(ctx.local_world_size) {
  const std::string& tl = o.get_string("timeline");
  if (!tl.empty()) timeline_path_ = ring_strategy::timeline_path_for_rank(tl, ctx.run_dir, rank_);
}

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
    if (timeline_dirty_) write_timeline();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: could not write the timeline: %s\n", kName, rank_, e.what());
  }
}

double RingStrategy::now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
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
  for (const auto& p : distinct()) {
    Slot s;
    s.name = p.name;
    s.param = p.tensor;
    s.numel = p.tensor.numel();
    s.dtype = p.tensor.scalar_type();
    s.bytes = s.numel * static_cast<int64_t>(p.tensor.element_size());
    slots_.push_back(std::move(s));
  }
  // Reduction order: reverse registration order, roughly the order backward produces the
  // gradients, so the first agreed tensors fill the first buffers.
  reduce_order_.resize(slots_.size());
  std::iota(reduce_order_.rbegin(), reduce_order_.rend(), size_t{0});

  // One fusion buffer per dtype, as Horovod keeps one: the threshold, but no more than all of
  // that dtype's gradients, and at least the largest one (a tensor over the threshold is still
  // reduced through the buffer, alone).
  std::map<c10::ScalarType, std::pair<int64_t, int64_t>> per_dtype;  // total, largest (elements)
  for (const auto& s : slots_) {
    auto& [total, largest] = per_dtype[s.dtype];
    total += s.numel;
    largest = std::max(largest, s.numel);
  }
  for (const auto& [dtype, tl] : per_dtype) {
    const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t cap = std::max(std::min(tl.first, threshold_bytes_ / esize), tl.second);
    auto opts = at::TensorOptions().dtype(dtype).device(device_);
    fusion_[dtype] = at::zeros({cap}, opts);
    if (compression_.applies_to(dtype))
      wire_[dtype] = at::zeros({cap}, opts.dtype(compression_.wire_dtype));
  }

  if (hierarchical_) setup_hierarchy();
  install_gradient_hooks([this](size_t i) { on_grad_ready(i); });
  thread_ = std::thread([this] { background_loop(); });
}

void RingStrategy::setup_hierarchy() {
  const int L = local_world_size_;
  if (L <= 1 || L >= world_size_) return;  // one node (or one rank per node): the flat ring
  TR_CHECK_TYPED(ConfigError, world_size_ % L == 0, kName, ": hierarchical = true needs the same "
                 "number of ranks on every node, but world size ", world_size_,
                 " is not a multiple of local_world_size ", L);
  // The groups below assume the launcher's numbering (rank = node x L + local rank); check it
  // on every rank, so a different numbering is a clear error and not a wrong reduction.
  const auto lopts = at::TensorOptions().dtype(at::kLong).device(device_);
  at::Tensor mine = at::tensor({static_cast<int64_t>(local_rank_), static_cast<int64_t>(L)}, lopts);
  at::Tensor all = at::empty({2 * world_size_}, lopts);
  comm_->all_gather(mine, all)->wait();
  const at::Tensor a = all.cpu();
  for (int r = 0; r < world_size_; ++r) {
    const int64_t lr = a.data_ptr<int64_t>()[2 * r], lw = a.data_ptr<int64_t>()[2 * r + 1];
    TR_CHECK_TYPED(ConfigError, lw == L && lr == r % L, kName, ": hierarchical = true needs "
                   "ranks numbered node by node (rank = node x local_world_size + local_rank) "
                   "with the same local_world_size everywhere, but rank ", r, " has local rank ",
                   lr, " of ", lw, " (rank ", rank_, " has ", local_rank_, " of ", L, ")");
  }
  // c10d semantics: every rank creates every group, in the same order; members get theirs.
  const int nodes = world_size_ / L;
  for (int node = 0; node < nodes; ++node) {
    std::vector<int> ranks(L);
    std::iota(ranks.begin(), ranks.end(), node * L);
    auto g = comm_->new_group(ranks);
    if (node == rank_ / L) local_comm_ = g;
  }
  for (int l = 0; l < L; ++l) {
    std::vector<int> ranks;
    for (int node = 0; node < nodes; ++node) ranks.push_back(node * L + l);
    auto g = comm_->new_group(ranks);
    if (l == rank_ % L) cross_comm_ = g;
  }
  TR_CHECK(local_comm_ && cross_comm_, kName, ": rank ", rank_,
           ": new_group did not return this rank's node or cross-node group");
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
  TR_CHECK(!slots_[i].ready, kName, ": parameter '", slots_[i].name, "' received a gradient "
           "twice in one synchronised backward (one backward per micro-batch, with "
           "before_backward() before each)");
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
  s.t_ready = t;
}

void RingStrategy::start_pass_locked() {
  for (auto& s : slots_) s.done = false;
  pass_active_ = true;
  pass_done_ = false;
  pass_error_ = nullptr;
  cv_.notify_all();
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
    if (!pass_active_ && !pass_done_) start_pass_locked();
    finishing_ = true;
    cv_.notify_all();
    done_cv_.wait(lk, [&] { return pass_done_; });
    abort_ = false;
    finishing_ = false;
    pass_done_ = false;
    sync_ = true;
    t_backward_ = 0;
    for (auto& s : slots_) s.ready = false, s.grad = at::Tensor();
    TR_CHECK_TYPED(ConfigError, false, kName, ": parameters that received no gradient this step "
                   "on rank ", rank_, ": ", names, ". Set [strategy] find_unused_parameters = "
                   "true if the model does not use every parameter in every step");
  }
  for (size_t i : missing) {
    slots_[i].param.mutable_grad() = at::zeros_like(slots_[i].param);  // contributes zeros
    mark_ready_locked(i, /*used=*/false, t);
  }
  if (!pass_active_ && !pass_done_) start_pass_locked();
  finishing_ = true;
  cv_.notify_all();
  done_cv_.wait(lk, [&] { return pass_done_; });
  cur_.exposed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::exception_ptr err = pass_error_;
  // Ready for the next step, whatever happened.
  finishing_ = false;
  pass_done_ = false;
  pass_error_ = nullptr;
  sync_ = true;
  t_backward_ = 0;
  for (auto& s : slots_) s.ready = false, s.grad = at::Tensor();
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
  if (timeline_dirty_ && timeline_max_steps_ > 0 && step_ == timeline_max_steps_) {
    write_timeline();
    timeline_dirty_ = false;
  }
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
  const int N = world_size_;
  buffer_spans_.clear();
  round_spans_.clear();
  round_numbers_.clear();
  // The first round comes one cycle after the first gradient, as in Horovod's loop (a tensor
  // waits for the next cycle tick), so the first buffer holds what backward produced meanwhile
  // rather than the first gradient alone.
  auto next_cycle = Clock::now() + std::chrono::duration_cast<Clock::duration>(cycle_);
  size_t reduced = 0;
  bool abort_sent = false;
  for (int64_t round = 1;; ++round) {
    // The vote: byte i = 1 when tensor i is not ready here; bytes T..T+N-1 flag the ranks that
    // give up. MAX over ranks: 0 at i means ready everywhere (an AND of readiness).
    at::Tensor vote = at::zeros({static_cast<int64_t>(T) + N}, at::kByte);
    uint8_t* v = vote.data_ptr<uint8_t>();
    std::string not_ready_here;
    {
      std::unique_lock<std::mutex> lk(mu_);
      // Horovod's cycle: sleep the rest of cycle_time between rounds while backward runs; no
      // sleep once every tensor is marked (finish_gradient_sync waits for us) or on abort.
      cv_.wait_until(lk, next_cycle, [&] { return finishing_ || abort_; });
      for (size_t i = 0; i < T; ++i) v[i] = slots_[i].ready ? 0 : 1;
      if (abort_) {
        v[T + static_cast<size_t>(rank_)] = 1;
        abort_sent = true;
      }
    }
    next_cycle = Clock::now() + std::chrono::duration_cast<Clock::duration>(cycle_);
    const double r0 = now_us();
    try {
      ring::Options o;
      o.op = ReduceOp::Max;
      o.chunk_bytes = chunk_bytes_;
      o.tag = kNegotiateTag;
      o.timeout_s = abort_sent ? kAbortRoundTimeoutS : 0;
      ring::all_reduce(*comm_, vote, o);
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
    std::vector<int> quitters;
    for (int r = 0; r < N; ++r)
      if (v[T + static_cast<size_t>(r)]) quitters.push_back(r);
    if (!quitters.empty()) {
      if (abort_sent) return;  // the main thread raises this rank's error
      std::string who;
      for (int r : quitters) who += (who.empty() ? "" : ", ") + std::to_string(r);
      TR_FAIL(kName, ": rank(s) ", who, " stopped the gradient reduction of step ", step_ + 1,
              " with an error (see their messages); tensors not yet reduced: ", pending_names());
    }
    std::vector<size_t> agreed;
    for (size_t i : reduce_order_)
      if (!slots_[i].done && v[i] == 0) agreed.push_back(i);
    if (!agreed.empty()) {
      round_spans_.push_back({r0, r1});
      round_numbers_.push_back(round);
      for (size_t i : agreed) slots_[i].t_agreed = r1;
      reduce_agreed(agreed, round);
      reduced += agreed.size();
    }
    if (reduced == T) break;
  }
  if (find_unused_) {
    at::Tensor used = at::zeros({static_cast<int64_t>(T)}, at::kByte);
    {
      std::lock_guard<std::mutex> g(mu_);
      for (size_t i = 0; i < T; ++i) used.data_ptr<uint8_t>()[i] = slots_[i].used ? 1 : 0;
    }
    ring::Options o;
    o.op = ReduceOp::Max;
    o.tag = kUsedTag;
    ring::all_reduce(*comm_, used, o);
    used_any_.assign(used.data_ptr<uint8_t>(), used.data_ptr<uint8_t>() + T);
  }
  if (!timeline_path_.empty() && (timeline_max_steps_ == 0 || step_ < timeline_max_steps_))
    record_pass_events();
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
  for (const auto& members : ring_strategy::plan_fusion(items, threshold_bytes_)) {
    const c10::ScalarType dtype = slots_[members.front()].dtype;
    at::Tensor& buffer = fusion_.at(dtype);
    const int buffer_no = static_cast<int>(cur_.buffers);
    BufferSpan span;
    span.t0 = now_us();
    span.round = round;
    int64_t off = 0;
    for (size_t i : members) {
      Slot& s = slots_[i];
      s.t_in0 = now_us();
      buffer.narrow(0, off, s.numel).copy_(grads[i].reshape({-1}));
      s.t_in1 = now_us();
      s.buffer = buffer_no;
      off += s.numel;
    }
    at::Tensor flat = buffer.narrow(0, 0, off);
    auto w = wire_.find(dtype);
    at::Tensor wire;
    ReduceOp op = average_ ? ReduceOp::Avg : ReduceOp::Sum;
    if (w != wire_.end()) {
      // Compression as Horovod's fp16 compressor: cast, sum, cast back.
      wire = w->second.narrow(0, 0, off);
      op = GradientCompression::fill_wire(wire, flat, op, world_size_);
    } else {
      wire = flat;
    }
    span.red0 = now_us();
    all_reduce(wire, op);
    span.red1 = now_us();
    if (!wire.is_same(flat)) flat.copy_(wire);
    off = 0;
    for (size_t i : members) {
      Slot& s = slots_[i];
      s.t_red0 = span.red0;
      s.t_red1 = span.red1;
      s.t_out0 = now_us();
      grads[i].copy_(flat.narrow(0, off, s.numel).view(grads[i].sizes()));
      s.t_out1 = now_us();
      s.done = true;
      off += s.numel;
    }
    span.t1 = now_us();
    span.tensors = static_cast<int64_t>(members.size());
    span.bytes = static_cast<int64_t>(wire.nbytes());
    span.dtype = dtype_name(wire.scalar_type());
    buffer_spans_.push_back(span);
    cur_.comm_bytes += span.bytes;
    ++cur_.buffers;
    if (in_backward) ++cur_.buffers_in_backward;
  }
}

void RingStrategy::all_reduce(at::Tensor& wire, ReduceOp op) {
  ring::Options o;
  o.chunk_bytes = chunk_bytes_;
  o.tag = kDataTag;
  try {
    if (!local_comm_) {
      o.op = op;
      ring::all_reduce(*comm_, wire, o);
      return;
    }
    // Hierarchical (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE, on send/recv only):
    //  1. ring all-reduce (sum) within the node: every local rank holds the node's sum. (A
    //     reduce-scatter would move (L-1)/L of the buffer less inside the node; the SDK's ring
    //     offers the all-reduce, and intra-node bandwidth is the cheap kind.)
    //  2. local rank l all-reduces (sum) shard l of the buffer across nodes, with the ranks of
    //     the same local rank: the inter-node traffic is 1/L of a flat ring's per rank.
    //  3. ring all-gather of the shards within the node.
    // Every rank ends with identical values: each shard's sum is computed once per node group.
    o.op = ReduceOp::Sum;
    ring::all_reduce(*local_comm_, wire, o);
    const int L = local_comm_->world_size();
    auto [b, e] = ring::segment(wire.numel(), L, local_comm_->rank());
    at::Tensor shard = wire.slice(0, b, e);
    if (e > b) ring::all_reduce(*cross_comm_, shard, o);
    ring::all_gather_segments(*local_comm_, wire, kGatherTag);
    if (op == ReduceOp::Avg) wire.div_(world_size_);
  } catch (const std::exception& e) {
    TR_FAIL(kName, ": rank ", rank_, ": ring all-reduce of a fused buffer (", wire.numel(), " ",
            dtype_name(wire.scalar_type()), ") in step ", step_ + 1, " failed: ", e.what(),
            ". Tensors not yet reduced: ", pending_names());
  }
}

// ---------------------------------------------------------------------------------------------
// Timeline (Chrome Trace Event Format: "X" complete events in µs, "M" metadata)

void RingStrategy::record_pass_events() {
  const int64_t step = step_ + 1;
  double t_backward;
  {
    std::lock_guard<std::mutex> g(mu_);
    t_backward = t_backward_;
  }
  const std::string step_arg = detail::cat("\"step\":", step);
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    const int tid = static_cast<int>(i) + 1;
    const std::string buf = detail::cat(step_arg, ",\"buffer\":", s.buffer);
    const double wait0 = t_backward > 0 ? std::min(t_backward, s.t_ready) : s.t_ready;
    events_.push_back({"WAIT_FOR_READY", tid, wait0, s.t_ready - wait0, step_arg});
    events_.push_back({"NEGOTIATE", tid, s.t_ready, std::max(0.0, s.t_agreed - s.t_ready), step_arg});
    events_.push_back({"MEMCPY_IN_FUSION_BUFFER", tid, s.t_in0, s.t_in1 - s.t_in0, buf});
    events_.push_back({"RING_ALLREDUCE", tid, s.t_red0, s.t_red1 - s.t_red0,
                       detail::cat(buf, ",\"bytes\":", s.bytes)});
    events_.push_back({"MEMCPY_OUT_FUSION_BUFFER", tid, s.t_out0, s.t_out1 - s.t_out0, buf});
  }
  for (size_t k = 0; k < round_spans_.size(); ++k)
    events_.push_back({"NEGOTIATION_ROUND", 0, round_spans_[k].first,
                       round_spans_[k].second - round_spans_[k].first,
                       detail::cat(step_arg, ",\"round\":", round_numbers_[k])});
  for (size_t k = 0; k < buffer_spans_.size(); ++k) {
    const BufferSpan& b = buffer_spans_[k];
    events_.push_back({"FUSED_BUFFER", 0, b.t0, b.t1 - b.t0,
                       detail::cat(step_arg, ",\"buffer\":", k, ",\"round\":", b.round,
                                   ",\"tensors\":", b.tensors, ",\"bytes\":", b.bytes,
                                   ",\"wire_dtype\":\"", b.dtype, "\",\"allreduce_us\":",
                                   b.red1 - b.red0)});
  }
  timeline_dirty_ = true;
}

void RingStrategy::write_timeline() {
  const fs::path path(timeline_path_);
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  const std::string tmp = timeline_path_ + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    TR_CHECK(f.good(), kName, ": cannot write the timeline to '", tmp, "'");
    f.precision(3);
    f << std::fixed;
    f << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"strategy\":\"ring\",\"rank\":" << rank_
      << ",\"world_size\":" << world_size_ << ",\"fusion_threshold_bytes\":" << threshold_bytes_
      << ",\"cycle_time_ms\":" << cycle_.count() << ",\"compression\":\"" << compression_.name
      << "\",\"hierarchical\":" << (local_comm_ ? "true" : "false") << "},\"traceEvents\":[\n";
    // Metadata: one process per rank, one thread (track) per tensor plus track 0 for the
    // negotiation rounds and fused buffers.
    f << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << rank_
      << ",\"tid\":0,\"args\":{\"name\":\"rank " << rank_ << "\"}},\n";
    f << "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" << rank_
      << ",\"tid\":0,\"args\":{\"sort_index\":" << rank_ << "}},\n";
    f << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << rank_
      << ",\"tid\":0,\"args\":{\"name\":\"ring: negotiation and fused buffers\"}}";
    for (size_t i = 0; i < slots_.size(); ++i) {
      f << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << rank_ << ",\"tid\":" << i + 1
        << ",\"args\":{\"name\":\"" << json_escape(slots_[i].name) << "\"}}";
      f << ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" << rank_ << ",\"tid\":"
        << i + 1 << ",\"args\":{\"sort_index\":" << i + 1 << "}}";
    }
    for (const Event& e : events_) {
      f << ",\n{\"name\":\"" << e.name << "\",\"cat\":\"ring\",\"ph\":\"X\",\"ts\":" << e.ts
        << ",\"dur\":" << std::max(0.0, e.dur) << ",\"pid\":" << rank_ << ",\"tid\":" << e.tid
        << ",\"args\":{" << e.args << "}}";
    }
    f << "\n]}\n";
    f.flush();
    TR_CHECK(f.good(), kName, ": writing the timeline to '", tmp, "' failed");
  }
  fs::rename(tmp, timeline_path_);  // atomic: a reader sees the old file or the new one
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
