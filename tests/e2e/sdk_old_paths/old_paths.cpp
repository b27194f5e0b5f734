// The "old-paths" callback: every SDK header that moved into a role folder, included by its old
// path (the forwarding headers), and a few of their names used, so that a plugin written
// against the SDK before the move still compiles; on_train_start prints one line, so the test
// sees it load and run. Not a shipped plugin: tests/e2e/sdk_out_of_tree.sh builds it.
#include <trainrun/activation_checkpointing.hpp>
#include <trainrun/attention.hpp>
#include <trainrun/cpu_runtime.hpp>
#include <trainrun/finite_check.hpp>
#include <trainrun/gradient_hooks.hpp>
#include <trainrun/interfaces.hpp>
#include <trainrun/linear.hpp>
#include <trainrun/lr_schedule.hpp>
#include <trainrun/memory.hpp>
#include <trainrun/memory_estimate.hpp>
#include <trainrun/module_model.hpp>
#include <trainrun/packed_batch.hpp>
#include <trainrun/plugin.hpp>
#include <trainrun/replicas.hpp>
#include <trainrun/replicated_strategy.hpp>
#include <trainrun/ring.hpp>
#include <trainrun/ring_all_gather.hpp>
#include <trainrun/sharded_runtime.hpp>
#include <trainrun/sharding.hpp>
#include <trainrun/strategy_helpers.hpp>

#include <iostream>

namespace {

// Names from the moved headers, resolved through the old paths.
using Replicated = trainrun::v1::ReplicatedStrategy;
using RuntimeOptions = trainrun::v1::sharding::RuntimeOptions;
using RingOptions = trainrun::v1::ring::Options;
using Schedule = trainrun::v1::LrSchedule;
using Linear = trainrun::v1::LinearImpl;

class OldPaths : public trainrun::v1::Callback {
 public:
  static void declare_options(trainrun::v1::OptionSchema&) {}
  OldPaths(const trainrun::v1::Options&, const trainrun::v1::RunContext& ctx) : rank_(ctx.rank) {}
  void on_train_start(const trainrun::v1::TrainPlan&) override {
    if (rank_ != 0) return;
    std::cout << "[old-paths: cpu list 0-3 has " << trainrun::v1::cpu::parse_cpu_list("0-3").size()
              << " cores]" << std::endl;
  }

 private:
  int rank_ = 0;
};

}  // namespace

TRAINRUN_PLUGIN("old-paths", "1.0.0",
                trainrun::v1::component<trainrun::v1::Callback, OldPaths>(
                    "old-paths", "test only: built against the SDK's pre-issue-42 header paths"));
