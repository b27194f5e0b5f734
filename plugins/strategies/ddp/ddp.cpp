#include "ddp.hpp"

#include <trainrun/strategy/strategy_helpers.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <sstream>

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace ddp {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketItem>& order,
                                                int64_t first_cap_bytes, int64_t cap_bytes) {
  TR_CHECK(first_cap_bytes > 0 && cap_bytes > 0, "assign_buckets: caps must be positive (got ",
           first_cap_bytes, " and ", cap_bytes, " bytes)");
  struct Open {
    std::vector<size_t> positions;  // positions in `order`
    int64_t bytes = 0;
    int64_t cap = 0;
  };
  std::map<c10::ScalarType, Open> open;  // one open bucket per dtype
  std::vector<std::vector<size_t>> closed;  // positions in `order`
  auto close = [&](Open& b) {
    if (!b.positions.empty()) closed.push_back(std::move(b.positions));
    b.positions.clear();
    b.bytes = 0;
  };
  for (size_t pos = 0; pos < order.size(); ++pos) {
    const BucketItem& item = order[pos];
    auto [it, fresh] = open.try_emplace(item.dtype);
    Open& b = it->second;
    if (fresh) b.cap = first_cap_bytes;
    // Close first rather than overshoot: a bucket never exceeds its cap because of a later
    // item, and an item at least as large as the cap ends up alone.
    if (!b.positions.empty() && b.bytes + item.bytes > b.cap) {
      close(b);
      b.cap = cap_bytes;
    }
    b.positions.push_back(pos);
    b.bytes += item.bytes;
    if (b.bytes >= b.cap) {
      close(b);
      b.cap = cap_bytes;
    }
  }
  for (auto& [dtype, b] : open) close(b);
  // Launch order = the order in which each bucket's first gradient is expected.
  std::sort(closed.begin(), closed.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  std::vector<std::vector<size_t>> out;
  out.reserve(closed.size());
  for (const auto& positions : closed) {
    std::vector<size_t> indices;
    indices.reserve(positions.size());
    for (size_t pos : positions) indices.push_back(order[pos].index);
    out.push_back(std::move(indices));
  }
  return out;
}

}  // namespace ddp

