#pragma once
// ShardedRuntime, the sharding engine at run time: one sharded model's flat parameters, gathered
// and released around each unit's forward and backward, its gradients reduced during backward in
// a fixed order, and its full or sharded state assembled. The policies it follows
// (RuntimeOptions) and the order it issues collectives in are described in
// trainrun/strategy/sharded_runtime.hpp; the grouping is plan_groups
// (trainrun/strategy/sharded_policy.hpp).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "trainrun/deferred_weights.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/strategy/gradient_hooks.hpp"
#include "trainrun/strategy/sharded_policy.hpp"
#include "trainrun/strategy/sharding.hpp"

namespace trainrun::v1::sharding {

/// Figures of the steps since the last take_metrics(), this rank.
struct RuntimeMetrics {
  double comm_bytes = 0;  ///< bytes sent: reduce-scatters, all-gathers, replica all-reduces
  double exposed_s = 0;   ///< seconds waited on communication outside backward
  double gathers = 0;     ///< all-gathers of flat parameters started
  double flat_bytes = 0;  ///< bytes held by the flat parameters now (shards, buffers)
  double max_unit_full_bytes = 0;  ///< peak bytes of gathered non-root unit parameters
  double frozen_bytes = 0;         ///< bytes held by frozen byte-sharded parameters now
};

/// One sharded model at run time. Construct in Strategy::setup, after the model is on the device
/// and identical on every rank (replicate_from_rank0). Installs autograd hooks on the parameters'
/// gradient accumulators and, for Units grouping without keep_full, UnitHooks on the model's
/// units; the destructor removes them. `shard` is the group a flat parameter is sharded over
/// (world, or the node in HYBRID_SHARD, or a group of one in NO_SHARD); `replicate` (may be
/// null) the group of ranks holding the same shard. Throws Error on a non-float32 trainable
/// parameter or a model without trainable parameters.
class ShardedRuntime : public UnitHooks, public UnitOutputHooks {
 public:
  ShardedRuntime(RuntimeOptions options, Model& model, Communicator& shard, Communicator* replicate)
      : opts_(std::move(options)), model_(&model), shard_(&shard), replicate_(replicate) {
    all_params_ = model.named_parameters();
    std::set<const void*> seen;
    for (const auto& p : all_params_) {
      const void* impl = p.tensor.unsafeGetTensorImpl();
      if (!seen.insert(impl).second) continue;  // tied weight: owned once, under its first name
      if (p.tensor.requires_grad()) grads_.push_back(p);
    }
    TR_CHECK(!grads_.empty(), opts_.name, ": the model has no parameter with requires_grad (",
             all_params_.size(), " parameters, all frozen)");
    for (const auto& p : grads_)
      TR_CHECK(p.tensor.scalar_type() == at::kFloat, opts_.name, ": parameter '", p.name, "' is ",
               p.tensor.scalar_type(),
               "; the sharding engine flattens float32 "
               "parameters (use a mixed precision that keeps float32 weights)");
    // ABI 1.7: a model whose weights wait in files is filled here, each flat parameter reading
    // only this rank's shard (trainrun/deferred_weights.hpp).
    deferred_ = dynamic_cast<DeferredWeights*>(&model);
    if (deferred_ != nullptr && !deferred_->weights_deferred()) deferred_ = nullptr;
    build_groups();
    if (uses_unit_hooks()) build_frozen();
    if (deferred_ != nullptr) fill_the_rest();
    install_hooks();
    if (uses_unit_hooks())
      for (Unit* u : units_) u->set_hooks(this);
    std::lock_guard<std::mutex> g(mu_);
    start_pass_locked(/*sync=*/true);
    pass_ = Pass::Closed;
  }

  ~ShardedRuntime() override {
    hooks_.remove();
    if (uses_unit_hooks())
      for (Unit* u : units_) u->set_hooks(nullptr);
  }
  ShardedRuntime(const ShardedRuntime&) = delete;
  ShardedRuntime& operator=(const ShardedRuntime&) = delete;

  /// This rank's pieces of every flat parameter (1-D leaves named like their parameters).
  std::vector<NamedTensor> optimizer_parameters() const {
    std::vector<NamedTensor> out;
    for (const auto& g : groups_)
      for (const auto& p : g.flat->optimizer_pieces()) out.push_back(p);
    return out;
  }

