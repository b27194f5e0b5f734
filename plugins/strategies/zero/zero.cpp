#include "zero.hpp"

#include <trainrun/plugin.hpp>
#include <trainrun/runtime/memory.hpp>
#include <trainrun/strategy/memory_estimate.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <set>

namespace trainrun::plugins {

using namespace trainrun::v1;

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
         "memory (physical RAM on CPU) divided among the ranks of the node",
         0.0);
}

ZeroStrategy::ZeroStrategy(const Options& o, const RunContext& ctx)
    : ShardedStrategy(kName, ctx),
      requested_stage_(o.get_int("stage")),
      reduce_bucket_elements_(o.get_int("reduce_bucket_size")),
      prefetch_elements_(o.get_int("prefetch_bucket_size")),
      persistence_threshold_(o.get_int("param_persistence_threshold")),
      overlap_(o.get_bool("overlap_comm")),
      memory_budget_gb_(o.get_double("memory_budget_gb")) {
  metrics_prefix_ = "zero";
}

std::string ZeroStrategy::choose_stage(const memory::ZeroEstimateInputs& in,
                                       const std::array<memory::ZeroStageEstimate, 4>& est) {
  std::string reason;
  if (requested_stage_ == kAuto) {
    const double budget = memory::budget_bytes(memory_budget_gb_, memory_inputs_);
    TR_CHECK_TYPED(ConfigError, budget > 0, kName, ": stage = \"auto\" needs a memory budget: "
                   "set [strategy] memory_budget_gb (the accelerator reports no capacity)");
    for (int s = 1; s <= 3 && stage_ == 0; ++s)
      if (est[static_cast<size_t>(s)].total_bytes <= budget) stage_ = s;
    if (stage_ == 0) {
      const int64_t need = memory::smallest_fitting_world_size(in, 3, budget);
      TR_CHECK_TYPED(ConfigError, need == 0, kName, ": no stage fits the memory budget of ",
                     memory::format_bytes(budget), " per rank: stage 3 needs ",
                     memory::format_bytes(est[3].total_bytes), " per rank at world size ",
                     world_size_, "; a world size of at least ", need, " would fit");
      TR_CHECK_TYPED(ConfigError, false, kName, ": no stage fits the memory budget of ",
                     memory::format_bytes(budget), " per rank at any world size: stage 3's "
                     "communication buffers alone need ", memory::format_bytes(est[3].buffers_bytes),
                     " (lower reduce_bucket_size or prefetch_bucket_size)");
    }
    reason = detail::cat("stage ", stage_, " chosen: ",
                         memory::format_bytes(est[static_cast<size_t>(stage_)].total_bytes),
                         " per rank fits the budget of ", memory::format_bytes(budget));
    if (stage_ > 1)
      reason += detail::cat(" (stage ", stage_ - 1, " needs ",
                            memory::format_bytes(est[static_cast<size_t>(stage_ - 1)].total_bytes), ")");
  } else {
    stage_ = static_cast<int>(requested_stage_);
    reason = detail::cat("stage ", stage_, " as configured; estimate ",
                         memory::format_bytes(est[static_cast<size_t>(stage_)].total_bytes),
                         " per rank (model state ",
                         memory::format_bytes(est[static_cast<size_t>(stage_)].model_state_bytes), ")");
  }
  return reason;
}

sharding::ShardedStrategy::Plan ZeroStrategy::plan(Model& model, Communicator& world,
                                                   const TrainPlan&) {
  // What the estimator needs: trainable parameters (tied ones once), frozen ones as stored, the
  // largest unit, and the parameters stage 3 keeps whole.
  const sharding::ModelStatistics stats = sharding::model_statistics(model, persistence_threshold_);
  memory::ZeroEstimateInputs in = memory::zero_inputs(memory_inputs_, stats.params, world_size_);
  in.reduce_bucket_elems = reduce_bucket_elements_;
  in.largest_unit_params = stats.largest_unit;
  in.prefetch_elems = prefetch_elements_;
  in.persistent_params = stats.persistent;
  in.frozen_params = stats.frozen;
  in.frozen_bytes = stats.frozen_bytes;
  in.whole_frozen_bytes = stats.whole_frozen_bytes;
  const auto est = memory::estimate_zero(in);

  std::string reason = choose_stage(in, est);
  if (stage_ == 3 && stats.persistent == stats.params)
    reason += detail::cat("; note: all ", stats.params, " parameters are below "
                          "param_persistence_threshold = ", persistence_threshold_,
                          ", so none is sharded (set it lower)");
  estimate_state_bytes_ = est[static_cast<size_t>(stage_)].model_state_bytes;
  estimate_total_bytes_ = est[static_cast<size_t>(stage_)].total_bytes;
  if (rank_ == 0) std::cout << "  zero        " << reason << std::endl;

  Plan p;
  p.shard = &world;
  sharding::RuntimeOptions& ro = p.options;
  ro.name = kName;
  ro.overlap = overlap_;
  if (stage_ < 3) {
    ro.grouping = sharding::RuntimeOptions::Grouping::Buckets;
    ro.bucket_elements = reduce_bucket_elements_;
    ro.keep_full = true;
    ro.full_grads = stage_ == 1;
  } else {
    ro.grouping = sharding::RuntimeOptions::Grouping::Units;
    ro.persistence_threshold = persistence_threshold_;
    ro.keep_full = false;
    ro.reshard_after_forward = true;
    ro.forward_prefetch_elements = prefetch_elements_;
    ro.backward_prefetch_elements = prefetch_elements_;
  }
  return p;
}


ModelOutput ZeroStrategy::forward(const Batch& batch) {
  if (activation_bytes_ >= 0 || !c10::GradMode::is_enabled() || !memory::tracking())
    return ShardedStrategy::forward(batch);
  // The one-step probe: what the first training forward leaves alive for backward (saved
  // activations, plus at stage 3 the root group kept gathered) is the part of the peak the
  // model-state formulas cannot know.
  const int64_t before = memory::cpu_stats().current_bytes;
  ModelOutput out = ShardedStrategy::forward(batch);
  activation_bytes_ = static_cast<double>(memory::cpu_stats().current_bytes - before);
  return out;
}

void ZeroStrategy::add_step_metrics(std::map<std::string, double>& extra) {
  if (!runtime_) return;
  ShardedStrategy::add_step_metrics(extra);
  extra["zero_stage"] = stage_;
  extra["zero_estimate_state_bytes"] = estimate_state_bytes_;
  if (activation_bytes_ >= 0) {
    extra["zero_activation_bytes"] = activation_bytes_;
    extra["zero_estimate_peak_bytes"] = estimate_total_bytes_ + activation_bytes_;
    if (!reported_ && rank_ == 0)
      std::cout << "  zero        one-step probe: " << memory::format_bytes(activation_bytes_)
                << " of activations per micro-batch; estimated peak "
                << memory::format_bytes(estimate_total_bytes_ + activation_bytes_) << " per rank ("
                << memory::format_bytes(estimate_state_bytes_) << " model state + "
                << memory::format_bytes(estimate_total_bytes_ - estimate_state_bytes_)
                << " buffers + activations)" << std::endl;
    reported_ = true;
  }
}

}  // namespace trainrun::plugins
