// Unit tests of the policy plugins: optim (sgd, adamw, schedules), cpu (accelerator and local
// communicator), single (strategy), precision (fp32) and callbacks (metrics, progress).
// The plugins' component objects (not their entry symbols) are linked into this binary.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <torch/types.h>
#include <torch/utils.h>
#include <torch/optim.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "callbacks/callbacks/callbacks.hpp"
#include "test_options.hpp"
#include "accelerators/cpu/cpu.hpp"
#include "optimizers/optim/optim.hpp"
#include "precisions/precision/precision.hpp"
#include "strategies/single/single.hpp"

namespace fs = std::filesystem;
using namespace trainrun::v1;
using namespace trainrun::plugins;

namespace {

using trainrun::test::make_options;

RunContext make_ctx(int rank = 0, int world_size = 1, const std::string& run_dir = {}) {
  RunContext ctx;
  ctx.rank = rank;
  ctx.world_size = world_size;
  ctx.run_dir = run_dir;
  return ctx;
}

TrainPlan make_plan(int64_t total_steps) {
  TrainPlan plan;
  plan.total_steps = total_steps;
  plan.steps_per_epoch = total_steps;
  return plan;
}

// A weight matrix (decayed under no_decay_1d) and a bias vector (not decayed), with gradients
// drawn from a fixed seed. On `skip_step` the bias has no gradient, to check that both ours and
// torch's skip it (and do not advance its step count).
struct Fixture {
  at::Tensor w, b;
  std::vector<std::pair<at::Tensor, at::Tensor>> grads;
  int64_t skip_step = 2;