namespace {

constexpr const char* kName = "strategy 'ddp'";
constexpr double kMiB = 1024.0 * 1024.0;

using Clock = std::chrono::steady_clock;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction and setup

void DdpStrategy::declare_options(OptionSchema& s) {
  s.real("bucket_cap_mb", 25.0,
         "largest gradient bucket in MiB; each bucket is one all-reduce (PyTorch's default)",
         1e-6, 1e6);
  s.real("first_bucket_mb", 1.0,
         "cap of the first bucket in MiB: small, so communication starts early in backward",
         1e-6, 1e6);
  s.boolean("overlap", true,
            "all-reduce each bucket as soon as its gradients are ready, during backward "
            "(false: all buckets after backward, e.g. to measure what overlap saves)");
  s.boolean("find_unused_parameters", false,
            "allow parameters that get no gradient in a step: they contribute zeros, and one "
            "that no rank used keeps no gradient (costs one extra small all-reduce per step)");
  GradientCompression::declare(
      s, "dtype of float32/float64 gradient buckets on the wire (PyTorch's fp16/bf16 "
         "compress hooks); restored to the parameters' dtype afterwards");
}

DdpStrategy::DdpStrategy(const Options& o, const RunContext& ctx)
    : ReplicatedStrategy(kName, "ddp", ctx),
      cap_bytes_(std::max<int64_t>(1, static_cast<int64_t>(o.get_double("bucket_cap_mb") * kMiB))),
      first_cap_bytes_(
          std::max<int64_t>(1, static_cast<int64_t>(o.get_double("first_bucket_mb") * kMiB))),
      overlap_(o.get_bool("overlap")),
      find_unused_(o.get_bool("find_unused_parameters")),
      compression_(GradientCompression::from_options(o, ctx.rank)) {}

void DdpStrategy::setup(Model& model, Accelerator& accelerator, const TrainPlan&) {
  // Rank 0's initial values everywhere, so every replica starts identical even when model
  // construction is not seeded alike (PyTorch's DDP does the same in its constructor).
  prepare(model, accelerator);
  // A tensor registered twice (tied weights) has one gradient: communicate it once.
  grads_.clear();
  for (const auto& p : distinct()) {
    GradSlot s;
    s.name = p.name;
    s.param = p.tensor;
    grads_.push_back(std::move(s));
  }
  // Gradients of a backward become ready roughly in reverse registration order (the last
  // layers first): the starting guess, replaced after the first step by what was observed.
  std::vector<size_t> order(grads_.size());
  std::iota(order.rbegin(), order.rend(), size_t{0});
  build_buckets(order);
  install_gradient_hooks([this](size_t i) { on_grad_ready(i); });
  std::lock_guard<std::mutex> g(mu_);
  reset_pass();
}

// ---------------------------------------------------------------------------------------------
// Buckets and hooks

void DdpStrategy::build_buckets(const std::vector<size_t>& order) {
  std::vector<ddp::BucketItem> items;
  items.reserve(order.size());
  for (size_t i : order) {
    const at::Tensor& p = grads_[i].param;
    items.push_back({i, static_cast<int64_t>(p.numel() * p.element_size()), p.scalar_type()});
  }
  const auto assignment = ddp::assign_buckets(items, first_cap_bytes_, cap_bytes_);
  std::vector<Bucket> buckets(assignment.size());
  for (size_t bi = 0; bi < assignment.size(); ++bi) {
    Bucket& b = buckets[bi];
    b.params = assignment[bi];
    int64_t total = 0;
    for (size_t i : b.params) {
      grads_[i].bucket = bi;
      grads_[i].offset = total;
      total += grads_[i].param.numel();
    }
    const at::Tensor& p0 = grads_[b.params.front()].param;
    b.flat = at::zeros({total}, p0.options().requires_grad(false));
    // Compression only where it shrinks the payload (float32/float64 buckets).
    b.wire = compression_.applies_to(p0.scalar_type())
                 ? at::zeros({total}, b.flat.options().dtype(compression_.wire_dtype))
                 : b.flat;
  }
  buckets_ = std::move(buckets);
}

void DdpStrategy::reset_pass() {
  for (auto& s : grads_) s.ready = false;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  next_launch_ = 0;
  ready_order_.clear();
  used_.assign(grads_.size(), 0);
  cur_bytes_ = 0;
  cur_launched_in_backward_ = 0;
}

void DdpStrategy::before_backward(bool sync) {
  check_setup("before_backward");
  std::lock_guard<std::mutex> g(mu_);
  sync_ = sync;
}

void DdpStrategy::on_grad_ready(size_t i) {
  std::lock_guard<std::mutex> g(mu_);
  // Accumulation micro-batches: autograd sums into .grad locally; nothing to send yet.
  if (!sync_) return;
  check_gradient_once(i, grads_[i].ready);
  mark_ready_locked(i, /*used=*/true);
  if (overlap_) launch_ready_buckets_locked(/*from_backward=*/true);
}

void DdpStrategy::mark_ready_locked(size_t i, bool used) {
  torch::NoGradGuard no_grad;
  GradSlot& s = grads_[i];
  Bucket& b = buckets_[s.bucket];
  at::Tensor slot = b.flat.narrow(0, s.offset, s.param.numel()).view(s.param.sizes());
  const at::Tensor& grad = s.param.grad();
  if (used && grad.defined()) {
    TR_CHECK(grad.layout() == c10::kStrided, kName, ": parameter '", s.name,
             "' has a sparse gradient; ddp reduces dense gradients only");
    slot.copy_(grad);
  } else {
    slot.zero_();  // an unused parameter contributes nothing to the average
  }
  s.ready = true;
  used_[i] = used ? 1 : 0;
  ready_order_.push_back(i);
  --b.pending;
}

void DdpStrategy::launch_ready_buckets_locked(bool from_backward) {
  // Strictly in bucket order: a ready bucket behind an unfinished one waits, so that every
  // rank issues the same sequence of all-reduces whatever order its hooks fire in.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch_locked(buckets_[next_launch_]);
    if (from_backward) ++cur_launched_in_backward_;
    ++next_launch_;
  }
}

void DdpStrategy::launch_locked(Bucket& b) {
  torch::NoGradGuard no_grad;
  AllReduceOptions opts;
  opts.op = ReduceOp::Avg;
  if (!b.wire.is_same(b.flat))
    opts.op = GradientCompression::fill_wire(b.wire, b.flat, opts.op, world_size_);
  b.work = comm_->all_reduce(b.wire, opts);
  cur_bytes_ += static_cast<int64_t>(b.wire.nbytes());
}

