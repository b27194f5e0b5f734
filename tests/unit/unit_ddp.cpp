// Unit tests of the ddp strategy: the bucket assignment (a pure function), and the reducer
// driven in one process through the fake communicator (fake_communicator.hpp) playing a world
// of two identical replicas (Avg of equal tensors is the tensor itself), whose log records every
// collective it is given.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <trainrun/trainrun.hpp>

#include <string>
#include <vector>

#include "strategies/ddp/ddp.hpp"
#include "fake_communicator.hpp"

namespace tr = trainrun::v1;
using trainrun::plugins::DdpStrategy;
using trainrun::plugins::ddp::assign_buckets;
using trainrun::plugins::ddp::BucketItem;
using Buckets = std::vector<std::vector<size_t>>;

TEST_SUITE("ddp_buckets") {
  TEST_CASE("reverse registration order, first bucket capped smaller") {
    // Items 5..0 (reverse registration) of 400 bytes; first cap 1000, cap 1200.
    std::vector<BucketItem> order;
    for (size_t i = 6; i-- > 0;) order.push_back({i, 400, c10::kFloat});
    CHECK(assign_buckets(order, 1000, 1200) == Buckets{{5, 4}, {3, 2, 1}, {0}});
  }
  TEST_CASE("a tensor larger than the cap gets a bucket of its own") {
    std::vector<BucketItem> order = {{3, 100, c10::kFloat}, {2, 5000, c10::kFloat},
                                     {1, 100, c10::kFloat}, {0, 100, c10::kFloat}};
    CHECK(assign_buckets(order, 1000, 1000) == Buckets{{3}, {2}, {1, 0}});
    // Exactly the cap closes the bucket too.
    std::vector<BucketItem> exact = {{1, 1000, c10::kFloat}, {0, 10, c10::kFloat}};
    CHECK(assign_buckets(exact, 1000, 1000) == Buckets{{1}, {0}});
  }
  TEST_CASE("no bucket exceeds its cap unless it holds one item") {
    std::vector<BucketItem> order;
    for (size_t i = 0; i < 50; ++i) order.push_back({i, static_cast<int64_t>(37 * (i % 7) + 1), c10::kFloat});
    const auto buckets = assign_buckets(order, 100, 300);
    size_t seen = 0;
    for (size_t b = 0; b < buckets.size(); ++b) {
      int64_t bytes = 0;
      for (size_t i : buckets[b]) {
        bytes += order[i].bytes;
        CHECK(i == seen++);  // order kept
      }
      if (buckets[b].size() > 1) CHECK(bytes <= (b == 0 ? 100 : 300));
    }
    CHECK(seen == 50);
  }
  TEST_CASE("dtypes never share a bucket; buckets ordered by their first item") {
    std::vector<BucketItem> order = {{0, 10, c10::kFloat}, {1, 10, c10::kHalf},
                                     {2, 10, c10::kFloat}, {3, 10, c10::kHalf}};
    CHECK(assign_buckets(order, 1000, 1000) == Buckets{{0, 2}, {1, 3}});
  }
  TEST_CASE("a rebuilt (observed) order is followed as given") {
    std::vector<BucketItem> order = {{2, 400, c10::kFloat}, {0, 400, c10::kFloat},
                                     {3, 400, c10::kFloat}, {1, 400, c10::kFloat}};
    CHECK(assign_buckets(order, 500, 800) == Buckets{{2}, {0, 3}, {1}});
  }
  TEST_CASE("caps must be positive") {
    CHECK_THROWS_WITH(assign_buckets({}, 0, 10), doctest::Contains("caps must be positive"));
  }
}

namespace {

using trainrun::test::FakeAccelerator;

// Registered in an order that differs from the order of use (`second` before `first`), so the
// gradients arrive in an order the initial guess (reverse registration) gets wrong.
struct Net : torch::nn::Module {
  explicit Net(bool unused) {
    second = register_module("second", torch::nn::Linear(32, 10));
    first = register_module("first", torch::nn::Linear(20, 32));
    if (unused) spare = register_module("spare", torch::nn::Linear(32, 10));
  }
  torch::nn::Linear second{nullptr}, first{nullptr}, spare{nullptr};
};

class NetModel final : public tr::ModuleModel {
 public:
  explicit NetModel(bool unused = false) : net(std::make_shared<Net>(unused)) { set_module(net); }
  tr::ModelOutput forward(const tr::Batch& b) override {
    return tr::cross_entropy_sum(net->second(torch::relu(net->first(b.input))), b.target);
  }
  std::string describe() const override { return "net"; }
  std::shared_ptr<Net> net;
};

tr::Options ddp_options(double first_mb, double cap_mb, bool overlap = true,
                        bool find_unused = false, const std::string& compression = "none") {
  return tr::Options({{"bucket_cap_mb", cap_mb},
                      {"first_bucket_mb", first_mb},
                      {"overlap", overlap},
                      {"find_unused_parameters", find_unused},
                      {"gradient_compression", compression}},
                     "[strategy]");
}

tr::RunContext world(int size) {
  tr::RunContext ctx;
  ctx.world_size = size;
  return ctx;
}

tr::Batch batch(int64_t seed) {
  torch::manual_seed(seed);
  tr::Batch b;
  b.input = torch::randn({8, 20});
  b.target = torch::randint(0, 10, {8}, torch::kLong);
  b.num_samples = b.num_targets = 8;
  return b;
}

// Gradients of a copy of the model, computed without any strategy.
std::map<std::string, at::Tensor> reference_grads(NetModel& model, const std::vector<tr::Batch>& batches) {
  NetModel ref(!model.net->spare.is_empty());
  {
    torch::NoGradGuard ng;
    auto src = model.named_parameters();
    auto dst = ref.named_parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].tensor.copy_(src[i].tensor);
  }
  for (const auto& b : batches) ref.forward(b).loss_sum.backward();
  std::map<std::string, at::Tensor> out;
  for (auto& p : ref.named_parameters()) out[p.name] = p.tensor.grad();
  return out;
}