  explicit Fixture(int steps) {
    torch::manual_seed(1234);
    w = torch::randn({3, 4});
    b = torch::randn({3});
    for (int i = 0; i < steps; ++i) grads.emplace_back(torch::randn({3, 4}), torch::randn({3}));
  }
  // Fresh leaves with the same values, one copy per optimizer under test.
  std::pair<at::Tensor, at::Tensor> leaves() const {
    return {w.clone().requires_grad_(true), b.clone().requires_grad_(true)};
  }
  void set_grads(int64_t step, at::Tensor& pw, at::Tensor& pb) const {
    pw.mutable_grad() = grads[step].first.clone();
    pb.mutable_grad() = step == skip_step ? at::Tensor() : grads[step].second.clone();
  }
};

void check_close(const at::Tensor& ours, const at::Tensor& ref, const char* what) {
  INFO(std::string(what) << ": max |diff| = " << (ours - ref).abs().max().item<double>());
  CHECK(torch::allclose(ours, ref, /*rtol=*/1e-6, /*atol=*/1e-7));
}

// Runs `ours` and torch::optim `ref` over the fixture's gradients; `ref_lr(step)` lets the test
// drive torch's learning rate per step, as a PyTorch LR scheduler would.
// `lr_at` is the learning rate the test expects at each 0-based step, stated by the test itself
// (not read from the optimizer under test): torch steps with it, and ours must report it too.
template <class RefOptimizer, class RefOptions>
void compare_with_torch(Optimizer& ours, RefOptimizer& ref, at::Tensor& ow, at::Tensor& ob,
                        at::Tensor& rw, at::Tensor& rb, const Fixture& fx, int steps,
                        const std::function<double(int64_t)>& lr_at) {
  for (int64_t s = 0; s < steps; ++s) {
    CHECK(ours.lr(s) == doctest::Approx(lr_at(s)).epsilon(1e-12));
    for (auto& group : ref.param_groups())
      static_cast<RefOptions&>(group.options()).lr(lr_at(s));
    fx.set_grads(s, ow, ob);
    fx.set_grads(s, rw, rb);
    ours.step(s);
    ref.step();
  }
  check_close(ow, rw, "weight");
  check_close(ob, rb, "bias");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST_SUITE("optim") {
  struct SgdCase {
    const char* name;
    double momentum, dampening, weight_decay;
    bool nesterov;
  };

  TEST_CASE("sgd matches torch::optim::SGD") {
    const SgdCase cases[] = {
        {"plain", 0.0, 0.0, 0.0, false},
        {"momentum", 0.9, 0.0, 0.0, false},
        {"momentum+dampening", 0.9, 0.3, 0.0, false},
        {"nesterov", 0.9, 0.0, 0.0, true},
        {"weight_decay", 0.0, 0.0, 0.1, false},
        {"nesterov+weight_decay", 0.8, 0.0, 0.05, true},
    };
    const int steps = 6;
    Fixture fx(steps);
    for (const auto& c : cases) {
      SUBCASE(c.name) {
        auto [ow, ob] = fx.leaves();
        auto [rw, rb] = fx.leaves();
        Sgd ours(make_options<Sgd>({{"lr", 0.1},
                                    {"momentum", c.momentum},
                                    {"dampening", c.dampening},
                                    {"weight_decay", c.weight_decay},
                                    {"nesterov", c.nesterov}}),
                 make_ctx());
        ours.init({{"w", ow}, {"b", ob}}, make_plan(steps));
        torch::optim::SGD ref({rw, rb}, torch::optim::SGDOptions(0.1)
                                            .momentum(c.momentum)
                                            .dampening(c.dampening)
                                            .weight_decay(c.weight_decay)
                                            .nesterov(c.nesterov));
        compare_with_torch<torch::optim::SGD, torch::optim::SGDOptions>(
            ours, ref, ow, ob, rw, rb, fx, steps, [](int64_t) { return 0.1; });
        if (c.momentum != 0) {
          const auto st = ours.state();
          REQUIRE(st.size() == 4);
          CHECK(st[0].name == "w.momentum_buffer");
          CHECK(st[1].name == "w.step");
          CHECK(st[1].tensor.item<int64_t>() == steps);
          CHECK(st[3].tensor.item<int64_t>() == steps - 1);  // bias skipped once
        } else {
          CHECK(ours.state().empty());
        }
      }
    }
  }

  TEST_CASE("sgd rejects nesterov without momentum, and lr is required") {
    CHECK_THROWS_AS(Sgd(make_options<Sgd>({{"lr", 0.1}, {"nesterov", true}}), make_ctx()),
                    ConfigError);
    OptionSchema schema;
    Sgd::declare_options(schema);
    REQUIRE(schema.find("lr") != nullptr);
    CHECK(schema.find("lr")->required);
  }

  TEST_CASE("adamw matches torch::optim::AdamW") {
    const int steps = 7;
    Fixture fx(steps);
    for (const bool no_decay_1d : {true, false}) {
      SUBCASE(no_decay_1d ? "no_decay_1d" : "decay all") {
        auto [ow, ob] = fx.leaves();
        auto [rw, rb] = fx.leaves();
        AdamW ours(make_options<AdamW>({{"lr", 0.01},
                                        {"beta1", 0.8},
                                        {"beta2", 0.95},
                                        {"eps", 1e-6},
                                        {"weight_decay", 0.1},
                                        {"no_decay_1d", no_decay_1d}}),
                   make_ctx());
        ours.init({{"w", ow}, {"b", ob}}, make_plan(steps));
        auto opts = torch::optim::AdamWOptions(0.01)
                        .betas(std::make_tuple(0.8, 0.95))
                        .eps(1e-6)
                        .weight_decay(0.1);
        // The reference for no_decay_1d is the usual two parameter groups.
        std::vector<torch::optim::OptimizerParamGroup> groups;
        groups.emplace_back(std::vector<at::Tensor>{rw});
        groups.emplace_back(std::vector<at::Tensor>{rb},
                            std::make_unique<torch::optim::AdamWOptions>(
                                torch::optim::AdamWOptions(opts).weight_decay(
                                    no_decay_1d ? 0.0 : 0.1)));
        torch::optim::AdamW ref(std::move(groups), opts);
        compare_with_torch<torch::optim::AdamW, torch::optim::AdamWOptions>(
            ours, ref, ow, ob, rw, rb, fx, steps, [](int64_t) { return 0.01; });

        const auto st = ours.state();
        REQUIRE(st.size() == 6);
        CHECK(st[0].name == "w.exp_avg");
        CHECK(st[1].name == "w.exp_avg_sq");
        CHECK(st[2].name == "w.step");
        CHECK(st[5].name == "b.step");
        CHECK(st[2].tensor.item<int64_t>() == steps);
        CHECK(st[5].tensor.item<int64_t>() == steps - 1);
        // torch::optim keys its state by the TensorImpl's address: as a string up to 1.13, as
        // the pointer itself from 2.0.
#if TORCH_VERSION_MAJOR >= 2
        const auto ref_key = rw.unsafeGetTensorImpl();
#else
        const auto ref_key = c10::guts::to_string(rw.unsafeGetTensorImpl());
#endif
        auto& ref_state =
            static_cast<torch::optim::AdamWParamState&>(*ref.state().at(ref_key));
        check_close(st[0].tensor, ref_state.exp_avg(), "w.exp_avg");
        check_close(st[1].tensor, ref_state.exp_avg_sq(), "w.exp_avg_sq");
      }
    }
  }

  TEST_CASE("adamw with a cosine schedule matches torch with the lr set per step") {
    const int steps = 9;
    Fixture fx(steps);
    auto [ow, ob] = fx.leaves();
    auto [rw, rb] = fx.leaves();
    AdamW ours(make_options<AdamW>({{"lr", 0.05},
                                    {"schedule", std::string("cosine")},
                                    {"warmup_steps", int64_t{3}},
                                    {"min_lr", 0.005}}),
               make_ctx());
    ours.init({{"w", ow}, {"b", ob}}, make_plan(steps));
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>{rw});
    groups.emplace_back(std::vector<at::Tensor>{rb},
                        std::make_unique<torch::optim::AdamWOptions>(
                            torch::optim::AdamWOptions(0.05).weight_decay(0.0)));
    torch::optim::AdamW ref(std::move(groups), torch::optim::AdamWOptions(0.05));
    // Warm-up (s + 1) / 3 of the peak on steps 0-2, then PyTorch's CosineAnnealingLR closed
    // form with T_max = 9 - 3 and eta_min = 0.005 from step 3 (lr_schedule.hpp's contract).
    const auto lr_at = [](int64_t s) {
      if (s < 3) return 0.05 * static_cast<double>(s + 1) / 3.0;
      const double pi = std::acos(-1.0);
      return 0.005 + (0.05 - 0.005) * (1.0 + std::cos(pi * static_cast<double>(s - 3) / 6.0)) / 2.0;
    };
    compare_with_torch<torch::optim::AdamW, torch::optim::AdamWOptions>(ours, ref, ow, ob, rw,
                                                                         rb, fx, steps, lr_at);
  }

  TEST_CASE("parameters without requires_grad-produced grads are left untouched") {
    at::Tensor frozen = torch::ones({2, 2});
    at::Tensor before = frozen.clone();
    AdamW opt(make_options<AdamW>(), make_ctx());
    opt.init({{"frozen", frozen}}, make_plan(1));
    opt.step(0);
    CHECK(torch::equal(frozen, before));
    CHECK(opt.state()[2].tensor.item<int64_t>() == 0);
  }

  TEST_CASE("misuse is reported") {
    AdamW opt(make_options<AdamW>(), make_ctx());
    CHECK_THROWS_WITH_AS(opt.step(0), doctest::Contains("before init"), Error);
    at::Tensor p = torch::zeros({2}, torch::requires_grad());
    CHECK_THROWS_WITH_AS(opt.init({{"p", p}, {"p", p}}, make_plan(1)),
                         doctest::Contains("given twice"), Error);
    CHECK_THROWS_AS(AdamW(make_options<AdamW>({{"beta1", 1.0}}), make_ctx()), ConfigError);
  }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("schedule") {
  LrSchedule make(LrDecay decay) {
    LrSchedule s;
    s.lr = 1.0;
    s.min_lr = 0.1;
    s.warmup_steps = 10;
    s.total_steps = 110;
    s.decay = decay;
    return s;
  }

  TEST_CASE("warm-up ramps linearly from 0 to lr") {
    for (auto decay : {LrDecay::Constant, LrDecay::Cosine, LrDecay::Linear}) {
      const auto s = make(decay);
      CHECK(s.at(0) == doctest::Approx(0.1));
      CHECK(s.at(4) == doctest::Approx(0.5));
      CHECK(s.at(9) == doctest::Approx(1.0));
      CHECK(s.at(10) == doctest::Approx(1.0));  // decay starts at the peak
    }
  }

  TEST_CASE("constant stays at lr after warm-up") {
    const auto s = make(LrDecay::Constant);
    CHECK(s.at(60) == doctest::Approx(1.0));
    CHECK(s.at(110) == doctest::Approx(1.0));
  }

  TEST_CASE("cosine: midpoint, quarter, end = min_lr") {
    const auto s = make(LrDecay::Cosine);
    CHECK(s.at(60) == doctest::Approx(0.55));  // p = 0.5: (lr + min_lr) / 2
    CHECK(s.at(35) == doctest::Approx(0.1 + 0.9 * (1 + std::cos(M_PI / 4)) / 2));
    CHECK(s.at(110) == doctest::Approx(0.1));
    CHECK(s.at(500) == doctest::Approx(0.1));
    CHECK(s.at(109) > 0.1);
  }

  TEST_CASE("linear: midpoint, quarter, end = min_lr") {
    const auto s = make(LrDecay::Linear);
    CHECK(s.at(60) == doctest::Approx(0.55));
    CHECK(s.at(35) == doctest::Approx(0.775));
    CHECK(s.at(110) == doctest::Approx(0.1));
  }

  TEST_CASE("optimizer options drive the schedule") {
    Sgd opt(make_options<Sgd>({{"lr", 0.5},
                               {"schedule", std::string("linear")},
                               {"warmup_steps", int64_t{0}},
                               {"min_lr", 0.0}}),
            make_ctx());
    opt.init({}, make_plan(100));
    CHECK(opt.lr(0) == doctest::Approx(0.5));
    CHECK(opt.lr(50) == doctest::Approx(0.25));
    CHECK(opt.lr(100) == doctest::Approx(0.0));
  }

  TEST_CASE("invalid schedules are configuration errors") {
    CHECK_THROWS_AS(AdamW(make_options<AdamW>({{"lr", 0.01},
                                               {"schedule", std::string("cosine")},
                                               {"min_lr", 0.1}}),
                          make_ctx()),
                    ConfigError);
    AdamW opt(make_options<AdamW>({{"schedule", std::string("cosine")}}), make_ctx());
    CHECK_THROWS_WITH_AS(opt.init({}, make_plan(0)), doctest::Contains("total_steps"),
                         ConfigError);
    CHECK_THROWS_AS(parse_lr_decay("step"), ConfigError);
  }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("cpu") {
  TEST_CASE("accelerator: device, threads, describe") {
    CpuAccelerator acc(make_options<CpuAccelerator>({{"threads", int64_t{2}}}), make_ctx());
    CHECK(acc.device() == c10::Device(c10::kCPU));
    CHECK(at::get_num_threads() == 2);
    CHECK(acc.describe().rfind("cpu, 2 threads (threads = 2), BLAS 1 thread", 0) == 0);
    CHECK(trainrun::v1::cpu::blas_info().threads == 1);  // blas_threads = "auto"
    CHECK(acc.memory_stats().current_bytes == -1);
    // A second accelerator must not fail on the once-per-process inter-op setting.
    CpuAccelerator again(make_options<CpuAccelerator>({{"threads", int64_t{1}}}), make_ctx());
    CHECK(again.describe().rfind("cpu, 1 thread (threads = 1), BLAS 1 thread", 0) == 0);
    Communicator& comm = acc.communicator();
    CHECK(comm.rank() == 0);
    CHECK(comm.world_size() == 1);
    CHECK(comm.backend() == "local");
  }

  TEST_CASE("all_reduce and broadcast over one rank leave the tensor unchanged") {
    LocalCommunicator comm(600);
    at::Tensor t = torch::arange(6, torch::kFloat32).reshape({2, 3});
    const at::Tensor orig = t.clone();
    for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max}) {
      AllReduceOptions o;
      o.op = op;
      auto work = comm.all_reduce(t, o);
      CHECK(work->completed());
      work->wait();
      CHECK(torch::equal(t, orig));
    }
    at::Tensor i = torch::arange(5, torch::kInt64);
    AllReduceOptions avg;
    avg.op = ReduceOp::Avg;
    comm.all_reduce(i, avg)->wait();
    CHECK(torch::equal(i, torch::arange(5, torch::kInt64)));
    comm.broadcast(t)->wait();
    CHECK(torch::equal(t, orig));
    BroadcastOptions root1;
    root1.root = 1;
    CHECK_THROWS_WITH_AS(comm.broadcast(t, root1), doctest::Contains("root 1"), Error);
    comm.barrier()->wait();
  }

  TEST_CASE("all_gather and reduce_scatter copy input to output") {
    LocalCommunicator comm(600);
    at::Tensor in = torch::arange(8, torch::kFloat32);
    at::Tensor out = torch::zeros({8});
    comm.all_gather(in, out)->wait();
    CHECK(torch::equal(in, out));
    at::Tensor out2 = torch::zeros({2, 4});
    ReduceScatterOptions avg;
    avg.op = ReduceOp::Avg;
    comm.reduce_scatter(in, out2, avg)->wait();
    CHECK(torch::equal(out2.view(-1), in));
  }

  TEST_CASE("precondition violations name the problem") {
    LocalCommunicator comm(600);
    at::Tensor in = torch::arange(8, torch::kFloat32);
    at::Tensor small = torch::zeros({4});
    CHECK_THROWS_WITH_AS(comm.all_gather(in, small), doctest::Contains("8 elements"), Error);
    CHECK_THROWS_WITH_AS(comm.reduce_scatter(in, small), doctest::Contains("world_size"), Error);
    at::Tensor wrong_dtype = torch::zeros({8}, torch::kFloat64);
    CHECK_THROWS_WITH_AS(comm.all_gather(in, wrong_dtype), doctest::Contains("dtype"), Error);
    at::Tensor strided = torch::zeros({4, 4}).t();
    CHECK_THROWS_WITH_AS(comm.all_reduce(strided), doctest::Contains("contiguous"), Error);
    at::Tensor undefined;
    CHECK_THROWS_WITH_AS(comm.all_reduce(undefined), doctest::Contains("undefined"), Error);
  }

  TEST_CASE("send/recv have no peer; new_group only of rank 0") {
    LocalCommunicator comm(600);
    at::Tensor t = torch::zeros({2});
    PointToPointOptions p2p;
    p2p.peer = 1;
    CHECK_THROWS_WITH_AS(comm.send(t, p2p), doctest::Contains("no peer"), Error);
    CHECK_THROWS_WITH_AS(comm.recv(t, p2p), doctest::Contains("no peer"), Error);
    auto sub = comm.new_group({0});
    REQUIRE(sub != nullptr);
    CHECK(sub->world_size() == 1);
    CHECK(sub->backend() == "local");
    CHECK_THROWS_AS(comm.new_group({0, 1}), Error);
    CHECK_THROWS_AS(comm.new_group({}), Error);
  }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("single") {
  // y = Linear(x); loss_sum = sum of squared error; a buffer to check full_state_dict.
  struct TinyNet : torch::nn::Module {
    torch::nn::Linear fc{nullptr};
    at::Tensor counter;
    TinyNet() {
      fc = register_module("fc", torch::nn::Linear(4, 2));
      counter = register_buffer("counter", torch::zeros({1}));
    }
  };
  class TinyModel final : public Model {
   public:
    std::shared_ptr<TinyNet> net = std::make_shared<TinyNet>();
    std::vector<NamedTensor> named_parameters() override {
      std::vector<NamedTensor> out;
      for (auto& p : net->named_parameters()) out.push_back({p.key(), p.value()});
      return out;
    }
    std::vector<NamedTensor> named_buffers() override {
      std::vector<NamedTensor> out;
      for (auto& b : net->named_buffers()) out.push_back({b.key(), b.value()});
      return out;
    }
    void train(bool on) override { net->train(on); }
    ModelOutput forward(const Batch& b) override {
      return {(net->fc(b.input) - b.target).pow(2).sum(), -1};
    }
    torch::nn::Module* module() override { return net.get(); }
    std::string describe() const override { return "tiny"; }
  };

  TEST_CASE("setup, forward, grad_norm, zero_grad, state dict") {
    torch::manual_seed(7);
    TinyModel model;
    model.net->fc->bias.set_requires_grad(false);  // a frozen parameter (as after LoRA)
    CpuAccelerator acc(make_options<CpuAccelerator>(), make_ctx());
    SingleStrategy strategy(make_options<SingleStrategy>(), make_ctx());
    CHECK_THROWS_WITH_AS(strategy.forward({}), doctest::Contains("before setup"), Error);
    strategy.setup(model, acc, make_plan(1));

    const auto params = strategy.optimizer_parameters();
    REQUIRE(params.size() == 1);
    CHECK(params[0].name == "fc.weight");

    Batch batch;
    batch.input = torch::randn({5, 4});
    batch.target = torch::randn({5, 2});
    batch.num_samples = 5;
    ModelOutput out = strategy.forward(batch);
    out.loss_sum.backward();
    strategy.finish_gradient_sync();
    const at::Tensor g = model.net->fc->weight.grad();
    REQUIRE(g.defined());
    CHECK(strategy.grad_norm() ==
          doctest::Approx(std::sqrt(g.to(torch::kDouble).pow(2).sum().item<double>())));

    strategy.zero_grad();
    CHECK_FALSE(model.net->fc->weight.grad().defined());
    CHECK(strategy.grad_norm() == 0.0);

    const auto sd = strategy.full_state_dict();
    std::vector<std::string> names;
    for (const auto& t : sd) names.push_back(t.name);
    CHECK(names == std::vector<std::string>{"fc.weight", "fc.bias", "counter"});
  }

  TEST_CASE("single refuses more than one rank") {
    CHECK_THROWS_AS(SingleStrategy(make_options<SingleStrategy>(), make_ctx(0, 2)), ConfigError);
  }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("precision") {
  TEST_CASE("fp32 detects non-finite gradients") {
    Fp32Precision fp32(make_options<Fp32Precision>(), make_ctx());
    LocalCommunicator comm(600);
    std::vector<at::Tensor> grads = {torch::ones({3, 3}), at::Tensor(), torch::zeros({0}),
                                     torch::randn({4})};
    CHECK(fp32.unscale_and_check(grads, comm));
    CHECK(fp32.unscale_and_check({}, comm));

    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    for (float bad : {nan, inf, -inf}) {
      auto broken = grads;
      broken[3] = grads[3].clone();
      broken[3][2] = bad;
      CHECK_FALSE(fp32.unscale_and_check(broken, comm));
      CHECK(torch::equal(broken[0], torch::ones({3, 3})));  // fp32 does not rescale
    }
    CHECK(fp32.loss_scale() == 1.0);
    CHECK(fp32.autocast() == nullptr);
  }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("callbacks") {
  struct TempDir {
    fs::path path;
    TempDir() {
      std::string tmpl = (fs::temp_directory_path() / "trainrun-test-XXXXXX").string();
      REQUIRE(mkdtemp(tmpl.data()) != nullptr);
      path = tmpl;
    }
    ~TempDir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };

  std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
    std::ifstream in(p);
    REQUIRE(in.is_open());
    std::vector<nlohmann::json> out;
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }

  StepMetrics step_metrics(int64_t step, int64_t total) {
    StepMetrics m;
    m.step = step;
    m.epoch = (step - 1) / 2;
    m.loss = 2.5 / static_cast<double>(step);
    m.lr = 0.001;
    m.grad_norm = 0.75;
    m.step_time_s = 0.1;
    m.elapsed_s = 0.1 * static_cast<double>(step);
    m.samples_per_s = 320;
    m.total_steps = total;
    m.extra["loss_scale"] = 65536;
    return m;
  }

  TEST_CASE("metrics writes every n-th and the last step, and evaluations") {
    TempDir dir;
    MetricsCallback cb(make_options<MetricsCallback>({{"every_n_steps", int64_t{2}}}),
                       make_ctx(0, 1, dir.path.string()));
    CHECK(cb.path() == (dir.path / "metrics.jsonl").string());
    cb.on_train_start(make_plan(5));
    for (int64_t s = 1; s <= 5; ++s) {
      StepMetrics m = step_metrics(s, 5);
      if (s == 4) m.tokens_per_s = 1000;
      if (s == 5) m.loss = std::numeric_limits<double>::quiet_NaN();
      cb.on_step_end(m);
      // Each line is on disk once written, before the run ends.
      if (s == 2) CHECK(read_jsonl(cb.path()).size() == 1);
    }
    EvalMetrics e;
    e.step = 5;
    e.loss = 1.25;
    e.accuracy = 0.5;
    e.samples = 64;
    e.targets = 64;
    cb.on_eval_end(e);
    EvalMetrics no_acc = e;
    no_acc.accuracy = -1;
    cb.on_eval_end(no_acc);
    cb.on_train_end({});

    const auto lines = read_jsonl(cb.path());
    REQUIRE(lines.size() == 5);
    CHECK(lines[0]["step"] == 2);
    CHECK(lines[1]["step"] == 4);
    CHECK(lines[2]["step"] == 5);
    const auto& l = lines[0];
    CHECK(l["epoch"] == 0);
    CHECK(l["rank"] == 0);
    CHECK(l["loss"].get<double>() == doctest::Approx(1.25));
    CHECK(l["lr"].get<double>() == doctest::Approx(0.001));
    CHECK(l["grad_norm"].get<double>() == doctest::Approx(0.75));
    CHECK(l["step_time_s"].get<double>() == doctest::Approx(0.1));
    CHECK(l["samples_per_s"].get<double>() == doctest::Approx(320));
    CHECK(l["loss_scale"].get<double>() == doctest::Approx(65536));
    CHECK_FALSE(l.contains("tokens_per_s"));
    CHECK(lines[1]["tokens_per_s"].get<double>() == doctest::Approx(1000));
    CHECK(lines[2]["loss"].is_null());  // NaN has no JSON spelling
    CHECK(lines[3]["eval_loss"].get<double>() == doctest::Approx(1.25));
    CHECK(lines[3]["eval_accuracy"].get<double>() == doctest::Approx(0.5));
    CHECK(lines[3]["eval_samples"] == 64);
    CHECK(lines[3]["step"] == 5);
    CHECK_FALSE(lines[4].contains("eval_accuracy"));
  }

  TEST_CASE("metrics: only rank 0 writes unless all_ranks") {
    TempDir dir;
    MetricsCallback quiet(make_options<MetricsCallback>(), make_ctx(1, 2, dir.path.string()));
    CHECK(quiet.path().empty());
    quiet.on_train_start(make_plan(1));
    quiet.on_step_end(step_metrics(1, 1));
    CHECK(fs::is_empty(dir.path));

    MetricsCallback all(make_options<MetricsCallback>({{"all_ranks", true}}),
                        make_ctx(1, 2, dir.path.string()));
    CHECK(all.path() == (dir.path / "metrics-rank-1.jsonl").string());
    all.on_train_start(make_plan(1));
    StepMetrics m = step_metrics(1, 1);
    m.rank = 1;
    all.on_step_end(m);
    all.on_train_end({});
    const auto lines = read_jsonl(all.path());
    REQUIRE(lines.size() == 1);
    CHECK(lines[0]["rank"] == 1);
  }

  // What the code under test writes to stderr (fd 2) between construction and finish().
  struct StderrCapture {
    FILE* file = std::tmpfile();
    int saved = -1;
    StderrCapture() {
      std::fflush(stderr);
      saved = dup(STDERR_FILENO);
      dup2(fileno(file), STDERR_FILENO);
    }
    std::string finish() {
      std::fflush(stderr);
      dup2(saved, STDERR_FILENO);
      close(saved);
      std::rewind(file);
      std::string out;
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, file)) > 0) out.append(buf, n);
      std::fclose(file);
      return out;
    }
  };