  /// Runs the model (the batch must already be on the device), gathering the root group first
  /// and prefetching the first units. Without grad mode (evaluation) everything is released
  /// afterwards.
  ModelOutput forward(const Batch& batch) {
    if (root_group_ >= 0) gather_group(root_group_);
    prefetch_forward(-1);
    ModelOutput out;
    if (opts_.param_dtype != at::kFloat && batch.input.defined() &&
        at::isFloatingType(batch.input.scalar_type())) {
      Batch cast = batch;
      cast.input = batch.input.to(opts_.param_dtype);
      out = model_->forward(cast);
    } else {
      out = model_->forward(batch);
    }
    if (!c10::GradMode::is_enabled()) {
      for (size_t gi = 0; gi < groups_.size(); ++gi) release_group(static_cast<int>(gi));
      release_frozen_only();
    }
    return out;
  }

  /// Before each micro-batch's backward (Strategy::before_backward).
  void before_backward(bool sync) {
    std::lock_guard<std::mutex> g(mu_);
    // The previous micro-batch's backward is over: send what it left and fold the results into
    // the gradient shards before new gradients arrive.
    if (pass_ == Pass::Reducing) launch_ready_locked(/*flush=*/true);
    drain_locked();
    start_pass_locked(sync);
  }

  /// After the last micro-batch's backward: gradient shards complete and averaged.
  void finish_gradient_sync() {
    const auto t0 = Clock::now();
    std::lock_guard<std::mutex> g(mu_);
    if (pass_ == Pass::Reducing) launch_ready_locked(/*flush=*/true);
    drain_locked();
    pass_ = Pass::Closed;
    for (size_t gi = 0; gi < groups_.size(); ++gi) release_group(static_cast<int>(gi));
    release_frozen_only();
    metrics_.exposed_s += seconds_since(t0);
  }

  /// Global L2 norm of the gradients (collective over the shard group; replicas agree).
  double grad_norm() {
    std::vector<FlatParameter*> flats;
    for (auto& g : groups_) flats.push_back(g.flat.get());
    return global_grad_norm(flats, *shard_);
  }

  /// After the optimizer stepped the shards: groups that stay whole gather the new values.
  void after_optimizer_step() {
    const auto t0 = Clock::now();
    for (auto& g : groups_) g.flat->after_step_async();
    for (auto& g : groups_)
      if (g.flat->options().keep_full) {
        g.flat->gather();
        count_gather(g);
      }
    metrics_.exposed_s += seconds_since(t0);
  }

  /// Zeroes the gradient shards (pieces keep aliasing them) and drops whole gradients.
  void zero_grad() {
    for (auto& g : groups_) g.flat->zero_grad();
    if (!opts_.full_grads)
      for (auto& p : grads_) p.tensor.mutable_grad() = at::Tensor();
  }

  /// Every parameter (tied names included) with its full value, in the model's order, then the
  /// model's buffers. Collective over the shard group.
  std::vector<NamedTensor> full_state_dict() {
    std::map<const void*, at::Tensor> value;
    for (auto& g : groups_) {
      auto full = g.flat->gather_full_values();
      for (size_t k = 0; k < g.params.size(); ++k)
        value[grads_[g.params[k]].tensor.unsafeGetTensorImpl()] = full[k].tensor;
    }
    for (FrozenFlat* f : frozen_flats()) {
      auto full = f->gather_full_values();
      for (size_t k = 0; k < f->tensors().size(); ++k)
        value[f->tensors()[k].tensor.unsafeGetTensorImpl()] = full[k].tensor;
    }
    std::vector<NamedTensor> out;
    for (const auto& p : all_params_) {
      auto it = value.find(p.tensor.unsafeGetTensorImpl());
      out.push_back({p.name, it != value.end() ? it->second : p.tensor.detach()});
    }
    for (auto& b : model_->named_buffers()) out.push_back({b.name, b.tensor.detach()});
    return out;
  }

