// Unit tests of the ring strategy: the fusion plan and the timeline file name (pure functions),
// and the whole strategy in one process at world size 1 (hooks, negotiation rounds, fusion
// buffers, copy out, accumulation, metrics, the timeline file). The multi-rank behaviour is
// tested end to end (tests/e2e/ring_e2e.sh, the equivalence suite).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <trainrun/trainrun.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fake_communicator.hpp"
#include "strategies/ring/ring_strategy.hpp"

namespace tr = trainrun::v1;
using trainrun::plugins::RingStrategy;
using trainrun::plugins::ring_strategy::FusionItem;
using trainrun::plugins::ring_strategy::plan_fusion;
using trainrun::plugins::ring_strategy::timeline_path_for_rank;
using Plan = std::vector<std::vector<size_t>>;

TEST_SUITE("ring_fusion") {
  TEST_CASE("consecutive tensors up to the threshold, in the given order") {
    std::vector<FusionItem> items;
    for (size_t i = 6; i-- > 0;) items.push_back({i, 400, c10::kFloat});
    CHECK(plan_fusion(items, 1200) == Plan{{5, 4, 3}, {2, 1, 0}});
    CHECK(plan_fusion(items, 1199) == Plan{{5, 4}, {3, 2}, {1, 0}});
  }
  TEST_CASE("a tensor over the threshold goes alone; threshold 0 = no fusion") {
    std::vector<FusionItem> items = {{3, 100, c10::kFloat}, {2, 5000, c10::kFloat},
                                     {1, 100, c10::kFloat}, {0, 100, c10::kFloat}};
    CHECK(plan_fusion(items, 1000) == Plan{{3}, {2}, {1, 0}});
    CHECK(plan_fusion(items, 0) == Plan{{3}, {2}, {1}, {0}});
  }
  TEST_CASE("one buffer per dtype, ordered by first tensor") {
    std::vector<FusionItem> items = {{4, 8, c10::kDouble}, {3, 4, c10::kFloat},
                                     {2, 8, c10::kDouble}, {1, 4, c10::kFloat}};
    CHECK(plan_fusion(items, 1 << 20) == Plan{{4, 2}, {3, 1}});
  }
}

TEST_SUITE("ring_timeline_path") {
  TEST_CASE("rank before the extension, relative to run_dir") {
    CHECK(timeline_path_for_rank("t.json", "/runs/a", 3) == "/runs/a/t-rank-3.json");
    CHECK(timeline_path_for_rank("/abs/t.json", "/runs/a", 0) == "/abs/t-rank-0.json");
    CHECK(timeline_path_for_rank("trace/t", "", 1) == "trace/t-rank-1");
  }
}