constexpr double kTinyMb = 400.0 / (1024 * 1024);  // 100 float32 per bucket

}  // namespace

TEST_SUITE("ddp_reducer") {
  TEST_CASE("gradients are averaged in buckets launched during backward, then rebuilt once") {
    torch::manual_seed(0);
    NetModel model;
    FakeAccelerator acc(2);
    DdpStrategy ddp(ddp_options(kTinyMb, 4 * kTinyMb), world(2));
    ddp.setup(model, acc, {});
    // Setup: shape check (two all_gathers) and one broadcast of the float32 parameters.
    CHECK(acc.comm.log == std::vector<std::string>{"all_gather", "all_gather", "broadcast"});
    acc.comm.log.clear();
    // Reverse registration: first.bias (32 floats), first.weight (640), second.bias (10),
    // second.weight (320); first cap 100 floats, then 400.
    const auto initial = ddp.bucket_layout();
    CHECK(initial == std::vector<std::vector<std::string>>{
                         {"first.bias"}, {"first.weight"}, {"second.bias", "second.weight"}});

    const auto b = batch(1);
    const auto expected = reference_grads(model, {b});
    ddp.before_backward(true);
    ddp.forward(b).loss_sum.backward();
    // second.* become ready first, but their bucket waits behind first.*'s (strict order);
    // first.* come last in backward and release all three, still inside backward.
    CHECK(acc.comm.count("all_reduce") == 3);
    ddp.finish_gradient_sync();
    CHECK(ddp.buckets_launched_in_backward() == 3);
    for (auto& p : model.named_parameters()) {
      INFO(p.name);
      REQUIRE(p.tensor.grad().defined());
      CHECK(torch::allclose(p.tensor.grad(), expected.at(p.name)));
    }
    // Rebuilt in the observed order (second.* first), announced by rank 0's broadcast.
    CHECK(acc.comm.log.back() == "broadcast");
    const auto rebuilt = ddp.bucket_layout();
    CHECK(rebuilt != initial);
    REQUIRE(!rebuilt.empty());
    CHECK(rebuilt.front().front().rfind("second.", 0) == 0);
    CHECK(rebuilt.back().back().rfind("first.", 0) == 0);
    std::map<std::string, double> m;
    ddp.add_step_metrics(m);
    CHECK(m.at("comm_bytes") == 4.0 * (32 + 640 + 10 + 320));
    CHECK(m.at("buckets") == static_cast<double>(rebuilt.size()));
    CHECK(m.at("buckets_overlapped") == 3);
    CHECK(m.at("comm_exposed_s") >= 0);

    // Step 2 with the rebuilt buckets: the first launches while first.* is still in backward.
    ddp.zero_grad();
    for (auto& p : model.named_parameters()) CHECK(!p.tensor.grad().defined());
    acc.comm.log.clear();
    const auto b2 = batch(2);
    const auto expected2 = reference_grads(model, {b2});
    ddp.before_backward(true);
    ddp.forward(b2).loss_sum.backward();
    ddp.finish_gradient_sync();
    CHECK(acc.comm.count("all_reduce") == rebuilt.size());
    CHECK(acc.comm.log.back().rfind("all_reduce", 0) == 0);  // no second rebuild
    for (auto& p : model.named_parameters())
      CHECK(torch::allclose(p.tensor.grad(), expected2.at(p.name)));
  }

  TEST_CASE("overlap = false launches nothing before finish_gradient_sync") {
    torch::manual_seed(0);
    NetModel model;
    FakeAccelerator acc(2);
    DdpStrategy ddp(ddp_options(kTinyMb, 4 * kTinyMb, /*overlap=*/false), world(2));
    ddp.setup(model, acc, {});
    acc.comm.log.clear();
    ddp.before_backward(true);
    ddp.forward(batch(1)).loss_sum.backward();
    CHECK(acc.comm.count("all_reduce") == 0);
    ddp.finish_gradient_sync();
    CHECK(acc.comm.count("all_reduce") == 3);
    CHECK(ddp.buckets_launched_in_backward() == 0);
  }

  TEST_CASE("accumulation: no communication before the sync micro-batch, one reduction after") {
    torch::manual_seed(0);
    NetModel model;
    FakeAccelerator acc(2);
    DdpStrategy ddp(ddp_options(1, 25), world(2));
    ddp.setup(model, acc, {});
    acc.comm.log.clear();
    const auto b1 = batch(1), b2 = batch(2);
    const auto expected = reference_grads(model, {b1, b2});
    ddp.before_backward(false);
    ddp.forward(b1).loss_sum.backward();
    CHECK(acc.comm.count("all_reduce") == 0);
    ddp.before_backward(true);
    ddp.forward(b2).loss_sum.backward();
    ddp.finish_gradient_sync();
    CHECK(acc.comm.count("all_reduce") == 1);  // everything fits one bucket
    for (auto& p : model.named_parameters())
      CHECK(torch::allclose(p.tensor.grad(), expected.at(p.name)));
  }

  TEST_CASE("fp16 compression: half on the wire, float32 gradients after") {
    torch::manual_seed(0);
    NetModel model;
    FakeAccelerator acc(2);
    DdpStrategy ddp(ddp_options(1, 25, true, false, "fp16"), world(2));
    ddp.setup(model, acc, {});
    acc.comm.log.clear();
    const auto b = batch(1);
    const auto expected = reference_grads(model, {b});
    ddp.before_backward(true);
    ddp.forward(b).loss_sum.backward();
    ddp.finish_gradient_sync();
    CHECK(acc.comm.log.front() == "all_reduce sum Half 1002");
    for (auto& p : model.named_parameters()) {
      CHECK((p.tensor.grad().scalar_type() == torch::kFloat));
      CHECK(torch::allclose(p.tensor.grad(), expected.at(p.name), 1e-2, 1e-3));
    }
    std::map<std::string, double> m;
    ddp.add_step_metrics(m);
    CHECK(m.at("comm_bytes") == 2.0 * 1002);
  }

  TEST_CASE("an unused parameter is an error naming it and the option") {
    torch::manual_seed(0);
    NetModel model(/*unused=*/true);
    FakeAccelerator acc(2);
    DdpStrategy ddp(ddp_options(1, 25), world(2));
    ddp.setup(model, acc, {});
    ddp.before_backward(true);
    ddp.forward(batch(1)).loss_sum.backward();
    CHECK_THROWS_WITH_AS(ddp.finish_gradient_sync(),
                         doctest::Contains("parameters that received no gradient this step: "
                                           "spare.weight, spare.bias. Set [strategy] "
                                           "find_unused_parameters = true"),
                         tr::ConfigError);
  }

  TEST_CASE("find_unused_parameters: an unused parameter keeps no gradient, one flag exchange") {
    torch::manual_seed(0);
    NetModel model(/*unused=*/true);
    FakeAccelerator acc(2);
    DdpStrategy ddp(ddp_options(1, 25, true, /*find_unused=*/true), world(2));
    ddp.setup(model, acc, {});
    acc.comm.log.clear();
    const auto b = batch(1);
    const auto expected = reference_grads(model, {b});
    ddp.before_backward(true);
    ddp.forward(b).loss_sum.backward();
    ddp.finish_gradient_sync();
    CHECK(acc.comm.log[0] == "all_reduce avg Float 1332");
    CHECK(acc.comm.log[1] == "all_reduce max Byte 6");
    for (auto& p : model.named_parameters()) {
      INFO(p.name);
      if (p.name.rfind("spare", 0) == 0) {
        CHECK(!p.tensor.grad().defined());
      } else {
        CHECK(torch::allclose(p.tensor.grad(), expected.at(p.name)));
      }
    }
    CHECK(ddp.grad_norm() > 0);
  }

  TEST_CASE("frozen parameters are never communicated, and are not optimizer parameters") {
    torch::manual_seed(0);
    NetModel model;
    model.net->first->weight.set_requires_grad(false);
    FakeAccelerator acc(2);
    DdpStrategy ddp(ddp_options(1, 25), world(2));
    ddp.setup(model, acc, {});
    CHECK(ddp.optimizer_parameters().size() == 3);
    acc.comm.log.clear();
    ddp.before_backward(true);
    ddp.forward(batch(1)).loss_sum.backward();
    ddp.finish_gradient_sync();
    CHECK(acc.comm.log[0] == "all_reduce avg Float 362");
  }
}