  /// This rank's pieces of every parameter (tied names listed under each name), then, on
  /// `owner_of_replicated` only, the frozen parameters and buffers whole. No communication:
  /// a piece aliases the shard (clone it to keep it past the next step).
  std::vector<ShardedTensor> sharded_state_dict(bool owner_of_replicated) const {
    // The checkpoint pieces this rank writes: each element of each tensor exactly once.
    std::vector<ShardedTensor> out;
    for (auto& c : checkpoint_pieces(owner_of_replicated))
      if (c.writer) out.push_back(std::move(c.piece));
    return out;
  }

  /// ABI 1.4 (checkpoints). Every piece of every parameter this rank holds (replicas
  /// included; the first replica is the writer): trainable ones from the flat parameters'
  /// shards, frozen ones sharded as bytes from their FrozenFlat's shard (in elements of their
  /// dtype), then the frozen parameters kept whole and buffers (written by
  /// `owner_of_replicated`, filled everywhere). Pieces alias the shards: a loader copies into
  /// them, then calls after_checkpoint_load().
  std::vector<CheckpointPiece> checkpoint_pieces(bool owner_of_replicated) const {
    std::map<const void*, std::pair<const FlatParameter*, size_t>> where;
    for (const auto& g : groups_)
      for (size_t k = 0; k < g.params.size(); ++k)
        where[grads_[g.params[k]].tensor.unsafeGetTensorImpl()] = {g.flat.get(), k};
    std::map<const void*, std::pair<const FrozenFlat*, size_t>> frozen_where;
    for (const FrozenFlat* f : frozen_flats())
      for (size_t k = 0; k < f->tensors().size(); ++k)
        frozen_where[f->tensors()[k].tensor.unsafeGetTensorImpl()] = {f, k};
    const int rank = shard_->rank();
    const bool first_replica = replicate_ == nullptr || replicate_->rank() == 0;
    std::vector<CheckpointPiece> out;
    for (const auto& p : all_params_) {
      auto it = where.find(p.tensor.unsafeGetTensorImpl());
      if (auto fz = frozen_where.find(p.tensor.unsafeGetTensorImpl()); fz != frozen_where.end()) {
        auto [first, data] = fz->second.first->local_piece(fz->second.second);
        if (data.numel() > 0)
          out.push_back({{p.name, p.tensor.sizes().vec(), first, data}, first_replica});
        continue;
      }
      if (it == where.end()) {
        out.push_back({{p.name, p.tensor.sizes().vec(), 0, p.tensor.detach().view({-1})},
                       owner_of_replicated});
        continue;
      }
      const FlatParameter& f = *it->second.first;
      const size_t k = it->second.second;
      for (const Piece& pc : f.layout().pieces(rank))
        if (pc.param == k)
          out.push_back({{p.name, f.layout().params()[k].shape, pc.param_offset,
                          f.shard().narrow(0, pc.shard_offset, pc.length)},
                         first_replica});
    }
    for (auto& b : model_->named_buffers())
      out.push_back(
          {{b.name, b.tensor.sizes().vec(), 0, b.tensor.detach().view({-1})}, owner_of_replicated});
    return out;
  }

  /// ABI 1.4 (checkpoints). optimizer_parameters() with the parameter each piece comes from:
  /// full shape and offset in its flattening (a piece's name is its parameter's).
  std::vector<CheckpointPiece> optimizer_parameter_pieces() const {
    const bool first_replica = replicate_ == nullptr || replicate_->rank() == 0;
    const int rank = shard_->rank();
    std::vector<CheckpointPiece> out;
    for (const auto& g : groups_) {
      const auto& pieces = g.flat->optimizer_pieces();
      const auto layout_pieces = g.flat->layout().pieces(rank);
      TR_CHECK(pieces.size() == layout_pieces.size(), opts_.name, ": ", pieces.size(),
               " optimizer pieces but ", layout_pieces.size(), " layout pieces");
      for (size_t i = 0; i < pieces.size(); ++i) {
        const Piece& pc = layout_pieces[i];
        out.push_back({{pieces[i].name, g.flat->layout().params()[pc.param].shape, pc.param_offset,
                        pieces[i].tensor.detach()},
                       first_replica});
      }
    }
    return out;
  }

