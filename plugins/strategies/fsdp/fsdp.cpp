#include "fsdp.hpp"

#include <trainrun/plugin.hpp>
#include <trainrun/strategy/memory_estimate.hpp>
#include <trainrun/strategy/strategy_helpers.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <set>

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace {
constexpr const char* kName = "strategy 'fsdp'";

at::ScalarType dtype_of(const std::string& name) {
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  return at::kFloat;
}
}  // namespace

void FsdpStrategy::declare_options(OptionSchema& s) {
  s.choice("sharding_strategy", "FULL_SHARD",
           {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "auto"},
           "what is sharded (PyTorch FSDP's ShardingStrategy); auto: the least sharding whose "
           "memory estimate fits memory_budget_gb");
  s.integer("min_num_params", 0,
            "merge consecutive units until each flat parameter holds at least this many "
            "parameters (size-based auto-wrap); 0 = one flat parameter per unit",
            0.0);
  s.choice("backward_prefetch", "BACKWARD_PRE", {"BACKWARD_PRE", "BACKWARD_POST", "none"},
           "when the previous unit's gather starts in backward: when this unit's backward starts "
           "(PRE), when its gradients are in (POST), or on demand (none)");
  s.boolean("forward_prefetch", false, "gather the next unit while this unit's forward runs");
  s.boolean("limit_all_gathers", true,
            "at most two units' parameters gathered at once (the one in use and one prefetched)");
  s.integer("shard_group_size", 0,
            "HYBRID_SHARD: ranks per shard group (consecutive ranks; capped at world_size); 0 = the "
            "ranks of a node",
            0.0);
  // PyTorch FSDP's MixedPrecision(param_dtype, reduce_dtype, buffer_dtype).
  s.choice("param_dtype", "fp32", {"fp32", "bf16", "fp16"},
           "dtype the gathered parameters, forward and backward compute in and all-gathers send; "
           "the sharded float32 values stay the optimizer's master weights");
  s.choice("reduce_dtype", "param_dtype", {"param_dtype", "fp32", "bf16", "fp16"},
           "dtype gradients are reduce-scattered in (param_dtype = the same as param_dtype, "
           "FSDP's default)");
  s.choice("buffer_dtype", "unchanged", {"unchanged", "fp32", "bf16", "fp16"},
           "dtype floating-point buffers are cast to at setup (unchanged = kept as the model "
           "made them)");
  s.real("memory_budget_gb", 0.0,
         "per-rank budget for sharding_strategy = \"auto\" (GB, 1e9 bytes); 0 = the "
         "accelerator's memory (physical RAM on CPU) divided among the ranks of the node",
         0.0);
}

FsdpStrategy::FsdpStrategy(const Options& o, const RunContext& ctx)
    : ShardedStrategy(kName, ctx),
      requested_(o.get_string("sharding_strategy")),
      min_num_params_(o.get_int("min_num_params")),
      backward_prefetch_(o.get_string("backward_prefetch")),
      forward_prefetch_(o.get_bool("forward_prefetch")),
      limit_all_gathers_(o.get_bool("limit_all_gathers")),
      shard_group_size_(o.get_int("shard_group_size")),
      memory_budget_gb_(o.get_double("memory_budget_gb")),
      param_dtype_(o.get_string("param_dtype")),
      reduce_dtype_(o.get_string("reduce_dtype") == "param_dtype" ? param_dtype_
                                                                    : o.get_string("reduce_dtype")),
      buffer_dtype_(o.get_string("buffer_dtype")) {
  metrics_prefix_ = "fsdp";
  context_ = o.context();
  if (shard_group_size_ > 0 && shard_group_size_ < world_size_)
    TR_CHECK_TYPED(ConfigError, world_size_ % shard_group_size_ == 0, o.context(),
                   ": shard_group_size = ", shard_group_size_, " does not divide world_size ",
                   world_size_);
}