  // A full training of 3 steps: rank 0 draws (\r-redrawn, the last line at 3/3) when stderr is a
  // terminal or the launcher says its own is (TRAINRUN_TTY=1); nothing otherwise, and never on
  // another rank.
  void run_progress(int rank, const char* tty, std::string* out) {
    if (tty) setenv("TRAINRUN_TTY", tty, 1);
    else unsetenv("TRAINRUN_TTY");
    setenv("COLUMNS", "100", 1);
    StderrCapture capture;
    {
      ProgressCallback cb(make_options<ProgressCallback>({{"refresh_s", 0.0}}), make_ctx(rank, 2));
      cb.on_train_start(make_plan(3));
      for (int64_t s = 1; s <= 3; ++s) cb.on_step_end(step_metrics(s, 3));
      cb.on_train_end({});
    }
    *out = capture.finish();
    unsetenv("TRAINRUN_TTY");
    unsetenv("COLUMNS");
  }

  TEST_CASE("progress runs through a training (draws only when stderr is a terminal)") {
    std::string out;
    run_progress(0, nullptr, &out);
    CHECK(out.empty());
    run_progress(0, "1", &out);
    // One redraw per step (refresh_s = 0) and a last one at the end, then a newline.
    CHECK(std::count(out.begin(), out.end(), '\r') == 4);
    CHECK(out.back() == '\n');
    CHECK(out.find("3/3 loss") != std::string::npos);
    CHECK(out.find("100% [") != std::string::npos);
    run_progress(1, "1", &out);
    CHECK(out.empty());
  }

  TEST_CASE("progress line layout") {
    const std::string line = format_progress(420, 1000, 1.23456, 1234.5, 83, 100);
    CHECK(line.size() <= 100);
    CHECK(line.rfind(" 42% [", 0) == 0);
    CHECK(line.find("420/1000") != std::string::npos);
    CHECK(line.find("loss 1.235") != std::string::npos);
    CHECK(line.find("1234.5 samples/s") != std::string::npos);
    CHECK(line.find("ETA 1:23") != std::string::npos);
    // Narrow terminal: no bar, and never wider than the terminal.
    const std::string narrow = format_progress(420, 1000, 1.2, 10, -1, 40);
    CHECK(narrow.size() <= 40);
    CHECK(narrow.find('[') == std::string::npos);
    CHECK(format_progress(1000, 1000, 0.5, 1, 3725, 200).find("ETA 1:02:05") !=
          std::string::npos);
  }
}