  /// ABI 1.4 (checkpoints). After the shards were overwritten by a loader: groups that stay
  /// whole (ZeRO-1/2, persistent) gather the new values into their parameters, the others are
  /// released so the next use gathers. Collective over the shard group.
  void after_checkpoint_load() {
    for (auto& g : groups_) g.flat->after_step_async();
    for (auto& g : groups_) {
      if (g.flat->options().keep_full)
        g.flat->gather();
      else
        g.flat->release();
    }
    for (FrozenFlat* f : frozen_flats()) f->release();  // the next use gathers the loaded bytes
  }

  /// The flat parameters, in reduce order (for sharded state dicts and estimates).
  std::vector<const FlatParameter*> flat_parameters() const {
    std::vector<const FlatParameter*> out;
    for (const auto& g : groups_) out.push_back(g.flat.get());
    return out;
  }
  /// Which groups are units, root, persistent or buckets, one line each (for banners/tests).
  std::vector<std::string> describe_groups() const {
    std::vector<std::string> out;
    for (const auto& g : groups_)
      out.push_back(detail::cat(
          g.flat->options().name, ": ", g.params.size(), " parameters, ", g.flat->layout().numel(),
          " elements, shard ", g.flat->layout().shard_numel(),
          g.frozen
              ? detail::cat("; ", g.frozen->spans().size(), " frozen, ", g.frozen->padded_bytes(),
                            " bytes, shard ", g.frozen->shard_bytes())
              : std::string()));
    for (const auto& f : unit_frozen_)
      if (f)
        out.push_back(detail::cat(f->name(), ": ", f->spans().size(), " frozen, ",
                                  f->padded_bytes(), " bytes, shard ", f->shard_bytes()));
    return out;
  }

  /// Every group and frozen flat parameter gathered (collective over the shard group, in a
  /// fixed order), until release_all(): the model's tensors hold their whole values, for code
  /// that reads them outside a unit's forward (generation with a KV cache).
  void gather_all() {
    for (size_t gi = 0; gi < groups_.size(); ++gi) gather_group(static_cast<int>(gi));
    for (size_t u = 0; u < unit_frozen_.size(); ++u) gather_frozen_only(static_cast<int>(u));
  }
  /// Back to the shards after gather_all() (groups kept whole by their options stay whole).
  void release_all() {
    for (size_t gi = 0; gi < groups_.size(); ++gi) release_group(static_cast<int>(gi));
    release_frozen_only();
  }

  /// Figures since the previous call (then reset).
  RuntimeMetrics take_metrics() {
    RuntimeMetrics m = metrics_;
    m.flat_bytes = 0;
    for (const auto& g : groups_) m.flat_bytes += static_cast<double>(g.flat->resident_bytes());
    for (const FrozenFlat* f : frozen_flats())
      m.frozen_bytes += static_cast<double>(f->resident_bytes());
    metrics_ = RuntimeMetrics{};
    return m;
  }

  // -- UnitHooks / UnitOutputHooks ---------------------------------------------------------