namespace {

// World of one (fake_communicator.hpp): the ring and the negotiation return at once, nothing
// is ever sent (the tests check the fake's log stays empty).
using trainrun::test::FakeAccelerator;

struct Net : torch::nn::Module {
  Net() {
    first = register_module("first", torch::nn::Linear(20, 32));
    second = register_module("second", torch::nn::Linear(32, 10));
  }
  torch::nn::Linear first{nullptr}, second{nullptr};
};
class NetModel final : public tr::ModuleModel {
 public:
  NetModel() : net(std::make_shared<Net>()) { set_module(net); }
  tr::ModelOutput forward(const tr::Batch& b) override {
    return tr::cross_entropy_sum(net->second(torch::relu(net->first(b.input))), b.target);
  }
  std::string describe() const override { return "net"; }
  std::shared_ptr<Net> net;
};

// A cycle far longer than a backward: the first round comes once every gradient is in
// (finish_gradient_sync cuts the wait short), so each step fuses everything in one round.
tr::Options ring_options(double threshold_mb, const std::string& timeline = "") {
  return tr::Options({{"fusion_threshold_mb", threshold_mb},
                      {"cycle_time_ms", 60000.0},
                      {"op", std::string("average")},
                      {"gradient_compression", std::string("none")},
                      {"compression", std::string("none")},
                      {"hierarchical", false},
                      {"find_unused_parameters", false},
                      {"chunk_kb", int64_t{512}},
                      {"timeline", timeline},
                      {"timeline_max_steps", int64_t{100}}},
                     "[strategy]");
}

tr::Batch batch(int64_t seed) {
  torch::manual_seed(seed);
  tr::Batch b;
  b.input = torch::randn({8, 20});
  b.target = torch::randint(0, 10, {8}, torch::kLong);
  b.num_samples = b.num_targets = 8;
  return b;
}

// Gradients of `model` after `micro` backwards (the last synchronised) through the strategy.
std::vector<at::Tensor> step(RingStrategy& s, int micro) {
  for (int k = 0; k < micro; ++k) {
    s.before_backward(k + 1 == micro);
    s.forward(batch(k)).loss_sum.backward();
  }
  s.finish_gradient_sync();
  std::vector<at::Tensor> g;
  for (auto& p : s.optimizer_parameters()) g.push_back(p.tensor.grad().clone());
  return g;
}

std::vector<at::Tensor> plain_grads(int micro) {
  torch::manual_seed(1);
  NetModel m;
  for (int k = 0; k < micro; ++k) m.forward(batch(k)).loss_sum.backward();
  std::vector<at::Tensor> g;
  for (auto& p : m.named_parameters()) g.push_back(p.tensor.grad().clone());
  return g;
}

}  // namespace

TEST_SUITE("ring_strategy") {
  TEST_CASE("world 1: gradients unchanged, fused or not, with and without accumulation") {
    for (double mb : {128.0, 0.0}) {
      for (int micro : {1, 3}) {
        CAPTURE(mb);
        CAPTURE(micro);
        torch::manual_seed(1);
        NetModel model;
        FakeAccelerator acc;
        tr::RunContext ctx;
        RingStrategy s(ring_options(mb), ctx);
        s.setup(model, acc, {});
        const auto want = plain_grads(micro);
        for (int rep = 0; rep < 2; ++rep) {
          const auto got = step(s, micro);
          REQUIRE(got.size() == want.size());
          for (size_t i = 0; i < got.size(); ++i) CHECK(torch::allclose(got[i], want[i]));
          std::map<std::string, double> m;
          s.add_step_metrics(m);
          CHECK(m["fused_buffers"] == (mb > 0 ? 1 : 4));
          CHECK(m["comm_bytes"] == 4 * (20 * 32 + 32 + 32 * 10 + 10));
          CHECK(m["negotiation_rounds"] == 1);
          CHECK(m["fused_buffers_in_backward"] == 0);
          s.zero_grad();
        }
        CHECK(acc.comm.log.empty());
      }
    }
  }
  TEST_CASE("world 1: the timeline has every phase of every tensor") {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("unit_ring_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    {
      torch::manual_seed(1);
      NetModel model;
      FakeAccelerator acc;
      tr::RunContext ctx;
      ctx.run_dir = dir.string();
      RingStrategy s(ring_options(128, "tl.json"), ctx);
      s.setup(model, acc, {});
      step(s, 1);
      s.zero_grad();
      step(s, 2);
      CHECK(acc.comm.log.empty());
    }  // written at destruction
    std::ifstream f(dir / "tl-rank-0.json");
    REQUIRE(f.good());
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    auto count = [&](const std::string& needle) {
      size_t n = 0;
      for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
      return n;
    };
    for (const char* phase : {"WAIT_FOR_READY", "NEGOTIATE\"", "MEMCPY_IN_FUSION_BUFFER",
                              "RING_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"}) {
      CAPTURE(phase);
      CHECK(count(std::string("\"name\":\"") + phase) == 4 * 2);  // 4 tensors x 2 steps
    }
    CHECK(count("\"name\":\"FUSED_BUFFER\"") == 2);
    CHECK(text.rfind("{\"displayTimeUnit\":\"ms\"", 0) == 0);
    fs::remove_all(dir);
  }
}