void DdpStrategy::finish_gradient_sync() {
  check_setup("finish_gradient_sync");
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  // Parameters whose hook did not fire in the sync backward: a gradient accumulated in an
  // earlier micro-batch of this step still counts (the parameter was used this step);
  // otherwise the parameter got no gradient at all.
  std::vector<size_t> missing;
  for (size_t i = 0; i < grads_.size(); ++i) {
    if (grads_[i].ready) continue;
    if (grads_[i].param.grad().defined())
      mark_ready_locked(i, /*used=*/true);
    else
      missing.push_back(i);
  }
  if (!missing.empty() && !find_unused_) {
    // Raised before waiting for anything: the peers' matching all-reduces fail when this
    // process ends, instead of every rank waiting for a bucket that never completes.
    const std::string names = missing_names(missing);
    sync_ = true;
    TR_CHECK_TYPED(ConfigError, false, kName, ": parameters that received no gradient this step: ",
                   names, ". Set [strategy] find_unused_parameters = true if the model does not "
                   "use every parameter in every step");
  }
  for (size_t i : missing) mark_ready_locked(i, /*used=*/false);
  launch_ready_buckets_locked(/*from_backward=*/false);
  TR_CHECK(next_launch_ == buckets_.size(), kName, ": internal error: ", next_launch_, " of ",
           buckets_.size(), " buckets launched after backward");

  // One more collective with find_unused_parameters: whether any rank used each parameter, so
  // a parameter nobody used keeps no gradient (as in a single-process run, where the optimizer
  // then skips it) while one used somewhere gets the average including the others' zeros.
  at::Tensor used;
  std::shared_ptr<Work> used_work;
  if (find_unused_) {
    used = at::from_blob(used_.data(), {static_cast<int64_t>(used_.size())}, at::kByte)
               .to(device_)
               .clone();
    AllReduceOptions o;
    o.op = ReduceOp::Max;
    used_work = comm_->all_reduce(used, o);
  }
  for (auto& b : buckets_) b.work->wait();
  if (used_work) used_work->wait();
  exposed_s_ = std::chrono::duration<double>(Clock::now() - t0).count();

  torch::NoGradGuard no_grad;
  for (auto& b : buckets_)
    if (!b.wire.is_same(b.flat)) b.flat.copy_(b.wire);
  const at::Tensor used_cpu = used.defined() ? used.cpu() : at::Tensor();
  for (size_t i = 0; i < grads_.size(); ++i) {
    GradSlot& s = grads_[i];
    if (used_cpu.defined() && used_cpu.data_ptr<uint8_t>()[i] == 0) {
      s.param.mutable_grad() = at::Tensor();
      continue;
    }
    // The gradient becomes a view of its bucket slot (PyTorch's gradient_as_bucket_view):
    // no copy back, and zero_grad() drops the view before the next backward writes the slot.
    s.param.mutable_grad() =
        buckets_[s.bucket].flat.narrow(0, s.offset, s.param.numel()).view(s.param.sizes());
  }

  last_comm_bytes_ = cur_bytes_;
  last_launched_in_backward_ = cur_launched_in_backward_;
  if (!rebuilt_) rebuild_buckets_locked();
  reset_pass();
  sync_ = true;
}

void DdpStrategy::rebuild_buckets_locked() {
  // The order the gradients arrived in on this rank (those of the sync backward first, then
  // the rest), replaced by rank 0's: every rank must build the same buckets, and the hooks'
  // order may differ between ranks (e.g. unused parameters, autograd thread scheduling).
  std::vector<int64_t> order(ready_order_.begin(), ready_order_.end());
  rebuilt_ = true;
  if (world_size_ > 1) {
    at::Tensor t = at::from_blob(order.data(), {static_cast<int64_t>(order.size())}, at::kLong)
                       .to(device_)
                       .clone();
    comm_->broadcast(t, {})->wait();
    const at::Tensor c = t.cpu();
    std::copy(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel(), order.begin());
  }
  std::vector<size_t> new_order(order.begin(), order.end());
  std::vector<size_t> current;
  for (const auto& b : buckets_) current.insert(current.end(), b.params.begin(), b.params.end());
  std::vector<size_t> sorted = new_order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t k = 0; k < sorted.size(); ++k)
    TR_CHECK(sorted[k] == k, kName, ": internal error: the observed gradient order is not a "
             "permutation of the ", grads_.size(), " parameters");
  // The gradients of this step stay valid: they are views that keep the old buckets alive.
  if (new_order != current) build_buckets(new_order);
}

// ---------------------------------------------------------------------------------------------
// The rest of the Strategy interface

ModelOutput DdpStrategy::forward(const Batch& batch) {
  check_setup("forward");
  return model_->forward(batch_to_device(batch, device_));
}

void DdpStrategy::add_step_metrics(std::map<std::string, double>& extra) {
  extra["comm_bytes"] = static_cast<double>(last_comm_bytes_);
  extra["comm_exposed_s"] = exposed_s_;
  extra["buckets"] = static_cast<double>(buckets_.size());
  extra["buckets_overlapped"] = static_cast<double>(last_launched_in_backward_);
}

std::vector<std::vector<std::string>> DdpStrategy::bucket_layout() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets_) {
    out.emplace_back();
    for (size_t i : b.params) out.back().push_back(grads_[i].name);
  }
  return out;
}

}  // namespace trainrun::plugins
