// The sharding engine (sdk trainrun/strategy/sharding.hpp) and the zero strategy in one process:
// layout arithmetic on awkward sizes, storage release that keeps views attached, and stage 3 on
// a two-unit model whose gradients must equal the unsharded model's. Multi-rank behaviour is
// covered by the equivalence suite (tests/equivalence.cmake) and tests/zero.cmake.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <trainrun/strategy/sharding.hpp>
#include <trainrun/strategy/strategy_helpers.hpp>

#include <torch/types.h>
#include <torch/utils.h>
#include <torch/nn/functional.h>

#include <map>
#include <set>

#include "fake_communicator.hpp"
#include "strategies/zero/zero.hpp"

using namespace trainrun::v1;
using trainrun::v1::sharding::FlatLayout;
using trainrun::v1::sharding::ParamSpan;

namespace {

FlatLayout layout_of(const std::vector<std::vector<int64_t>>& shapes, int world) {
  std::vector<ParamSpan> spans;
  for (size_t i = 0; i < shapes.size(); ++i) spans.push_back({"p" + std::to_string(i), shapes[i], 0, 0});
  return FlatLayout(spans, world);
}

// Every element of every parameter is in exactly one rank's pieces, at the right place.
void check_cover(const FlatLayout& l) {
  std::map<size_t, std::vector<int>> seen;
  for (size_t i = 0; i < l.params().size(); ++i) seen[i].assign(static_cast<size_t>(l.params()[i].numel), 0);
  for (int r = 0; r < l.world_size(); ++r) {
    int64_t last_end = -1;
    for (const auto& pc : l.pieces(r)) {
      CHECK(pc.length > 0);
      CHECK(pc.shard_offset >= 0);
      CHECK(pc.shard_offset + pc.length <= l.shard_numel());
      CHECK(pc.shard_offset >= last_end);  // in order, not overlapping
      last_end = pc.shard_offset + pc.length;
      // Flat position agrees from both sides.
      CHECK(r * l.shard_numel() + pc.shard_offset == l.params()[pc.param].offset + pc.param_offset);
      for (int64_t k = 0; k < pc.length; ++k) ++seen[pc.param][static_cast<size_t>(pc.param_offset + k)];
    }
  }
  for (auto& [i, v] : seen)
    for (int c : v) CHECK(c == 1);
}

// A world of one (fake_communicator.hpp): collectives are copies. Enough to run the engine's
// code paths in-process.
using trainrun::test::FakeAccelerator;
using trainrun::test::FakeCommunicator;

// Two Linear units (each run through a Unit) and a head outside any unit, with a weight shared
// by the head and the first layer's input projection (a tied weight used at both ends).
struct TwoUnitNet : torch::nn::Module {
  TwoUnitNet() {
    emb = register_parameter("emb", torch::randn({8, 6}) * 0.3);
    l0 = register_module("l0", torch::nn::Linear(6, 6));
    l1 = register_module("l1", torch::nn::Linear(6, 6));
  }
  at::Tensor emb;
  torch::nn::Linear l0{nullptr}, l1{nullptr};
};

class TwoUnitModel : public Model {
 public:
  TwoUnitModel() : net(std::make_shared<TwoUnitNet>()) {
    units_.push_back(std::make_unique<Unit>("l0", net->l0.ptr()));
    units_.push_back(std::make_unique<Unit>("l1", net->l1.ptr()));
  }
  std::vector<NamedTensor> named_parameters() override {
    std::vector<NamedTensor> out;
    for (auto& p : net->named_parameters()) out.push_back({p.key(), p.value()});
    return out;
  }
  void train(bool) override {}
  ModelOutput forward(const Batch& b) override {
    at::Tensor x = torch::matmul(b.input, net->emb);  // [B, 6]
    x = units_[0]->run(x, [&](const at::Tensor& in) { return torch::tanh(net->l0(in)); });
    x = units_[1]->run(x, [&](const at::Tensor& in) { return torch::tanh(net->l1(in)); });
    at::Tensor logits = torch::matmul(x, net->emb.t());  // tied: [B, 8]
    ModelOutput o;
    o.loss_sum = torch::nn::functional::cross_entropy(
        logits, b.target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    o.num_correct = -1;
    return o;
  }
  std::vector<Unit*> units() override { return {units_[0].get(), units_[1].get()}; }
  torch::nn::Module* module() override { return net.get(); }
  std::string describe() const override { return "two units"; }
  std::shared_ptr<TwoUnitNet> net;
  std::vector<std::unique_ptr<Unit>> units_;
};

Batch make_batch() {
  torch::manual_seed(3);
  Batch b;
  b.input = torch::randn({5, 8});
  b.target = torch::randint(0, 8, {5}, torch::kLong);
  b.num_samples = 5;
  b.num_targets = 5;
  return b;
}

std::map<std::string, at::Tensor> reference_grads(int seed) {
  torch::manual_seed(seed);
  TwoUnitModel m;
  Batch b = make_batch();
  m.forward(b).loss_sum.backward();
  std::map<std::string, at::Tensor> g;
  for (auto& p : m.named_parameters()) g[p.name] = p.tensor.grad().clone();
  return g;
}

Options zero_options(int64_t stage, int64_t persistence) {
  std::map<std::string, OptionValue> v{{"stage", stage},
                                       {"reduce_bucket_size", int64_t{40}},
                                       {"prefetch_bucket_size", int64_t{0}},
                                       {"param_persistence_threshold", persistence},
                                       {"overlap_comm", true},
                                       {"memory_budget_gb", 0.0}};
  return Options(v, "[strategy] zero (test)");
}

}  // namespace

TEST_SUITE("sharding_layout") {
  TEST_CASE("sizes not divisible by world size are padded at the end") {
    FlatLayout l = layout_of({{3, 5}, {7}}, 4);  // 22 elements
    CHECK(l.numel() == 22);
    CHECK(l.shard_numel() == 6);
    CHECK(l.padded_numel() == 24);
    CHECK(l.padding() == 2);
    CHECK(l.params()[1].offset == 15);
    CHECK(l.owner(0) == 0);
    CHECK(l.owner(21) == 3);
    auto p3 = l.pieces(3);  // [18, 24): param 1 elements 3..6, then padding
    REQUIRE(p3.size() == 1);
    CHECK(p3[0].param == 1);
    CHECK(p3[0].param_offset == 3);
    CHECK(p3[0].shard_offset == 0);
    CHECK(p3[0].length == 4);
    check_cover(l);
  }
  TEST_CASE("parameters smaller than the world size, and ranks holding only padding") {
    FlatLayout l = layout_of({{1}, {2}}, 4);  // 3 elements over 4 ranks
    CHECK(l.shard_numel() == 1);
    CHECK(l.pieces(3).empty());
    CHECK(l.pieces(1).size() == 1);
    CHECK(l.pieces(1)[0].param == 1);
    check_cover(l);
    for (int w : {1, 2, 3, 4, 5, 7, 8}) check_cover(layout_of({{3, 3}, {1}, {5}, {2, 2, 2}, {4}}, w));
  }
  TEST_CASE("bad layouts are refused with the reason") {
    CHECK_THROWS_WITH_AS(layout_of({}, 2), doctest::Contains("no parameters"), Error);
    CHECK_THROWS_WITH_AS(layout_of({{0}}, 2), doctest::Contains("hold no element"), Error);
    CHECK_THROWS_WITH_AS(layout_of({{2}}, 0), doctest::Contains("world_size must be >= 1"), Error);
    CHECK_THROWS_WITH_AS(layout_of({{2}}, 2).pieces(2), doctest::Contains("rank 2 outside"), Error);
  }
  TEST_CASE("buckets by element count") {
    auto b = sharding::bucket_by_elements({10, 10, 50, 5, 5}, {4, 3, 2, 1, 0}, 20);
    REQUIRE(b.size() == 3);
    CHECK(b[0] == std::vector<size_t>{4, 3});
    CHECK(b[1] == std::vector<size_t>{2});  // larger than the cap: alone
    CHECK(b[2] == std::vector<size_t>{1, 0});
  }
}

TEST_SUITE("sharding_engine") {
  TEST_CASE("freeing storage keeps views attached; refilling serves them again") {
    at::Tensor full = torch::arange(12, torch::kFloat);
    at::Tensor view = full.narrow(0, 4, 4).view({2, 2});
    sharding::free_storage(full);
    CHECK(full.storage().nbytes() == 0);
    sharding::refill_storage(full);
    CHECK(full.storage().nbytes() == 48);
    full.copy_(torch::arange(12, torch::kFloat) * 2);
    CHECK(view[1][1].item<float>() == 14.0f);
  }
  TEST_CASE("a flat parameter: parameters view the full buffer, pieces alias the shard") {
    FakeCommunicator comm;
    at::Tensor a = torch::randn({3, 4}).requires_grad_(true);
    at::Tensor b = torch::randn({5}).requires_grad_(true);
    const at::Tensor a0 = a.detach().clone(), b0 = b.detach().clone();
    sharding::FlatParameter::Options o;
    o.name = "test";
    o.keep_full = false;
    sharding::FlatParameter f({{"a", a}, {"b", b}}, comm, o);
    CHECK_FALSE(f.materialized());
    f.gather();
    CHECK(torch::equal(a.detach(), a0));
    CHECK(torch::equal(b.detach(), b0));
    REQUIRE(f.optimizer_pieces().size() == 2);
    CHECK(f.optimizer_pieces()[0].name == "a");
    CHECK(f.optimizer_pieces()[1].tensor.numel() == 5);
    // Gradients: copied into the flat buffer, reduced, accumulated over micro-batches.
    a.mutable_grad() = torch::ones({3, 4});
    f.reduce_async();
    f.finish_reduce();
    CHECK_FALSE(a.grad().defined());
    a.mutable_grad() = torch::ones({3, 4});
    f.reduce_async();
    f.finish_reduce();
    CHECK(f.optimizer_pieces()[0].tensor.grad().sum().item<float>() == doctest::Approx(24.0));
    CHECK(f.optimizer_pieces()[1].tensor.grad().abs().sum().item<float>() == 0.0f);
    // A step on the piece reaches the parameter after the next gather.
    {
      torch::NoGradGuard ng;
      f.optimizer_pieces()[1].tensor.add_(1.0);
    }
    f.release();
    f.gather();
    CHECK(torch::allclose(b.detach(), b0 + 1));
    CHECK(sharding::global_grad_norm({&f}, comm) == doctest::Approx(std::sqrt(48.0)));  // 12 elements of 2
    f.zero_grad();
    CHECK(f.grad_shard().abs().sum().item<float>() == 0.0f);
  }
  TEST_CASE("mixed precision: bf16 parameters and gathers, float32 shard and gradient shard") {
    for (bool keep_full : {false, true}) {
      for (bool full_grads : {false, true}) {
        CAPTURE(keep_full);
        CAPTURE(full_grads);
        FakeCommunicator comm;
        at::Tensor a = (torch::randn({3, 4}) * 3).requires_grad_(true);
        const at::Tensor a0 = a.detach().clone();
        sharding::FlatParameter::Options o;
        o.name = "mp";
        o.keep_full = keep_full;
        o.full_grads = full_grads;
        o.param_dtype = at::kBFloat16;
        o.reduce_dtype = at::kFloat;
        sharding::FlatParameter f({{"a", a}}, comm, o);
        f.gather();
        // The model computes with bf16 values rounded from the float32 master shard, which keeps
        // the exact values.
        CHECK((a.scalar_type() == at::kBFloat16));
        CHECK((f.shard().scalar_type() == at::kFloat));
        CHECK(torch::equal(f.shard().narrow(0, 0, 12), a0.reshape({-1})));
        CHECK(torch::equal(a.detach(), a0.to(at::kBFloat16)));
        CHECK(f.param_element_bytes() == 2);
        // A bf16 gradient lands, summed over two micro-batches, in the float32 gradient shard.
        for (int mb = 0; mb < 2; ++mb) {
          at::Tensor g = torch::full({3, 4}, 0.5, at::kBFloat16);
          if (full_grads)
            a.mutable_grad().add_(g);
          else
            a.mutable_grad() = g;
          if (!full_grads || mb == 1) {
            f.reduce_async();
            f.finish_reduce();
          }
        }
        CHECK((f.grad_shard().scalar_type() == at::kFloat));
        CHECK(f.grad_shard().sum().item<float>() == doctest::Approx(12.0));
        // An update too small for bf16 still accumulates in the master shard.
        {
          torch::NoGradGuard ng;
          for (int k = 0; k < 64; ++k) f.optimizer_pieces()[0].tensor.add_(1e-4);
        }
        CHECK(torch::allclose(f.shard().narrow(0, 0, 12), a0.reshape({-1}) + 64e-4, 0, 1e-5));
        f.after_step_async();
        f.release();
        f.gather();
        CHECK(torch::equal(a.detach().reshape({-1}), f.shard().narrow(0, 0, 12).to(at::kBFloat16)));
      }
    }
  }
}

TEST_SUITE("sharding_plan") {
  using trainrun::v1::sharding::GroupSpec;
  using trainrun::v1::sharding::plan_groups;
  using trainrun::v1::sharding::RuntimeOptions;

  std::vector<std::vector<size_t>> params_of(const std::vector<GroupSpec>& specs) {
    std::vector<std::vector<size_t>> out;
    for (const auto& s : specs) out.push_back(s.params);
    return out;
  }

  TEST_CASE("buckets: reverse registration order, bucket_elements each") {
    RuntimeOptions o;
    o.grouping = RuntimeOptions::Grouping::Buckets;
    o.bucket_elements = 10;
    // Reverse order 3, 2, 1, 0: 20 alone (over the cap), then 4 + 4, then 4 (4 + 4 + 4 > 10).
    const auto specs = plan_groups({4, 4, 4, 20}, {}, {}, o);
    REQUIRE(specs.size() == 3);
    CHECK(params_of(specs) == std::vector<std::vector<size_t>>{{3}, {2, 1}, {0}});
    CHECK(specs[0].label == "bucket 0");
    CHECK(specs[2].label == "bucket 2");
    CHECK((specs[0].keep && !specs[0].root && specs[0].first_unit == -1));
  }

  TEST_CASE("units: one group per unit, last unit first, then root and persistent") {
    RuntimeOptions o;
    o.persistence_threshold = 3;
    // 0, 1 in unit a; 2 in unit b; 3 used by both (tied) -> root; 4 in no unit -> root;
    // 5 below the threshold -> persistent, whatever unit it is in.
    const auto specs = plan_groups({10, 10, 10, 10, 10, 2}, {0, 0, 1, -2, -1, 1}, {"a", "b"}, o);
    REQUIRE(specs.size() == 4);
    CHECK(params_of(specs) == std::vector<std::vector<size_t>>{{2}, {0, 1}, {3, 4}, {5}});
    CHECK(specs[0].label == "unit b");
    CHECK((specs[0].first_unit == 1 && specs[0].last_unit == 1 && !specs[0].keep));
    CHECK(specs[1].label == "unit a");
    CHECK((specs[2].label == "root group" && specs[2].root && !specs[2].keep));
    CHECK((specs[3].label == "persistent group" && specs[3].keep && !specs[3].root));
  }

  TEST_CASE("units smaller than min_unit_params merge with the next ones (forward order)") {
    RuntimeOptions o;
    o.min_unit_params = 15;
    o.keep_full = true;  // NO_SHARD: every group stays gathered
    const auto specs = plan_groups({10, 10, 10}, {0, 1, 2}, {"a", "b", "c"}, o);
    // a + b reach 20 >= 15; c alone (10) is what is left and still gets its group.
    REQUIRE(specs.size() == 2);
    CHECK(params_of(specs) == std::vector<std::vector<size_t>>{{2}, {0, 1}});
    CHECK(specs[0].label == "unit c");
    CHECK(specs[1].label == "units a..b");
    CHECK((specs[1].first_unit == 0 && specs[1].last_unit == 1));
    CHECK((specs[0].keep && specs[1].keep));
  }

  TEST_CASE("an owner list of the wrong length is refused") {
    RuntimeOptions o;
    CHECK_THROWS_AS(plan_groups({1, 2}, {0}, {"a"}, o), trainrun::v1::Error);
  }
}

TEST_SUITE("zero_strategy") {
  TEST_CASE("stage 3 frees unit parameters between uses and keeps the unsharded gradients") {
    for (int64_t persistence : {int64_t{0}, int64_t{10}}) {
      CAPTURE(persistence);
      const auto ref = reference_grads(5);
      torch::manual_seed(5);
      TwoUnitModel model;
      FakeAccelerator acc;
      RunContext ctx;
      trainrun::plugins::ZeroStrategy zero(zero_options(3, persistence), ctx);
      TrainPlan plan;
      zero.setup(model, acc, plan);
      CHECK(zero.stage() == 3);
      // Between uses, only shards remain: the unit weights hold no memory.
      CHECK(model.net->l0->weight.storage().nbytes() == 0);
      Batch b = make_batch();
      zero.before_backward(true);
      ModelOutput out = zero.forward(b);
      CHECK(model.net->l1->weight.storage().nbytes() == 0);  // released after its forward
      out.loss_sum.backward();
      zero.finish_gradient_sync();
      CHECK(model.net->l0->weight.storage().nbytes() == 0);
      CHECK(model.net->emb.storage().nbytes() == 0);  // root released when backward is done
      std::set<std::string> names;
      for (const auto& p : zero.optimizer_parameters()) {
        names.insert(p.name);
        CHECK(p.tensor.dim() == 1);
      }
      CHECK(names == std::set<std::string>{"emb", "l0.weight", "l0.bias", "l1.weight", "l1.bias"});
      // The gathered full state and the gradients equal the unsharded model's.
      std::map<std::string, at::Tensor> full;
      for (auto& p : zero.full_state_dict()) full[p.name] = p.tensor;
      CHECK(full.at("l1.weight").sizes() == at::IntArrayRef({6, 6}));
      for (const auto& p : zero.optimizer_parameters()) {
        CAPTURE(p.name);
        CHECK(torch::allclose(p.tensor.grad(), ref.at(p.name).reshape({-1}), 1e-6, 1e-7));
      }
      double ref_norm = 0;
      for (auto& [n, g] : ref) ref_norm += g.pow(2).sum().item<double>();
      CHECK(zero.grad_norm() == doctest::Approx(std::sqrt(ref_norm)).epsilon(1e-6));
    }
  }
  TEST_CASE("stage 3 shards frozen parameters (any dtype) as raw bytes with their unit") {
    // l0: frozen float weight beside a trainable bias (frozen bytes ride with the unit's flat
    // parameter); l1: nothing trainable, plus a uint8 tensor (packed-weight stand-in) that the
    // forward reads, so a unit with only frozen parameters is gathered on its own.
    auto make = [](TwoUnitModel& m) {
      torch::NoGradGuard ng;
      m.net->l0->weight.requires_grad_(false);
      m.net->l1->weight.requires_grad_(false);
      m.net->l1->bias.requires_grad_(false);
      m.net->l1->register_parameter("codes", torch::arange(0, 203, torch::kLong).to(torch::kByte),
                                    /*requires_grad=*/false);
    };
    struct CodesModel : TwoUnitModel {
      ModelOutput forward(const Batch& b) override {
        at::Tensor x = torch::matmul(b.input, net->emb);
        x = units_[0]->run(x, [&](const at::Tensor& in) { return torch::tanh(net->l0(in)); });
        x = units_[1]->run(x, [&](const at::Tensor& in) {
          const at::Tensor codes = net->l1->named_parameters()["codes"];
          return torch::tanh(net->l1(in)) + codes.to(torch::kFloat).mean() / 255.0;
        });
        ModelOutput o;
        o.loss_sum = torch::nn::functional::cross_entropy(
            torch::matmul(x, net->emb.t()), b.target,
            torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
        return o;
      }
    };
    torch::manual_seed(7);
    CodesModel ref;
    make(ref);
    const at::Tensor ref_loss = ref.forward(make_batch()).loss_sum;
    ref_loss.backward();
    torch::manual_seed(7);
    CodesModel model;
    make(model);
    const at::Tensor w0 = model.net->l0->weight.detach().clone();
    FakeAccelerator acc;
    RunContext ctx;
    trainrun::plugins::ZeroStrategy zero(zero_options(3, 0), ctx);
    TrainPlan plan;
    zero.setup(model, acc, plan);
    const at::Tensor codes = model.net->l1->named_parameters()["codes"];
    CHECK(codes.storage().nbytes() == 0);
    CHECK(model.net->l0->weight.storage().nbytes() == 0);
    std::set<std::string> names;
    for (const auto& p : zero.optimizer_parameters()) names.insert(p.name);
    CHECK(names == std::set<std::string>{"emb", "l0.bias"});
    zero.before_backward(true);
    ModelOutput out = zero.forward(make_batch());
    CHECK(codes.storage().nbytes() == 0);  // released after its unit's forward
    CHECK(out.loss_sum.item<float>() == doctest::Approx(ref_loss.item<float>()).epsilon(1e-6));
    out.loss_sum.backward();
    zero.finish_gradient_sync();
    CHECK(codes.storage().nbytes() == 0);
    CHECK(model.net->l0->weight.storage().nbytes() == 0);
    for (const auto& p : zero.optimizer_parameters()) {
      CAPTURE(p.name);
      const at::Tensor g = p.name == "emb" ? ref.net->emb.grad() : ref.net->l0->bias.grad();
      CHECK(torch::allclose(p.tensor.grad(), g.reshape({-1}), 1e-6, 1e-7));
    }
    std::map<std::string, at::Tensor> full;
    for (auto& p : zero.full_state_dict()) full[p.name] = p.tensor;
    CHECK((full.at("l1.codes").scalar_type() == at::kByte));
    CHECK(torch::equal(full.at("l1.codes"), torch::arange(0, 203, torch::kLong).to(torch::kByte)));
    CHECK(torch::equal(full.at("l0.weight"), w0));
    bool seen = false;
    for (auto& p : zero.sharded_state_dict())
      if (p.name == "l1.codes") {
        seen = true;
        CHECK(p.offset == 0);
        CHECK(torch::equal(p.data, torch::arange(0, 203, torch::kLong).to(torch::kByte)));
      }
    CHECK(seen);
    {
      torch::NoGradGuard ng;  // evaluation gathers and releases too
      zero.forward(make_batch());
    }
    CHECK(codes.storage().nbytes() == 0);
  }
  TEST_CASE("frozen flat: byte shards over several ranks hold whole elements") {
    // Layout arithmetic only (a FakeCommunicator of 3 would gather copies of this rank's shard,
    // not the others'): offsets aligned to 16, shard a multiple of 16, each tensor's bytes once.
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{37}, int64_t{203}}) {
      CAPTURE(n);
      FakeCommunicator comm;
      at::Tensor a = torch::arange(n, torch::kFloat);
      at::Tensor b = torch::arange(n + 3, torch::kLong).to(torch::kByte);
      sharding::FrozenFlat f({{"a", a}, {"b", b}}, comm, "frozen");
      CHECK(f.spans()[1].byte_offset % sharding::FrozenFlat::kAlign == 0);
      CHECK(f.shard_bytes() % sharding::FrozenFlat::kAlign == 0);
      CHECK(f.padded_bytes() >= f.spans()[1].byte_offset + n + 3);
      f.gather();
      CHECK(torch::equal(a, torch::arange(n, torch::kFloat)));
      CHECK(torch::equal(b, torch::arange(n + 3, torch::kLong).to(torch::kByte)));
      auto [first, piece] = f.local_piece(0);
      CHECK(first == 0);
      CHECK(torch::equal(piece, torch::arange(n, torch::kFloat)));
      f.release();
      CHECK_FALSE(f.materialized());
    }
  }
  TEST_CASE("stage 1 accumulates in the full gradient buffer; stages 1 and 2 agree") {
    const auto ref = reference_grads(7);
    for (int64_t stage : {int64_t{1}, int64_t{2}}) {
      CAPTURE(stage);
      torch::manual_seed(7);
      TwoUnitModel model;
      FakeAccelerator acc;
      RunContext ctx;
      trainrun::plugins::ZeroStrategy zero(zero_options(stage, 0), ctx);
      zero.setup(model, acc, TrainPlan{});
      Batch b = make_batch();
      // Two micro-batches of the same data: the accumulated gradient is twice the reference.
      for (bool sync : {false, true}) {
        zero.before_backward(sync);
        zero.forward(b).loss_sum.backward();
      }
      zero.finish_gradient_sync();
      for (const auto& p : zero.optimizer_parameters()) {
        CAPTURE(p.name);
        CHECK(torch::allclose(p.tensor.grad(), 2 * ref.at(p.name).reshape({-1}), 1e-6, 1e-7));
      }
      // Stage 1 communicates once per step, stage 2 once per micro-batch (buckets of 40
      // elements: each of these 5 parameters fills one, none pairs under the cap).
      CHECK(acc.comm.count("reduce_scatter") == (stage == 1 ? 5 : 10));
      if (stage == 1)
        CHECK(model.net->l0->weight.grad().defined());  // whole gradients kept (views)
      else
        CHECK_FALSE(model.net->l0->weight.grad().defined());  // freed once sent
    }
  }
  TEST_CASE("stage auto picks the lowest stage that fits, or names the world size that would") {
    torch::manual_seed(1);
    TwoUnitModel model;  // 48 + 2 * 42 = 132 parameters
    FakeAccelerator acc;
    RunContext ctx;
    MemoryInputs in;
    in.optimizer_bytes = 8;  // Adam: 16 bytes per parameter in fp32 = 2112 bytes
    in.memory_budget_bytes = 5000;
    {
      trainrun::plugins::ZeroStrategy zero(zero_options(kAuto, 0), ctx);
      zero.set_memory_inputs(in);
      zero.setup(model, acc, TrainPlan{});
      CHECK(zero.stage() == 1);
    }
    in.memory_budget_bytes = 1000;
    TwoUnitModel model2;
    trainrun::plugins::ZeroStrategy zero2(zero_options(kAuto, 0), ctx);
    zero2.set_memory_inputs(in);
    // Stage 3 at world N: 2112 / N of model state + 328 B of buffers (a 40-element reduce
    // bucket and one gathered 42-parameter unit): 1032 B at N = 3, 856 B at N = 4.
    CHECK_THROWS_WITH_AS(zero2.setup(model2, acc, TrainPlan{}),
                         doctest::Contains("a world size of at least 4 would fit"), ConfigError);
  }
}