sharding::ShardedStrategy::Plan FsdpStrategy::plan(Model& model, Communicator& world,
                                                   const TrainPlan&) {
  apply_dtypes(model);
  // A shard group larger than the world is the world (a 1-rank run of a hybrid job).
  const int group = static_cast<int>(std::min<int64_t>(
      shard_group_size_ > 0 ? shard_group_size_ : memory_inputs_.local_world_size, world_size_));
  TR_CHECK_TYPED(ConfigError, world_size_ % group == 0, kName, ": a shard group of ", group,
                 " ranks does not divide world_size ", world_size_,
                 " (set [strategy] shard_group_size)");
  std::string reason = choose_strategy(estimate_memory(model, group), group);
  if (param_dtype_ != "fp32" || reduce_dtype_ != "fp32")
    reason += "; parameters in " + param_dtype_ + ", gradients reduced in " + reduce_dtype_;
  if (strategy_ == "HYBRID_SHARD") {
    reason +=
        detail::cat("; shard groups of ", group, " ranks, ", world_size_ / group, " replica(s)");
  }
  if (rank_ == 0) std::cout << "  fsdp        " << reason << std::endl;

  Plan p;
  create_groups(world, group, p);
  sharding::RuntimeOptions& ro = p.options;
  ro.name = kName;
  ro.grouping = sharding::RuntimeOptions::Grouping::Units;
  ro.min_unit_params = min_num_params_;
  ro.keep_full = strategy_ == "NO_SHARD";
  ro.reshard_after_forward = strategy_ != "SHARD_GRAD_OP";
  ro.forward_prefetch_elements = forward_prefetch_ ? 1 : 0;  // one unit ahead
  ro.backward_prefetch_elements = backward_prefetch_ != "none" ? 1 : 0;
  ro.backward_prefetch_post = backward_prefetch_ == "BACKWARD_POST";
  ro.limit_all_gathers = limit_all_gathers_;
  ro.param_dtype = dtype_of(param_dtype_);
  ro.reduce_dtype = dtype_of(reduce_dtype_);
  return p;
}

void FsdpStrategy::apply_dtypes(Model& model) const {
  // LibTorch 1.13 has no float16 matmul on CPU: fail here, naming the key, not in the first
  // forward.
  for (const auto& [key, value] : {std::pair<const char*, std::string>{"param_dtype", param_dtype_},
                                   {"buffer_dtype", buffer_dtype_}})
    TR_CHECK_TYPED(ConfigError, !(value == "fp16" && device_.is_cpu()), context_, ": ", key,
                   " = \"fp16\": float16 compute is not implemented on CPU in LibTorch 1.13; "
                   "use \"bf16\"");
  if (buffer_dtype_ != "unchanged") {
    c10::NoGradGuard no_grad;
    for (auto& b : model.named_buffers())
      if (at::isFloatingType(b.tensor.scalar_type()))
        b.tensor.set_data(b.tensor.to(dtype_of(buffer_dtype_)));
  }
}

FsdpStrategy::Estimates FsdpStrategy::estimate_memory(Model& model, int group) {
  MemoryInputs mem = memory_inputs_;
  if (param_dtype_ != "fp32") {
    // Gathered parameters and whole gradients in the low-precision dtype; the float32 shard is
    // the master copy (the paper's K counts it).
    mem.param_bytes = 2;
    mem.grad_bytes = 2;
    mem.master_bytes = 4;
  }
  // The ZeRO formulas: NO_SHARD = stage 0, SHARD_GRAD_OP keeps whole parameters between forward
  // and backward ~ stage 2, FULL_SHARD = stage 3 over the world, HYBRID_SHARD = stage 3 over the
  // shard group.
  const sharding::ModelStatistics stats = sharding::model_statistics(model);
  largest_unit_bytes_ = static_cast<double>(c10::elementSize(dtype_of(param_dtype_))) *
                        static_cast<double>(stats.largest_unit);
  auto inputs = [&](int n) {
    memory::ZeroEstimateInputs in = memory::zero_inputs(mem, stats.params, n);
    in.largest_unit_params = stats.largest_unit;
    in.prefetch_elems = backward_prefetch_ != "none" ? stats.largest_unit : 0;
    return in;
  };
  Estimates e;
  e.world = inputs(world_size_);
  e.no_shard = memory::estimate_zero_stage(e.world, 0).total_bytes;
  e.grad_op = memory::estimate_zero_stage(e.world, 2).total_bytes;
  e.hybrid = memory::estimate_zero_stage(inputs(group), 3).total_bytes;
  e.full = memory::estimate_zero_stage(e.world, 3).total_bytes;
  return e;
}

