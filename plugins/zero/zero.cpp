#include "zero.hpp"

#include <trainrun/plugin.hpp>
#include <trainrun/replicas.hpp>
#include <trainrun/strategy_helpers.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <set>
#include <iostream>
#include <sstream>

namespace trainrun::plugins {

namespace {
constexpr const char* kName = "strategy 'zero'";
}

void ZeroStrategy::declare_options(OptionSchema& s) {
  s.integer_or_auto("stage", kAuto,
                    "1: optimizer state sharded; 2: plus gradients; 3: plus parameters; "
                    "\"auto\": the lowest stage whose memory estimate fits memory_budget_gb",
                    1.0, 3.0);
  s.integer("reduce_bucket_size", 500000000,
            "elements per gradient reduce-scatter bucket at stages 1 and 2 (DeepSpeed's default)",
            1.0);
  s.integer("prefetch_bucket_size", 50000000,
            "stage 3: elements of the next units' parameters gathered ahead of use, in forward "
            "and backward order; 0 = no prefetch",
            0.0);
  s.integer("param_persistence_threshold", 100000,
            "stage 3: parameters with fewer elements stay whole (not re-gathered for every use)",
            0.0);
  s.boolean("overlap_comm", true,
            "start each bucket's reduce-scatter during backward as soon as its gradients are in");
  s.real("memory_budget_gb", 0.0,
         "per-rank memory budget for stage = \"auto\" (GB, 1e9 bytes); 0 = the accelerator's "
         "memory divided among the ranks of the node",
         0.0);
}

ZeroStrategy::ZeroStrategy(const Options& o, const RunContext& ctx)
    : requested_stage_(o.get_int("stage")),
      reduce_bucket_elements_(o.get_int("reduce_bucket_size")),
      prefetch_elements_(o.get_int("prefetch_bucket_size")),
      persistence_threshold_(o.get_int("param_persistence_threshold")),
      overlap_(o.get_bool("overlap_comm")),
      memory_budget_gb_(o.get_double("memory_budget_gb")),
      rank_(ctx.rank),
      world_size_(ctx.world_size) {
  memory_inputs_.local_world_size = ctx.local_world_size;
  memory_inputs_.nnodes = std::max(1, ctx.world_size / std::max(1, ctx.local_world_size));
}

ZeroStrategy::~ZeroStrategy() {
  for (size_t i = 0; i < accumulators_.size() && i < hook_keys_.size(); ++i)
    accumulators_[i]->del_post_hook(hook_keys_[i]);
  for (Unit* u : units_) u->set_hooks(nullptr);
}

void ZeroStrategy::set_memory_inputs(const MemoryInputs& inputs) { memory_inputs_ = inputs; }

void ZeroStrategy::check_setup(const char* what) const {
  TR_CHECK(model_ != nullptr, kName, ": ", what, "() called before setup()");
}

// ---------------------------------------------------------------------------------------------
// Setup

void ZeroStrategy::setup(Model& model, Accelerator& accelerator, const TrainPlan&) {
  TR_CHECK(model_ == nullptr, kName, ": setup() called twice");
  model_ = &model;
  device_ = accelerator.device();
  comm_ = &accelerator.communicator();
  TR_CHECK(comm_->world_size() == world_size_ && comm_->rank() == rank_, kName,
           ": the accelerator's communicator is rank ", comm_->rank(), " of ",
           comm_->world_size(), ", but this process is rank ", rank_, " of ", world_size_);
  if (!device_.is_cpu()) {
    torch::nn::Module* m = model.module();
    TR_CHECK(m != nullptr, kName, ": the model is not a torch::nn::Module, so it cannot be "
             "moved to ", device_);
    m->to(device_);
  }
  all_params_ = model.named_parameters();
  std::vector<NamedTensor> buffers = model.named_buffers();
  // As ddp: the same model on every rank, then rank 0's values everywhere, before sharding.
  replicate_from_rank0(*comm_, device_, kName, all_params_, buffers);

  std::set<const void*> seen;
  for (const auto& p : all_params_) {
    const void* impl = p.tensor.unsafeGetTensorImpl();
    if (!seen.insert(impl).second) continue;  // tied weight: owned once, under its first name
    if (p.tensor.requires_grad())
      grads_.push_back(p);
    else
      frozen_.push_back(p);
  }
  TR_CHECK(!grads_.empty(), kName, ": the model has no parameter with requires_grad (",
           all_params_.size(), " parameters, all frozen)");
  for (const auto& p : grads_)
    TR_CHECK(p.tensor.scalar_type() == at::kFloat, kName, ": parameter '", p.name, "' is ",
             p.tensor.scalar_type(), "; zero shards float32 parameters (use a mixed precision "
             "that keeps float32 weights)");

  if (requested_stage_ == kAuto) {
    // Model-state bytes per rank as in the paper (section 3.1): params P, grads G, optimizer K
    // (state + master copies), each divided by N where the stage shards it.
    int64_t psi = 0;
    for (const auto& p : grads_) psi += p.tensor.numel();
    const double N = world_size_;
    const double P = memory_inputs_.param_bytes, G = memory_inputs_.grad_bytes;
    const double K = std::max(0.0, memory_inputs_.optimizer_bytes) + memory_inputs_.master_bytes;
    const double est[4] = {(P + G + K) * psi, (P + G + K / N) * psi, (P + (G + K) / N) * psi,
                           (P + G + K) / N * psi};
    double budget = memory_budget_gb_ > 0 ? memory_budget_gb_ * 1e9
                                          : static_cast<double>(memory_inputs_.memory_budget_bytes);
    TR_CHECK_TYPED(ConfigError, budget > 0, kName, ": stage = \"auto\" needs a memory budget: "
                   "set [strategy] memory_budget_gb (the accelerator reports no capacity)");
    stage_ = 0;
    for (int s = 1; s <= 3 && stage_ == 0; ++s)
      if (est[s] <= budget) stage_ = s;
    if (stage_ == 0) {
      // Stage 3 scales as 1/N: the smallest world size whose stage-3 estimate fits.
      const int64_t need = static_cast<int64_t>(std::ceil((P + G + K) * psi / budget));
      TR_CHECK_TYPED(ConfigError, false, kName, ": no stage fits the memory budget of ",
                     budget / 1e9, " GB per rank: stage 3 needs ", est[3] / 1e9,
                     " GB per rank at world size ", world_size_, "; a world size of at least ",
                     need, " would fit");
    }
    std::ostringstream r;
    r << std::setprecision(3) << "stage " << stage_ << " chosen: model state " << est[stage_] / 1e9
      << " GB per rank fits the budget of " << budget / 1e9 << " GB";
    if (stage_ > 1) r << " (stage " << stage_ - 1 << " needs " << est[stage_ - 1] / 1e9 << " GB)";
    stage_reason_ = r.str();
  } else {
    stage_ = static_cast<int>(requested_stage_);
    stage_reason_ = "stage " + std::to_string(stage_) + " as configured";
  }
  if (rank_ == 0) std::cout << "  zero        " << stage_reason_ << std::endl;

  build_groups(model);
  install_hooks();
  if (stage_ == 3)
    for (Unit* u : units_) u->set_hooks(this);
  std::lock_guard<std::mutex> g(mu_);
  start_pass_locked();
  pass_open_ = false;
}

void ZeroStrategy::build_groups(Model& model) {
  const size_t n = grads_.size();
  std::map<const void*, size_t> index;
  for (size_t i = 0; i < n; ++i) index[grads_[i].tensor.unsafeGetTensorImpl()] = i;
  std::vector<int64_t> numels(n);
  for (size_t i = 0; i < n; ++i) numels[i] = grads_[i].tensor.numel();

  // Groups in the order their gradients are expected to be complete in backward (the reverse
  // of registration and of the units' forward order); this is the order they are reduced in.
  std::vector<std::vector<size_t>> members;
  std::vector<int> member_unit;
  std::vector<bool> member_root, member_keep;
  if (stage_ < 3) {
    std::vector<size_t> order(n);
    std::iota(order.rbegin(), order.rend(), size_t{0});
    for (auto& b : sharding::bucket_by_elements(numels, order, reduce_bucket_elements_)) {
      members.push_back(std::move(b));
      member_unit.push_back(-1);
      member_root.push_back(false);
      member_keep.push_back(true);
    }
  } else {
    units_ = model.units();
    for (size_t u = 0; u < units_.size(); ++u) unit_index_[units_[u]] = static_cast<int>(u);
    // Which units use each parameter: one unit -> that unit's group; none, or shared between
    // units (a tied weight) -> root, which stays gathered for the whole forward and backward.
    std::vector<int> owner(n, -1);
    for (size_t u = 0; u < units_.size(); ++u)
      for (const auto& t : units_[u]->module().parameters(/*recurse=*/true)) {
        auto it = index.find(t.unsafeGetTensorImpl());
        if (it == index.end()) continue;
        int& o = owner[it->second];
        o = o == -1 ? static_cast<int>(u) : -2;
      }
    std::vector<std::vector<size_t>> per_unit(units_.size());
    std::vector<size_t> root, persistent;
    for (size_t i = 0; i < n; ++i) {
      if (numels[i] < persistence_threshold_)
        persistent.push_back(i);
      else if (owner[i] >= 0)
        per_unit[static_cast<size_t>(owner[i])].push_back(i);
      else
        root.push_back(i);
    }
    for (size_t k = units_.size(); k-- > 0;) {
      if (per_unit[k].empty()) continue;
      members.push_back(per_unit[k]);
      member_unit.push_back(static_cast<int>(k));
      member_root.push_back(false);
      member_keep.push_back(false);
    }
    if (!root.empty()) {
      members.push_back(root);
      member_unit.push_back(-1);
      member_root.push_back(true);
      member_keep.push_back(false);
    }
    if (!persistent.empty()) {
      members.push_back(persistent);
      member_unit.push_back(-1);
      member_root.push_back(false);
      member_keep.push_back(true);
    }
  }

  group_of_.assign(n, 0);
  unit_group_.assign(units_.size(), -1);
  groups_.clear();
  for (size_t gi = 0; gi < members.size(); ++gi) {
    Group g;
    g.params = members[gi];
    g.unit = member_unit[gi];
    g.root = member_root[gi];
    std::vector<NamedTensor> ps;
    for (size_t i : g.params) {
      ps.push_back(grads_[i]);
      group_of_[i] = gi;
    }
    sharding::FlatParameter::Options fo;
    fo.name = detail::cat(kName, " ",
                          g.unit >= 0 ? "unit " + units_[static_cast<size_t>(g.unit)]->name()
                          : g.root   ? std::string("root group")
                          : stage_ == 3 ? std::string("persistent group")
                                        : "bucket " + std::to_string(gi));
    fo.keep_full = member_keep[gi];
    fo.full_grads = stage_ == 1;
    g.flat = std::make_unique<sharding::FlatParameter>(std::move(ps), *comm_, fo);
    if (g.unit >= 0) unit_group_[static_cast<size_t>(g.unit)] = static_cast<int>(gi);
    if (g.root) root_group_ = static_cast<int>(gi);
    groups_.push_back(std::move(g));
  }
}

void ZeroStrategy::install_hooks() {
  for (size_t i = 0; i < grads_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(grads_[i].tensor);
    TR_CHECK(acc != nullptr, kName, ": parameter '", grads_[i].name,
             "' has no gradient accumulator");
    // A post-hook runs once autograd has added this backward's gradient to .grad.
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list&) {
          on_grad_ready(i);
          return outputs;
        })));
    accumulators_.push_back(std::move(acc));
  }
}

