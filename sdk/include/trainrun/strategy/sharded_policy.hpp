#pragma once
// The sharding engine's policy as data: how a ShardedRuntime groups, keeps and communicates
// parameters (RuntimeOptions, the policies described in trainrun/strategy/sharded_runtime.hpp),
// and the grouping itself as a pure function (plan_groups), apart from any tensor or
// communicator so that it can be unit-tested and reused by estimates.
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/strategy/sharding.hpp"

namespace trainrun::v1::sharding {

/// How a ShardedRuntime groups, keeps and communicates parameters (the policies listed in
/// trainrun/strategy/sharded_runtime.hpp). Sizes in elements.
struct RuntimeOptions {
  std::string name = "sharded strategy";  ///< for messages, e.g. "strategy 'zero'"
  enum class Grouping { Buckets, Units } grouping = Grouping::Units;
  int64_t bucket_elements = 500000000;  ///< Buckets: elements per flat parameter
  int64_t min_unit_params = 0;          ///< Units: merge a unit smaller than this into the next
  int64_t persistence_threshold = 0;    ///< Units: parameters smaller than this stay whole
  bool keep_full = false;               ///< parameters always gathered
  bool reshard_after_forward = true;    ///< release a unit after its forward (else at backward end)
  bool full_grads = false;              ///< ZeRO-1: whole gradients kept, reduced on sync only
  bool overlap = true;                  ///< reduce during backward as groups complete
  int64_t forward_prefetch_elements = 0;   ///< gather the next units ahead in forward
  int64_t backward_prefetch_elements = 0;  ///< gather the previous units ahead in backward
  bool backward_prefetch_post = false;  ///< prefetch when a unit's gradients are in (POST) rather
                                        ///< than when its backward starts (PRE)
  bool limit_all_gathers = false;       ///< at most two non-root units gathered at once
  /// Mixed precision (FSDP's MixedPrecision): the dtype parameters compute and travel in
  /// (float32 shards stay the optimizer's master weights), and the dtype gradients are reduced
  /// in. With a param_dtype other than float32, floating-point model inputs are cast to it.
  at::ScalarType param_dtype = at::kFloat;
  at::ScalarType reduce_dtype = at::kFloat;
};

/// One flat parameter the grouping asks for: which trainable parameters it holds (indices in
/// the caller's numbering), the units it covers (Units grouping; a merged group a range, -1
/// otherwise), whether it is the root group, whether it stays gathered, and its label.
struct GroupSpec {
  std::vector<size_t> params;
  int first_unit = -1, last_unit = -1;
  bool root = false, keep = true;
  std::string label;
};

/// The grouping policy of ShardedRuntime as a pure function (unit-tested), in reduce order (the
/// order gradients complete in backward). `numels[i]` is trainable parameter i's element count
/// (registration order); for Units grouping `owner[i]` is the unit that uses it (-1: none, -2:
/// several, e.g. a tied weight) and `unit_names` the units in forward order.
///  - Buckets: parameters in reverse registration order, bucket_elements per group ("bucket k").
///  - Units: parameters below persistence_threshold form the "persistent group" (last, always
///    gathered); those of exactly one unit go with it, consecutive units merged until a group
///    reaches min_unit_params ("unit NAME" or "units FIRST..LAST", last unit first); the rest
///    (no unit, or several) form the "root group", gathered for the whole forward and backward.
inline std::vector<GroupSpec> plan_groups(const std::vector<int64_t>& numels,
                                          const std::vector<int>& owner,
                                          const std::vector<std::string>& unit_names,
                                          const RuntimeOptions& opts) {
  const size_t n = numels.size();
  std::vector<GroupSpec> specs;
  if (opts.grouping == RuntimeOptions::Grouping::Buckets) {
    std::vector<size_t> order(n);
    std::iota(order.rbegin(), order.rend(), size_t{0});
    size_t k = 0;
    for (auto& b : bucket_by_elements(numels, order, opts.bucket_elements))
      specs.push_back({std::move(b), -1, -1, false, true, "bucket " + std::to_string(k++)});
    return specs;
  }
  TR_CHECK(owner.size() == n, opts.name, ": plan_groups: ", owner.size(), " owners for ", n,
           " parameters");
  std::vector<std::vector<size_t>> per_unit(unit_names.size());
  std::vector<size_t> root, persistent;
  for (size_t i = 0; i < n; ++i) {
    if (numels[i] < opts.persistence_threshold)
      persistent.push_back(i);
    else if (owner[i] >= 0)
      per_unit[static_cast<size_t>(owner[i])].push_back(i);
    else
      root.push_back(i);
  }
  // Merge consecutive units (forward order) until a group reaches min_unit_params (FSDP's
  // size-based auto-wrap): a small unit is not worth a collective of its own.
  std::vector<GroupSpec> forward_order;
  GroupSpec cur;
  int64_t cur_numel = 0;
  for (size_t u = 0; u < unit_names.size(); ++u) {
    if (per_unit[u].empty()) continue;
    if (cur.params.empty()) cur.first_unit = static_cast<int>(u);
    cur.last_unit = static_cast<int>(u);
    for (size_t i : per_unit[u]) {
      cur.params.push_back(i);
      cur_numel += numels[i];
    }
    if (cur_numel >= opts.min_unit_params) {
      cur.keep = opts.keep_full;
      forward_order.push_back(std::move(cur));
      cur = GroupSpec{};
      cur_numel = 0;
    }
  }
  if (!cur.params.empty()) {
    cur.keep = opts.keep_full;
    forward_order.push_back(std::move(cur));
  }
  for (auto it = forward_order.rbegin(); it != forward_order.rend(); ++it) {
    it->label = it->first_unit == it->last_unit
                    ? "unit " + unit_names[static_cast<size_t>(it->first_unit)]
                    : "units " + unit_names[static_cast<size_t>(it->first_unit)] + ".." +
                          unit_names[static_cast<size_t>(it->last_unit)];
    specs.push_back(std::move(*it));
  }
  if (!root.empty()) specs.push_back({root, -1, -1, true, opts.keep_full, "root group"});
  if (!persistent.empty()) specs.push_back({persistent, -1, -1, false, true, "persistent group"});
  return specs;
}

}  // namespace trainrun::v1::sharding