  void pre_forward(Unit& unit) override {
    const int u = unit_index_.at(&unit);
    const int gi = unit_group_[static_cast<size_t>(u)];
    if (gi >= 0) gather_group(gi);
    gather_frozen_only(u);
    prefetch_forward(u);
  }
  void post_forward(Unit& unit) override {
    const int u = unit_index_.at(&unit);
    if (!unit_frozen_.empty() && unit_frozen_[static_cast<size_t>(u)] &&
        (opts_.reshard_after_forward || !c10::GradMode::is_enabled()))
      unit_frozen_[static_cast<size_t>(u)]->release();
    const int gi = unit_group_[static_cast<size_t>(u)];
    if (gi < 0) return;
    // A merged group is released after the forward of its last unit.
    if (groups_[static_cast<size_t>(gi)].last_unit != unit_index_.at(&unit)) return;
    if (opts_.reshard_after_forward || !c10::GradMode::is_enabled()) release_group(gi);
  }
  void on_output(Unit& unit, at::Tensor& output) override {
    if (!c10::GradMode::is_enabled() || !output.requires_grad()) return;
    const int u = unit_index_.at(&unit);
    // Runs once the gradient of the unit's output is complete, just before autograd runs the
    // unit's own backward nodes, which read its parameters.
    output.register_hook([this, u](const at::Tensor&) {
      const int gi = unit_group_[static_cast<size_t>(u)];
      release_frozen_behind(u);
      if (gi >= 0) gather_group(gi);
      gather_frozen_only(u);
      if (!opts_.backward_prefetch_post) prefetch_backward(u);
    });
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  struct Group {
    std::unique_ptr<FlatParameter> flat;
    std::unique_ptr<FrozenFlat> frozen;   // the group's units' frozen parameters (may be null)
    std::vector<size_t> params;           // indices into grads_
    size_t pending = 0;                   // parameters whose gradient has not arrived in this pass
    int first_unit = -1, last_unit = -1;  // Units grouping: the units it holds (merged: a range)
    bool root = false;
  };

  bool uses_unit_hooks() const {
    return opts_.grouping == RuntimeOptions::Grouping::Units && !opts_.keep_full;
  }

  void build_groups() {
    const size_t n = grads_.size();
    std::map<const void*, size_t> index;
    for (size_t i = 0; i < n; ++i) index[grads_[i].tensor.unsafeGetTensorImpl()] = i;
    std::vector<int64_t> numels(n);
    for (size_t i = 0; i < n; ++i) numels[i] = grads_[i].tensor.numel();
    // Which unit uses each parameter: one -> that unit, none -> -1, several (a tied weight) -> -2.
    std::vector<int> owner(n, -1);
    std::vector<std::string> unit_names;
    if (opts_.grouping == RuntimeOptions::Grouping::Units) {
      units_ = model_->units();
      for (size_t u = 0; u < units_.size(); ++u) {
        unit_index_[units_[u]] = static_cast<int>(u);
        unit_names.push_back(units_[u]->name());
        for (const auto& t : units_[u]->module().parameters(/*recurse=*/true)) {
          auto it = index.find(t.unsafeGetTensorImpl());
          if (it == index.end()) continue;
          int& o = owner[it->second];
          o = o == -1 ? static_cast<int>(u) : -2;
        }
      }
    }
    std::vector<GroupSpec> specs = plan_groups(numels, owner, unit_names, opts_);

    unit_group_.assign(units_.size(), -1);
    for (size_t gi = 0; gi < specs.size(); ++gi) {
      GroupSpec& s = specs[gi];
      Group g;
      g.params = s.params;
      g.first_unit = s.first_unit;
      g.last_unit = s.last_unit;
      g.root = s.root;
      std::vector<NamedTensor> ps;
      for (size_t i : g.params) ps.push_back(grads_[i]);
      FlatParameter::Options fo;
      fo.name = opts_.name + " " + s.label;
      fo.keep_full = s.keep;
      fo.full_grads = opts_.full_grads;
      fo.param_dtype = opts_.param_dtype;
      fo.reduce_dtype = opts_.reduce_dtype;
      fo.fill = filler();
      g.flat = std::make_unique<FlatParameter>(std::move(ps), *shard_, fo);
      for (int u = g.first_unit; u >= 0 && u <= g.last_unit; ++u)
        unit_group_[static_cast<size_t>(u)] = static_cast<int>(gi);
      if (g.root) root_group_ = static_cast<int>(gi);
      groups_.push_back(std::move(g));
    }
    group_of_.assign(n, 0);
    for (size_t gi = 0; gi < groups_.size(); ++gi)
      for (size_t i : groups_[gi].params) group_of_[i] = gi;
  }

  void install_hooks() {
    hooks_.install(grads_, opts_.name, [this](size_t i) { on_grad_ready(i); });
  }

  // -- gathering -----------------------------------------------------------------------------

  void count_gather(const Group& g) {
    metrics_.gathers += 1;
    const int W = shard_->world_size();
    metrics_.comm_bytes += static_cast<double>(g.flat->layout().padded_numel()) *
                           static_cast<double>(g.flat->param_element_bytes()) * (W - 1) / W;
  }
  double unit_full_bytes() const {
    double b = 0;
    for (const auto& g : groups_)
      if (!g.root && !g.flat->options().keep_full && g.flat->materialized())
        b += static_cast<double>(g.flat->layout().padded_numel()) *
             static_cast<double>(g.flat->param_element_bytes());
    return b;
  }
  int gathered_units() const {
    int k = 0;
    for (const auto& g : groups_)
      if (!g.root && !g.flat->options().keep_full && g.flat->materialized()) ++k;
    return k;
  }
  void gather_group(int gi) {
    Group& g = groups_[static_cast<size_t>(gi)];
    if (g.frozen && !g.frozen->gathered()) {
      if (!g.frozen->materialized()) count_frozen_gather(*g.frozen);
      g.frozen->gather();
    }
    if (g.flat->gathered()) return;
    if (!g.flat->materialized()) count_gather(g);
    g.flat->gather();
    metrics_.max_unit_full_bytes = std::max(metrics_.max_unit_full_bytes, unit_full_bytes());
  }
  void release_group(int gi, bool with_frozen = true) {
    Group& g = groups_[static_cast<size_t>(gi)];
    if (!g.flat->options().keep_full) g.flat->release();
    if (g.frozen && with_frozen) g.frozen->release();
  }
  // Units run in sequence, so when unit u's backward starts (its output's gradient is complete)
  // the backward of the unit that started before it is over: that unit's frozen parameters can
  // go. Called from u's output hook, before u gathers its own.
  void release_frozen_behind(int u) {
    const int gi = unit_group_[static_cast<size_t>(u)];
    if (backward_unit_ >= 0 && backward_unit_ != u) {
      const int prev_gi = unit_group_[static_cast<size_t>(backward_unit_)];
      if (prev_gi >= 0 && prev_gi != gi && groups_[static_cast<size_t>(prev_gi)].frozen)
        groups_[static_cast<size_t>(prev_gi)].frozen->release();
      if (!unit_frozen_.empty() && unit_frozen_[static_cast<size_t>(backward_unit_)])
        unit_frozen_[static_cast<size_t>(backward_unit_)]->release();
    }
    backward_unit_ = u;
  }
  void count_frozen_gather(const FrozenFlat& f) {
    const int W = shard_->world_size();
    metrics_.comm_bytes += static_cast<double>(f.padded_bytes()) * (W - 1) / W;
  }
  void gather_frozen_only(int u) {
    if (unit_frozen_.empty() || !unit_frozen_[static_cast<size_t>(u)]) return;
    FrozenFlat& f = *unit_frozen_[static_cast<size_t>(u)];
    if (f.gathered()) return;
    if (!f.materialized()) count_frozen_gather(f);
    f.gather();
  }
  void release_frozen_only() {
    for (auto& f : unit_frozen_)
      if (f) f->release();
    backward_unit_ = -1;
  }
  // Every frozen flat (group ones, then frozen-only units).
  std::vector<FrozenFlat*> frozen_flats() const {
    std::vector<FrozenFlat*> out;
    for (const auto& g : groups_)
      if (g.frozen) out.push_back(g.frozen.get());
    for (const auto& f : unit_frozen_)
      if (f) out.push_back(f.get());
    return out;
  }

  // Deferred loading: how flat parameters read their pieces (empty without a deferred model).
  // A parameter the model added after construction (a LoRA adapter) has its values already.
  std::function<void(const NamedTensor&, int64_t, const at::Tensor&)> filler() {
    if (deferred_ == nullptr) return {};
    DeferredWeights* d = deferred_;
    return [d](const NamedTensor& p, int64_t offset, const at::Tensor& out) {
      if (d->weight_deferred(p.name))
        d->read_weight_range(p.name, offset, out);
      else
        out.copy_(p.tensor.detach().reshape({-1}).narrow(0, offset, out.numel()));
    };
  }
  // Deferred loading, after the flat parameters read their shards: what stays whole on every
  // rank (frozen parameters outside units or tied, all frozen ones under Buckets grouping) is
  // read whole, then the model is told its weights are in.
  void fill_the_rest() {
    c10::NoGradGuard no_grad;
    std::set<const void*> done;
    for (const auto& p : grads_) done.insert(p.tensor.unsafeGetTensorImpl());
    for (FrozenFlat* f : frozen_flats())
      for (const auto& t : f->tensors()) done.insert(t.tensor.unsafeGetTensorImpl());
    for (const auto& p : all_params_) {
      if (p.tensor.numel() == 0 || !done.insert(p.tensor.unsafeGetTensorImpl()).second ||
          !deferred_->weight_deferred(p.name))
        continue;
      refill_storage(p.tensor);
      deferred_->read_weight_range(p.name, 0, p.tensor.detach().view({-1}));
    }
    deferred_->deferred_weights_loaded();
  }

  // Frozen parameters used by exactly one unit go with that unit's group, or, when the unit has
  // no trainable parameter, into a frozen flat of its own; tied or unit-less ones stay whole.
  void build_frozen() {
    std::set<const void*> trainable, seen;
    for (const auto& p : grads_) trainable.insert(p.tensor.unsafeGetTensorImpl());
    std::map<const void*, NamedTensor> frozen;
    for (const auto& p : all_params_) {
      const void* impl = p.tensor.unsafeGetTensorImpl();
      if (p.tensor.requires_grad() || trainable.count(impl) || !seen.insert(impl).second) continue;
      if (p.tensor.numel() > 0) frozen.emplace(impl, p);
    }
    if (frozen.empty()) return;
    const std::map<const void*, int> owner = unit_of_each_parameter(units_);
    std::map<int, std::vector<NamedTensor>> per_group, per_unit;
    for (const auto& p : all_params_) {  // model order, each tensor once
      if (!frozen.count(p.tensor.unsafeGetTensorImpl())) continue;
      auto it = owner.find(p.tensor.unsafeGetTensorImpl());
      if (it == owner.end() || it->second < 0) continue;
      const int u = it->second;
      const int gi = unit_group_[static_cast<size_t>(u)];
      auto& list = gi >= 0 ? per_group[gi] : per_unit[u];
      bool dup = false;
      for (const auto& q : list)
        dup = dup || q.tensor.unsafeGetTensorImpl() == p.tensor.unsafeGetTensorImpl();
      if (!dup) list.push_back(p);
    }
    for (auto& [gi, tensors] : per_group) {
      Group& g = groups_[static_cast<size_t>(gi)];
      g.frozen = std::make_unique<FrozenFlat>(tensors, *shard_,
                                              g.flat->options().name + " (frozen)", filler());
    }
    if (!per_unit.empty()) {
      unit_frozen_.resize(units_.size());
      for (auto& [u, tensors] : per_unit) {
        unit_frozen_[static_cast<size_t>(u)] = std::make_unique<FrozenFlat>(
            tensors, *shard_,
            opts_.name + " unit " + units_[static_cast<size_t>(u)]->name() + " (frozen)", filler());
      }
    }
  }
  // Starts the gather of group gi ahead of use, unless limit_all_gathers is reached.
  bool prefetch_group(int gi, int64_t& budget) {
    Group& g = groups_[static_cast<size_t>(gi)];
    if (g.flat->materialized()) return true;
    if (opts_.limit_all_gathers && gathered_units() >= 2) return false;
    budget -= g.flat->layout().padded_numel();
    count_gather(g);
    g.flat->gather_async();
    if (g.frozen && !g.frozen->materialized()) {
      count_frozen_gather(*g.frozen);
      g.frozen->gather_async();
    }
    metrics_.max_unit_full_bytes = std::max(metrics_.max_unit_full_bytes, unit_full_bytes());
    return true;
  }
  void prefetch_forward(int unit) {
    int64_t budget = opts_.forward_prefetch_elements;
    int last = unit < 0 ? -1 : unit_group_[static_cast<size_t>(unit)];
    for (size_t k = static_cast<size_t>(unit + 1); k < units_.size() && budget > 0; ++k) {
      const int gi = unit_group_[k];
      if (gi < 0 || gi == last) continue;
      last = gi;
      if (!prefetch_group(gi, budget)) break;
    }
  }
  void prefetch_backward(int unit) {
    int64_t budget = opts_.backward_prefetch_elements;
    int last = unit_group_[static_cast<size_t>(unit)];
    for (int k = unit - 1; k >= 0 && budget > 0; --k) {
      const int gi = unit_group_[static_cast<size_t>(k)];
      if (gi < 0 || gi == last) continue;
      last = gi;
      if (!prefetch_group(gi, budget)) break;
    }
  }

  // -- gradients -----------------------------------------------------------------------------

  void start_pass_locked(bool sync) {
    for (auto& g : groups_) g.pending = g.params.size();
    next_launch_ = 0;
    pass_ = opts_.full_grads && !sync ? Pass::Accumulating : Pass::Reducing;
  }

  void on_grad_ready(size_t i) {
    std::lock_guard<std::mutex> g(mu_);
    if (pass_ == Pass::Accumulating) return;  // autograd sums into the full gradients
    Group& grp = groups_[group_of_[i]];
    if (grp.pending > 0) --grp.pending;
    if (opts_.overlap) launch_ready_locked(/*flush=*/false);
  }

  void launch_ready_locked(bool flush) {
    // Strictly in group order: every rank issues the same collectives in the same order,
    // whatever order its hooks fire in.
    while (next_launch_ < groups_.size() && (flush || groups_[next_launch_].pending == 0)) {
      Group& g = groups_[next_launch_];
      g.flat->reduce_async();
      const int W = shard_->world_size();
      metrics_.comm_bytes += static_cast<double>(g.flat->layout().padded_numel()) *
                             static_cast<double>(g.flat->reduce_element_bytes()) * (W - 1) / W;
      in_flight_.push_back(next_launch_);
      // The unit's backward is over (all its gradients are in), so its whole parameters can
      // go; the root group stays until the step's gradients are complete. Its frozen
      // parameters may still be needed (the input gradient of a frozen layer is computed after
      // every trainable gradient of the unit is in): they go when the next unit's backward
      // starts (release_frozen_behind).
      if (!g.root) release_group(static_cast<int>(next_launch_), /*with_frozen=*/false);
      if (opts_.backward_prefetch_post && g.first_unit >= 0) prefetch_backward(g.first_unit);
      ++next_launch_;
      // Bound the reduce buffers in flight: fold the oldest in.
      while (in_flight_.size() > 2) {
        finish_one(in_flight_.front());
        in_flight_.erase(in_flight_.begin());
      }
    }
  }

  void finish_one(size_t gi) {
    FlatParameter& f = *groups_[gi].flat;
    const bool replicated = replicate_ != nullptr && replicate_->world_size() > 1;
    // HYBRID_SHARD / NO_SHARD: averaged within the shard group, then across the groups that
    // hold the same shard (an all-reduce of 1/shard_size of the data).
    f.finish_reduce(replicated ? replicate_ : nullptr);
    if (replicated) {
      const int R = replicate_->world_size();
      metrics_.comm_bytes += static_cast<double>(f.layout().shard_numel()) *
                             static_cast<double>(f.reduce_element_bytes()) * 2 * (R - 1) / R;
    }
  }

  void drain_locked() {
    for (size_t gi : in_flight_) finish_one(gi);
    in_flight_.clear();
  }

  RuntimeOptions opts_;
  Model* model_;
  DeferredWeights* deferred_ = nullptr;  // set while the constructor fills a deferred model
  Communicator* shard_;
  Communicator* replicate_;
  std::vector<NamedTensor> all_params_;  // as the model lists them
  std::vector<NamedTensor> grads_;       // trainable, de-duplicated (tied weights once)
  std::vector<size_t> group_of_;         // grads_ index -> group index
  std::vector<Group> groups_;            // in reduce order
  std::vector<int> unit_group_;          // unit index -> group index (-1: no parameters)
  std::vector<Unit*> units_;
  std::map<const Unit*, int> unit_index_;
  std::vector<std::unique_ptr<FrozenFlat>> unit_frozen_;  // unit -> frozen-only flat (or null)
  int backward_unit_ = -1;  // the unit whose backward started last in this pass (-1: none)
  int root_group_ = -1;
  GradientHooks hooks_;

  // Where the micro-batches' backward passes are (guarded by mu_). A gradient that arrives
  // while Closed (a backward without before_backward) is reduced, as in a synchronising pass.
  enum class Pass {
    Closed,        ///< no backward open: constructed, or the step's gradients are complete
    Reducing,      ///< gradients are reduced into the shards as they arrive
    Accumulating,  ///< full_grads (ZeRO-1) without sync: autograd sums into the full gradients
  };
  std::mutex mu_;
  Pass pass_ = Pass::Closed;
  size_t next_launch_ = 0;
  std::vector<size_t> in_flight_;  // groups with a reduce started, in launch order
  RuntimeMetrics metrics_;
};

}  // namespace trainrun::v1::sharding