std::string FsdpStrategy::choose_strategy(const Estimates& est, int group) {
  if (requested_ != "auto") {
    strategy_ = requested_;
    return strategy_ + " as configured";
  }
  const double budget = memory::budget_bytes(memory_budget_gb_, memory_inputs_);
  TR_CHECK_TYPED(ConfigError, budget > 0, kName,
                 ": sharding_strategy = \"auto\" needs a memory budget: set [strategy] "
                 "memory_budget_gb");
  const bool nodes = world_size_ / group > 1;
  if (est.no_shard <= budget)
    strategy_ = "NO_SHARD";
  else if (est.grad_op <= budget)
    strategy_ = "SHARD_GRAD_OP";
  else if (nodes && est.hybrid <= budget)
    strategy_ = "HYBRID_SHARD";
  else if (est.full <= budget)
    strategy_ = "FULL_SHARD";
  if (strategy_.empty()) {
    const int64_t need = memory::smallest_fitting_world_size(est.world, 3, budget);
    TR_CHECK_TYPED(ConfigError, need > 0, kName,
                   ": no sharding strategy fits the memory budget of ",
                   memory::format_bytes(budget),
                   " per rank at any world size: the gathered units alone exceed it");
    TR_CHECK_TYPED(ConfigError, false, kName, ": no sharding strategy fits the memory budget of ",
                   memory::format_bytes(budget), " per rank: FULL_SHARD needs ",
                   memory::format_bytes(est.full), " per rank at world size ", world_size_,
                   "; a world size of at least ", need, " would fit");
  }
  const double chosen = strategy_ == "NO_SHARD"        ? est.no_shard
                        : strategy_ == "SHARD_GRAD_OP" ? est.grad_op
                        : strategy_ == "HYBRID_SHARD"  ? est.hybrid
                                                       : est.full;
  std::string reason = detail::cat(strategy_, " chosen: estimate ", memory::format_bytes(chosen),
                                   " per rank fits the budget of ", memory::format_bytes(budget));
  if (strategy_ != "NO_SHARD")
    reason += " (NO_SHARD needs " + memory::format_bytes(est.no_shard) + ")";
  return reason;
}

void FsdpStrategy::create_groups(Communicator& world, int group, Plan& p) {
  // c10d semantics: every rank creates every group, in the same order.
  Communicator* shard = &world;
  Communicator* replicate = nullptr;
  if (strategy_ == "NO_SHARD" && world_size_ > 1) {
    for (int r = 0; r < world_size_; ++r) {
      auto g = world.new_group({r});
      if (r == rank_) shard_group_ = g;
    }
    shard = shard_group_.get();
    replicate = &world;
  } else if (strategy_ == "HYBRID_SHARD" && group < world_size_) {
    BlockGroups groups = new_block_groups(world, group);
    shard_group_ = std::move(groups.block);
    replicate_group_ = std::move(groups.across);
    TR_CHECK(shard_group_ && replicate_group_, kName, ": rank ", rank_,
             ": new_group did not return this rank's shard or replicate group");
    shard = shard_group_.get();
    replicate = replicate_group_.get();
  }
  p.shard = shard;
  p.replicate = replicate;
}

void FsdpStrategy::add_step_metrics(std::map<std::string, double>& extra) {
  if (!runtime_) return;
  ShardedStrategy::add_step_metrics(extra);
  extra["fsdp_unit_bytes"] = largest_unit_bytes_;
}

}  // namespace trainrun::plugins