std::vector<NamedTensor> ZeroStrategy::optimizer_parameters() {
  check_setup("optimizer_parameters");
  std::vector<NamedTensor> out;
  for (const auto& g : groups_)
    for (const auto& p : g.flat->optimizer_pieces()) out.push_back(p);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Forward and stage-3 gathering

ModelOutput ZeroStrategy::forward(const Batch& batch) {
  check_setup("forward");
  if (stage_ == 3) {
    if (root_group_ >= 0 && !groups_[static_cast<size_t>(root_group_)].flat->gathered()) {
      groups_[static_cast<size_t>(root_group_)].flat->gather();
      ++gathers_;
    }
    prefetch_forward(-1);
  }
  ModelOutput out = model_->forward(batch_to_device(batch, device_));
  if (stage_ == 3 && !c10::GradMode::is_enabled()) {
    // Evaluation: no backward will need anything; keep only the shards.
    for (auto& g : groups_) g.flat->release();
  }
  return out;
}

void ZeroStrategy::prefetch_forward(int unit) {
  int64_t budget = prefetch_elements_;
  for (size_t k = static_cast<size_t>(unit + 1); k < units_.size() && budget > 0; ++k) {
    const int gi = unit_group_[k];
    if (gi < 0) continue;
    auto& f = *groups_[static_cast<size_t>(gi)].flat;
    budget -= f.layout().padded_numel();
    if (!f.materialized()) {
      f.gather_async();
      ++gathers_;
    }
  }
}

void ZeroStrategy::prefetch_backward(int unit) {
  int64_t budget = prefetch_elements_;
  for (int k = unit - 1; k >= 0 && budget > 0; --k) {
    const int gi = unit_group_[static_cast<size_t>(k)];
    if (gi < 0) continue;
    auto& f = *groups_[static_cast<size_t>(gi)].flat;
    budget -= f.layout().padded_numel();
    if (!f.materialized()) {
      f.gather_async();
      ++gathers_;
    }
  }
}

void ZeroStrategy::pre_forward(Unit& unit) {
  const int u = unit_index_.at(&unit);
  const int gi = unit_group_[static_cast<size_t>(u)];
  if (gi >= 0) {
    auto& f = *groups_[static_cast<size_t>(gi)].flat;
    if (!f.materialized()) ++gathers_;
    f.gather();
  }
  prefetch_forward(u);
}

void ZeroStrategy::post_forward(Unit& unit) {
  const int gi = unit_group_[static_cast<size_t>(unit_index_.at(&unit))];
  if (gi >= 0) groups_[static_cast<size_t>(gi)].flat->release();
}

void ZeroStrategy::on_output(Unit& unit, at::Tensor& output) {
  if (!c10::GradMode::is_enabled() || !output.requires_grad()) return;
  const int u = unit_index_.at(&unit);
  // Runs when the gradient of the unit's output is complete, just before autograd runs the
  // unit's own backward nodes, which read its (released) parameters.
  output.register_hook([this, u](const at::Tensor&) {
    const int gi = unit_group_[static_cast<size_t>(u)];
    if (gi >= 0) {
      auto& f = *groups_[static_cast<size_t>(gi)].flat;
      if (!f.materialized()) ++gathers_;
      f.gather();
    }
    prefetch_backward(u);
  });
}

// ---------------------------------------------------------------------------------------------
// Gradients

void ZeroStrategy::start_pass_locked() {
  for (auto& g : groups_) g.pending = g.params.size();
  next_launch_ = 0;
  pass_open_ = true;
}

void ZeroStrategy::before_backward(bool sync) {
  check_setup("before_backward");
  std::lock_guard<std::mutex> g(mu_);
  // The previous micro-batch's backward is over: send what it left (stages 2 and 3 reduce every
  // micro-batch) and fold the results into the gradient shards before new gradients arrive.
  if (pass_open_ && (stage_ != 1 || sync_)) launch_ready_locked(/*flush=*/true);
  drain_locked();
  sync_ = sync;
  start_pass_locked();
}

void ZeroStrategy::on_grad_ready(size_t i) {
  std::lock_guard<std::mutex> g(mu_);
  if (stage_ == 1 && !sync_) return;  // accumulation: autograd sums into the full buffer
  Group& grp = groups_[group_of_[i]];
  if (grp.pending > 0) --grp.pending;
  if (overlap_) launch_ready_locked(/*flush=*/false);
}

void ZeroStrategy::launch_ready_locked(bool flush) {
  // Strictly in group order: every rank issues the same reduce-scatters in the same order,
  // whatever order its hooks fire in.
  while (next_launch_ < groups_.size() && (flush || groups_[next_launch_].pending == 0)) {
    Group& g = groups_[next_launch_];
    g.flat->reduce_async();
    comm_bytes_ += static_cast<double>(g.flat->layout().padded_numel()) * 4.0 *
                   (world_size_ - 1) / std::max(1, world_size_);
    in_flight_.push_back(next_launch_);
    // Stage 3: the unit's backward is over (all its gradients are in), so its whole
    // parameters can go. The root group stays until the step's gradients are complete.
    if (stage_ == 3 && !g.root) g.flat->release();
    ++next_launch_;
    // Bound the memory of reduce buffers in flight: fold completed ones in now.
    while (in_flight_.size() > 2) {
      groups_[in_flight_.front()].flat->finish_reduce();
      in_flight_.erase(in_flight_.begin());
    }
  }
}

void ZeroStrategy::drain_locked() {
  for (size_t gi : in_flight_) groups_[gi].flat->finish_reduce();
  in_flight_.clear();
}

void ZeroStrategy::finish_gradient_sync() {
  check_setup("finish_gradient_sync");
  const auto t0 = Clock::now();
  std::lock_guard<std::mutex> g(mu_);
  if (pass_open_ && (stage_ != 1 || sync_)) launch_ready_locked(/*flush=*/true);
  drain_locked();
  pass_open_ = false;
  if (stage_ == 3)
    for (auto& grp : groups_) grp.flat->release();
  exposed_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

double ZeroStrategy::grad_norm() {
  check_setup("grad_norm");
  std::vector<sharding::FlatParameter*> flats;
  for (auto& g : groups_) flats.push_back(g.flat.get());
  return sharding::global_grad_norm(flats, *comm_);
}

void ZeroStrategy::after_optimizer_step() {
  check_setup("after_optimizer_step");
  const auto t0 = Clock::now();
  // Stages 1/2 (and stage 3's persistent group): every rank stepped its shard; gather them.
  for (auto& g : groups_) g.flat->after_step_async();
  for (auto& g : groups_)
    if (g.flat->options().keep_full) {
      g.flat->gather();
      ++gathers_;
      comm_bytes_ += static_cast<double>(g.flat->layout().padded_numel()) * 4.0 *
                     (world_size_ - 1) / std::max(1, world_size_);
    }
  exposed_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

void ZeroStrategy::zero_grad() {
  check_setup("zero_grad");
  for (auto& g : groups_) g.flat->zero_grad();
  if (stage_ > 1)
    for (auto& p : grads_) p.tensor.mutable_grad() = at::Tensor();
}

// ---------------------------------------------------------------------------------------------
// State and metrics

std::vector<NamedTensor> ZeroStrategy::full_state_dict() {
  check_setup("full_state_dict");
  std::map<const void*, at::Tensor> value;
  for (auto& g : groups_) {
    auto full = g.flat->gather_full_values();
    for (size_t k = 0; k < g.params.size(); ++k)
      value[grads_[g.params[k]].tensor.unsafeGetTensorImpl()] = full[k].tensor;
  }
  std::vector<NamedTensor> out;
  for (const auto& p : all_params_) {
    auto it = value.find(p.tensor.unsafeGetTensorImpl());
    out.push_back({p.name, it != value.end() ? it->second : p.tensor.detach()});
  }
  for (auto& b : model_->named_buffers()) out.push_back({b.name, b.tensor.detach()});
  return out;
}

void ZeroStrategy::add_step_metrics(std::map<std::string, double>& extra) {
  extra["comm_bytes"] = comm_bytes_;
  extra["comm_exposed_s"] = exposed_s_;
  extra["zero_stage"] = stage_;
  extra["zero_gathers"] = gathers_;
  double resident = 0;
  for (const auto& g : groups_) resident += static_cast<double>(g.flat->resident_bytes());
  extra["zero_flat_bytes"] = resident;
  comm_bytes_ = exposed_s_ = gathers_ = 0;
}

}  // namespace trainrun::plugins

#ifndef TRAINRUN_NO_PLUGIN_ENTRY
TRAINRUN_PLUGIN("zero", "0.1.0",
                trainrun::v1::component<trainrun::v1::Strategy, trainrun::plugins::ZeroStrategy>(
                    "zero", "ZeRO data parallelism, stages 1-3: optimizer state, gradients and "
                            "parameters sharded across ranks (DeepSpeed's zero_optimization)"))
#endif
