// Unit tests of the precision plugin's reduced-precision components (bf16-mixed, bf16-true,
// fp16-mixed, auto), the dynamic loss scaler (DeepSpeed's update_scale against tables of
// overflow/clean sequences), the optimizer's float32 master weights, and the SDK's activation
// checkpointing on the gpt (gradients equal, dropout replayed, peak activation memory). The
// plugins' component objects are linked in; the CPU memory tracker is
// installed first thing in main(), as trainrun's own main does.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <torch/types.h>
#include <torch/utils.h>
#include <torch/nn/functional.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <trainrun/model/activation_checkpointing.hpp>
#include <trainrun/model/linear.hpp>
#include <trainrun/runtime/memory.hpp>
#include <trainrun/trainrun.hpp>

#include "fake_communicator.hpp"
#include "optimizers/optim/optim.hpp"
#include "precisions/precision/loss_scaler.hpp"
#include "precisions/precision/mixed.hpp"
#include "precisions/precision/precision.hpp"
#include "trainrun/core/memory.hpp"

namespace trainrun::models {
extern const trainrun_component_v1 kComponents[];
}

namespace {

using namespace trainrun::v1;
using namespace trainrun::plugins;
using Overrides = std::map<std::string, OptionValue>;

template <class T>
Options options_of(const Overrides& overrides = {}) {
  OptionSchema schema;
  T::declare_options(schema);
  std::map<std::string, OptionValue> values;
  for (const auto& spec : schema.specs()) values[spec.name] = spec.default_value;
  for (const auto& [key, value] : overrides) {
    REQUIRE_MESSAGE(schema.find(key) != nullptr, "undeclared option " << key);
    values[key] = value;
  }
  return Options(values, "[precision] (test)");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

using trainrun::test::FakeCommunicator;

// A two-rank world seen from rank 0 whose other rank holds `value` in every element: all_reduce
// combines this rank's tensor with it (Min/Max/Sum/Avg), so agreement can be tested in one
// process.
FakeCommunicator peer_holding(float value) {
  FakeCommunicator comm(2);
  comm.peer = [value](const at::Tensor& mine) { return at::full_like(mine, value); };
  return comm;
}

// Scale after each update of a fresh scaler fed `seq` ('o' overflow, 'c' clean); -1 where
// update threw (and stops there).
std::vector<double> scales(const LossScalerOptions& o, const std::string& seq) {
  DynamicLossScaler s(o);
  std::vector<double> out;
  for (char c : seq) {
    try {
      s.update(c == 'o');
      out.push_back(s.scale());
    } catch (const Error&) {
      out.push_back(-1);
      break;
    }
  }
  return out;
}

LossScalerOptions scaler(double init, int64_t window, int64_t hysteresis, bool consecutive,
                         bool raise = true, double min_scale = 1) {
  LossScalerOptions o;
  o.initial_scale = init;
  o.scale_window = window;
  o.hysteresis = hysteresis;
  o.consecutive_hysteresis = consecutive;
  o.raise_error_at_min_scale = raise;
  o.min_scale = min_scale;
  return o;
}

// --- models -----------------------------------------------------------------------------------

const trainrun_component_v1& model_component(const std::string& name) {
  for (int i = 0; i < 4; ++i)
    if (name == trainrun::models::kComponents[i].name) return trainrun::models::kComponents[i];
  throw std::runtime_error("no model " + name);
}

std::unique_ptr<Model> make_model(const std::string& name, const Overrides& overrides,
                                  const RunContext& ctx) {
  const trainrun_component_v1& c = model_component(name);
  OptionSchema schema;
  c.declare_options(&schema);
  std::map<std::string, OptionValue> values;
  for (const auto& spec : schema.specs()) values[spec.name] = spec.default_value;
  for (const auto& [k, v] : overrides) values[k] = v;
  Options opts(values, "[model] (test)");
  return std::unique_ptr<Model>(static_cast<Model*>(c.create(&opts, &ctx)));
}

RunContext lm_context(int64_t T) {
  RunContext ctx;
  ctx.data.task = "language_modeling";
  ctx.data.vocab_size = 256;
  ctx.data.sample_shape = {T};
  return ctx;
}

RunContext image_context() {
  RunContext ctx;
  ctx.data.sample_shape = {1, 28, 28};
  ctx.data.num_classes = 10;
  return ctx;
}

Overrides gpt_options(int64_t n_layer, int64_t n_embd, int64_t T, double dropout) {
  return {{"n_layer", n_layer}, {"n_head", int64_t(4)}, {"n_embd", n_embd},
          {"block_size", T}, {"dropout", dropout}};
}

Batch lm_batch(int64_t B, int64_t T) {
  Batch b;
  b.input = torch::randint(256, {B, T}, torch::kLong);
  b.target = torch::randint(256, {B, T}, torch::kLong);
  b.num_samples = B;
  b.num_targets = b.num_tokens = B * T;
  return b;
}

void set_checkpointing(Model& m, bool on) {
  for (Unit* u : m.units()) {
    if (on)
      enable_activation_checkpointing(*u);
    else
      u->set_checkpointer({});
  }
}

// Forward + backward of one batch from RNG seed `seed`; returns the parameters' gradients
// (clones) and leaves the model's gradients cleared.
std::map<std::string, at::Tensor> gradients(Model& m, const Batch& b, uint64_t seed,
                                            Precision* precision = nullptr) {
  torch::manual_seed(seed);
  std::unique_ptr<Scope> scope = precision ? precision->autocast() : nullptr;
  ModelOutput out = m.forward(b);
  scope.reset();
  out.loss_sum.backward();
  std::map<std::string, at::Tensor> g;
  for (auto& p : m.named_parameters()) {
    REQUIRE_MESSAGE(p.tensor.grad().defined(), p.name << " has no gradient");
    g[p.name] = p.tensor.grad().clone();
    p.tensor.mutable_grad() = at::Tensor();
  }
  return g;
}

double max_abs_diff(const std::map<std::string, at::Tensor>& a,
                    const std::map<std::string, at::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (const auto& [name, t] : a)
    worst = std::max(worst, (t.to(at::kDouble) - b.at(name).to(at::kDouble)).abs().max().item<double>());
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  trainrun::core::install_memory_tracker();
  doctest::Context context(argc, argv);
  return context.run();
}

// =============================================================================================
TEST_SUITE("loss_scaler") {
  // Each row: options, a sequence of steps (o = overflow, c = clean), the scale after each step
  // (-1: the update threw). Expected values follow DeepSpeed's DynamicLossScaler.update_scale
  // (deepspeed/runtime/fp16/loss_scaler.py), worked by hand and checked against a line-by-line
  // Python transcription of it.
  TEST_CASE("DeepSpeed's update_scale, step by step") {
    struct Row {
      const char* what;
      LossScalerOptions options;
      std::string seq;
      std::vector<double> expected;
    };
    const std::vector<Row> rows = {
        {"growth on the window-th clean step, then every window; hysteresis 2 absorbs the "
         "first overflow, later ones halve until the scale grows again",
         scaler(16, 2, 2, false), "ccccoooccco" "c",
         {16, 32, 32, 64, 64, 32, 16, 16, 32, 32, 32, 32}},
        {"consecutive_hysteresis: isolated overflows never halve",
         scaler(16, 1000, 2, true), "ocococo", {16, 16, 16, 16, 16, 16, 16}},
        {"consecutive_hysteresis: the second overflow in a row halves, and so does each after",
         scaler(16, 1000, 2, true), "ocooooo", {16, 16, 16, 8, 4, 2, 1}},
        {"without consecutive_hysteresis a clean step does not refill the hysteresis; an "
         "overflow at min_loss_scale throws (raise_error_at_min_scale)",
         scaler(16, 1000, 2, false), "ocooooo", {16, 16, 8, 4, 2, 1, -1}},
        {"... and keeps skipping at min_loss_scale when told not to raise",
         scaler(16, 1000, 2, false, false), "ocooooo", {16, 16, 8, 4, 2, 1, 1}},
        {"hysteresis 1: every overflow halves", scaler(4, 1000, 1, false), "ooo", {2, 1, -1}},
        {"window 1: the scale doubles on every clean step, the first included (issue 28: it "
         "used to start one step later)", scaler(1, 1, 2, false), "cccc", {2, 4, 8, 16}},
        {"growth refills the hysteresis", scaler(8, 3, 2, false), "cccccoccccccc",
         {8, 8, 16, 16, 16, 16, 16, 16, 32, 32, 32, 64, 64}},
        {"hysteresis 3 with growth in between", scaler(64, 2, 3, false), "oocccooccccoo",
         {64, 64, 64, 128, 128, 128, 128, 128, 256, 256, 512, 512, 512}},
        {"min_loss_scale is a floor, not a power of two", scaler(8, 1000, 1, false, false, 3),
         "oooo", {4, 3, 3, 3}},
    };
    for (const Row& r : rows) {
      CAPTURE(r.what);
      CAPTURE(r.seq);
      CHECK(scales(r.options, r.seq) == r.expected);
    }
  }

  TEST_CASE("defaults: 2^16, hysteresis 2, the scale doubles on the 1000th clean step") {
    const MixedConfig c = Fp16Mixed::config_from(options_of<Fp16Mixed>());
    REQUIRE(c.dynamic);
    DynamicLossScaler s(*c.dynamic);
    CHECK(s.scale() == 65536);
    for (int i = 0; i < 999; ++i) s.update(false);
    CHECK(s.scale() == 65536);
    s.update(false);
    CHECK(s.scale() == 131072);
    s.update(true);  // hysteresis 2 -> 1
    CHECK(s.scale() == 131072);
    s.update(true);
    CHECK(s.scale() == 65536);
  }

  TEST_CASE("checkpoint state round-trips and the restored scaler continues identically") {
    const LossScalerOptions o = scaler(1024, 3, 2, false);
    DynamicLossScaler a(o);
    for (char c : std::string("ccoccccoc")) a.update(c == 'o');
    DynamicLossScaler b(o);
    b.load_checkpoint_state(a.checkpoint_state());
    for (char c : std::string("occcccoocccc")) {
      a.update(c == 'o');
      b.update(c == 'o');
      CHECK(a.scale() == b.scale());
    }
    CHECK(a.checkpoint_state() == b.checkpoint_state());
    auto broken = a.checkpoint_state();
    broken.erase("hysteresis_left");
    CHECK(contains(error_of([&] { b.load_checkpoint_state(broken); }), "'hysteresis_left'"));
  }

  TEST_CASE("bad fp16-mixed options name the key") {
    auto err = [](const Overrides& o) {
      return error_of([&] { Fp16Mixed::config_from(options_of<Fp16Mixed>(o)); });
    };
    CHECK(contains(err({{"min_loss_scale", 0.0}}), "min_loss_scale must be > 0"));
    CHECK(contains(err({{"min_loss_scale", 1e6}, {"initial_scale_power", int64_t(4)}}),
                   "min_loss_scale (1e+06) is larger than 2^initial_scale_power (16)"));
    CHECK(err({{"loss_scale", 128.0}}).empty());
    const MixedConfig fixed = Fp16Mixed::config_from(options_of<Fp16Mixed>({{"loss_scale", 128.0}}));
    CHECK_FALSE(fixed.dynamic);
    CHECK(fixed.static_scale == 128);
    CHECK(contains(error_of([] {
                     LossScalerOptions o;
                     o.hysteresis = 0;
                     DynamicLossScaler s(o);
                   }),
                   "hysteresis must be >= 1"));
  }
}

// =============================================================================================
TEST_SUITE("precision_mixed") {
  TEST_CASE("fp16-mixed: scales the loss, unscales finite gradients, skips overflows") {
    Fp16Mixed p(options_of<Fp16Mixed>(), RunContext{});
    FakeCommunicator one;
    CHECK(p.loss_scale() == 65536);
    CHECK(p.scale_loss(torch::tensor(0.5f)).item<float>() == 32768.0f);
    CHECK(p.autocast() != nullptr);  // CUDA autocast to fp16; CPU autocast stays off
    {
      auto scope = p.autocast();
      CHECK_FALSE(at::autocast::is_cpu_enabled());
      CHECK((torch::matmul(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type() == torch::kFloat));
    }
    // Scaled gradient 65536 * 0.25 = 16384: within float16's range, unscaled in place.
    std::vector<at::Tensor> grads = {torch::full({3}, 16384.0f), torch::full({2, 2}, -8192.0f)};
    CHECK(p.unscale_and_check(grads, one));
    CHECK(grads[0].eq(0.25f).all().item<bool>());
    CHECK(grads[1].eq(-0.125f).all().item<bool>());
    // Beyond 65504: an fp16 backward would have overflowed.
    std::vector<at::Tensor> big = {torch::full({3}, 70000.0f)};
    CHECK_FALSE(p.unscale_and_check(big, one));
    CHECK(big[0].eq(70000.0f).all().item<bool>());  // left alone: the step is skipped
    std::vector<at::Tensor> nan = {torch::tensor({1.0f, std::nanf("")})};
    CHECK_FALSE(p.unscale_and_check(nan, one));
    Fp16Mixed no_range(options_of<Fp16Mixed>({{"fp16_range_check", false}}), RunContext{});
    big = {torch::full({3}, 70000.0f)};
    CHECK(no_range.unscale_and_check(big, one));
    std::vector<at::Tensor> inf = {torch::tensor({1.0f, INFINITY})};
    CHECK_FALSE(no_range.unscale_and_check(inf, one));
    CHECK(one.log.empty());  // a world of one agrees with itself without a collective
    // PrecisionBytes: fp32 weights and gradients under autocast, no master copy.
    CHECK(p.param_bytes() == 4);
    CHECK(p.grad_bytes() == 4);
    CHECK(p.master_bytes() == 0);
  }

  TEST_CASE("the overflow flag is agreed across ranks: one rank's overflow skips everywhere") {
    Fp16Mixed p(options_of<Fp16Mixed>(), RunContext{});
    FakeCommunicator peer_overflowed = peer_holding(0.0f), peer_clean = peer_holding(1.0f);
    std::vector<at::Tensor> fine = {torch::full({4}, 4096.0f)};
    CHECK_FALSE(p.unscale_and_check(fine, peer_overflowed));
    CHECK(peer_overflowed.count("all_reduce") == 1);
    CHECK(fine[0].eq(4096.0f).all().item<bool>());  // not unscaled: skipped
    std::vector<at::Tensor> bad = {torch::tensor({INFINITY})};
    CHECK_FALSE(p.unscale_and_check(bad, peer_clean));
    CHECK(p.unscale_and_check(fine, peer_clean));
    CHECK(fine[0].eq(0.0625f).all().item<bool>());
    // bf16-mixed agrees too (the plain finite check), without any scaling.
    Bf16Mixed b(options_of<Bf16Mixed>(), RunContext{});
    std::vector<at::Tensor> g = {torch::full({2}, 3.0f)};
    CHECK_FALSE(b.unscale_and_check(g, peer_overflowed));
    CHECK(b.unscale_and_check(g, peer_clean));
    CHECK(g[0].eq(3.0f).all().item<bool>());
  }

  TEST_CASE("fp16-mixed: the scaler drives loss_scale, metrics and checkpoint state") {
    Fp16Mixed p(options_of<Fp16Mixed>({{"initial_scale_power", int64_t(10)}}), RunContext{});
    p.update(true);  // hysteresis 2 -> 1
    CHECK(p.loss_scale() == 1024);
    p.update(true);
    CHECK(p.loss_scale() == 512);
    std::map<std::string, double> extra;
    p.add_step_metrics(extra);
    CHECK(extra.at("loss_scale") == 512);
    const auto state = p.checkpoint_state();
    CHECK(state.at("loss_scale") == 512);
    CHECK(state.at("iteration") == 2);
    CHECK(state.at("last_overflow") == 1);
    Fp16Mixed q(options_of<Fp16Mixed>({{"initial_scale_power", int64_t(10)}}), RunContext{});
    q.load_checkpoint_state(state);
    CHECK(q.loss_scale() == 512);
    Bf16Mixed b(options_of<Bf16Mixed>(), RunContext{});
    CHECK(b.checkpoint_state().empty());
    CHECK(contains(error_of([&] { b.load_checkpoint_state(state); }), "no dynamic loss scaler"));
  }

  TEST_CASE("bf16-mixed: bfloat16 autocast inside the scope only; fp32 weights; no scaling") {
    Bf16Mixed p(options_of<Bf16Mixed>(), RunContext{});
    torch::nn::Linear lin(8, 4);
    const torch::Tensor x = torch::randn({2, 8});
    CHECK(p.loss_scale() == 1);
    const torch::Tensor loss = torch::tensor(2.0f);
    CHECK(p.scale_loss(loss).item<float>() == 2.0f);
    {
      auto scope = p.autocast();
      CHECK((lin(x).scalar_type() == torch::kBFloat16));
      {
        auto inner = p.autocast();  // nesting restores the outer state
        CHECK((lin(x).scalar_type() == torch::kBFloat16));
      }
      CHECK(at::autocast::is_cpu_enabled());
      // Softmax-cross-entropy runs in float32 under CPU autocast.
      CHECK((torch::nn::functional::cross_entropy(lin(x), torch::tensor({1, 2})).scalar_type() ==
             torch::kFloat));
    }
    CHECK_FALSE(at::autocast::is_cpu_enabled());
    CHECK((lin(x).scalar_type() == torch::kFloat));
    CHECK((lin->weight.scalar_type() == torch::kFloat));
    CHECK(p.param_bytes() == 4);
    CHECK(p.master_bytes() == 0);
    std::map<std::string, double> extra;
    p.add_step_metrics(extra);
    CHECK(extra.empty());
  }

  TEST_CASE("bf16-mixed: a frozen Linear weight kept in bf16 gives autocast's products") {
    Bf16Mixed p(options_of<Bf16Mixed>(), RunContext{});
    CHECK((p.frozen_weight_dtype() == std::optional<at::ScalarType>(at::kBFloat16)));
    Bf16Mixed off(options_of<Bf16Mixed>({{"frozen_weight_copies", false}}), RunContext{});
    CHECK_FALSE(off.frozen_weight_dtype().has_value());
    Bf16True t(options_of<Bf16True>(), RunContext{});
    CHECK_FALSE(t.frozen_weight_dtype().has_value());  // its weights are bf16 already

    torch::manual_seed(11);
    trainrun::v1::Linear frozen(16, 8), twin(16, 8);
    {
      torch::NoGradGuard g;
      twin->weight.copy_(frozen->weight);
      twin->bias.copy_(frozen->bias);
    }
    frozen->weight.set_requires_grad(false);
    twin->weight.set_requires_grad(false);
    REQUIRE(frozen->keep_frozen_weight_copy(at::kBFloat16));
    CHECK((frozen->frozen_weight_copy().scalar_type() == at::kBFloat16));
    const torch::Tensor x = torch::randn({3, 16}, torch::requires_grad());
    auto forward_backward = [&](trainrun::v1::Linear& l) {
      auto scope = p.autocast();
      torch::Tensor y = l(x);
      const torch::Tensor gx = torch::autograd::grad({y.to(torch::kFloat).pow(2).sum()}, {x})[0];
      return std::make_pair(y, gx);
    };
    auto [y1, g1] = forward_backward(frozen);
    auto [y2, g2] = forward_backward(twin);
    CHECK(torch::equal(y1, y2));  // the same cast, made once instead of per call
    CHECK(torch::equal(g1, g2));
    // Outside autocast the float32 weight computes.
    CHECK((frozen(x).scalar_type() == torch::kFloat));
    CHECK(torch::equal(frozen(x), twin(x)));
    // A weight changed in place (a checkpoint loaded into it) is copied again.
    {
      torch::NoGradGuard g;
      frozen->weight.mul_(2);
      twin->weight.mul_(2);
    }
    CHECK(torch::equal(forward_backward(frozen).first, forward_backward(twin).first));
    // A weight that requires grad is never copied; one unfrozen later stops using its copy.
    trainrun::v1::Linear trained(16, 8);
    CHECK_FALSE(trained->keep_frozen_weight_copy(at::kBFloat16));
    frozen->weight.set_requires_grad(true);
    {
      auto scope = p.autocast();
      frozen(x).sum().backward();
    }
    CHECK(frozen->weight.grad().defined());
    CHECK_FALSE(frozen->frozen_weight_copy().defined());
  }

  TEST_CASE("bf16-mixed: micro-batch gradients accumulate in float32") {
    Bf16Mixed p(options_of<Bf16Mixed>(), RunContext{});
    torch::manual_seed(4);
    auto m = make_model("mlp", {{"hidden", std::vector<int64_t>{32}}}, image_context());
    auto batch = [](int64_t seed) {
      torch::manual_seed(seed);
      Batch b;
      b.input = torch::rand({8, 1, 28, 28});
      b.target = torch::randint(10, {8}, torch::kLong);
      b.num_samples = b.num_targets = 8;
      return b;
    };
    auto backward = [&](const Batch& b) {
      ModelOutput out;
      {
        auto scope = p.autocast();
        out = m->forward(b);
      }
      out.loss_sum.backward();
    };
    const Batch b1 = batch(10), b2 = batch(11);
    std::map<std::string, at::Tensor> g1, g2;
    backward(b1);
    for (auto& np : m->named_parameters()) g1[np.name] = np.tensor.grad().clone(), np.tensor.mutable_grad() = at::Tensor();
    backward(b2);
    for (auto& np : m->named_parameters()) g2[np.name] = np.tensor.grad().clone(), np.tensor.mutable_grad() = at::Tensor();
    backward(b1);
    backward(b2);  // accumulates into .grad, as the trainer's micro-batches do
    for (auto& np : m->named_parameters()) {
      CAPTURE(np.name);
      CHECK((np.tensor.grad().scalar_type() == torch::kFloat));
      CHECK(torch::equal(np.tensor.grad(), g1[np.name] + g2[np.name]));
    }
  }

  TEST_CASE("bf16-true: weights cast to bfloat16; the model trains through autocast") {
    Bf16True p(options_of<Bf16True>(), RunContext{});
    auto m = make_model("mlp", {{"hidden", std::vector<int64_t>{32}}}, image_context());
    p.convert(*m);
    for (auto& np : m->named_parameters()) {
      CHECK((np.tensor.scalar_type() == torch::kBFloat16));
      CHECK(np.tensor.requires_grad());
      CHECK(np.tensor.is_leaf());
    }
    CHECK(p.param_bytes() == 2);
    CHECK(p.grad_bytes() == 2);
    CHECK(p.master_bytes() == 4);
    Batch b;
    b.input = torch::rand({4, 1, 28, 28});  // float32 input meets bf16 weights
    b.target = torch::randint(10, {4}, torch::kLong);
    b.num_samples = b.num_targets = 4;
    ModelOutput out;
    {
      auto scope = p.autocast();
      out = m->forward(b);
    }
    CHECK(std::isfinite(out.loss_sum.item<double>()));
    out.loss_sum.backward();
    for (auto& np : m->named_parameters())
      CHECK((np.tensor.grad().scalar_type() == torch::kBFloat16));
  }

  // The machine's answer, read here independently of the plugin's parser: the kernel's flags for
  // AVX512-BF16 or AMX-BF16 anywhere in /proc/cpuinfo.
  bool cpuinfo_lists_bf16() {
    std::ifstream f("/proc/cpuinfo");
    const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (const char* flag : {" avx512_bf16", " amx_bf16"}) {
      for (size_t at = all.find(flag); at != std::string::npos; at = all.find(flag, at + 1)) {
        const char next = at + std::strlen(flag) < all.size() ? all[at + std::strlen(flag)] : '\n';
        if (next == ' ' || next == '\n') return true;
      }
    }
    return false;
  }

  TEST_CASE("auto: bf16-mixed exactly where the CPU has native bfloat16") {
    AutoPrecision a(options_of<AutoPrecision>(), RunContext{});
    const bool native = cpuinfo_lists_bf16();
    CHECK(cpu_has_native_bf16() == native);
    CHECK(a.choice() == (native ? "bf16-mixed" : "fp32"));
    CHECK((a.autocast() != nullptr) == native);
    AutoPrecision forced(options_of<AutoPrecision>({{"require_native_bf16", false}}), RunContext{});
    CHECK(forced.choice() == "bf16-mixed");
  }
}

// =============================================================================================
TEST_SUITE("master_weights") {
  // bf16 parameters: the optimizer steps float32 masters; with the same (bf16-representable)
  // start and gradients, the masters follow a float32 run exactly and the parameters are the
  // masters rounded to bf16.
  TEST_CASE("adamw and sgd on bfloat16 parameters follow float32 runs through their masters") {
    for (const char* rule : {"adamw", "sgd"}) {
      CAPTURE(rule);
      torch::manual_seed(3);
      const torch::Tensor init = torch::randn({16, 8}).to(torch::kBFloat16).to(torch::kFloat);
      torch::Tensor ref = init.clone().requires_grad_(true);
      torch::Tensor low = init.to(torch::kBFloat16).requires_grad_(true);
      TrainPlan plan;
      plan.total_steps = 10;
      std::unique_ptr<Optimizer> a, b;
      if (std::string(rule) == "adamw") {
        a = std::make_unique<AdamW>(options_of<AdamW>({{"lr", 1e-2}}), RunContext{});
        b = std::make_unique<AdamW>(options_of<AdamW>({{"lr", 1e-2}}), RunContext{});
      } else {
        a = std::make_unique<Sgd>(options_of<Sgd>({{"lr", 1e-2}, {"momentum", 0.9}}), RunContext{});
        b = std::make_unique<Sgd>(options_of<Sgd>({{"lr", 1e-2}, {"momentum", 0.9}}), RunContext{});
      }
      a->init({{"w", ref}}, plan);
      b->init({{"w", low}}, plan);
      at::Tensor master;
      for (const auto& s : b->state())
        if (s.name == "w.master") master = s.tensor;
      REQUIRE(master.defined());
      CHECK((master.scalar_type() == torch::kFloat));
      for (int step = 0; step < 10; ++step) {
        const torch::Tensor g = torch::randn({16, 8}).to(torch::kBFloat16);
        ref.mutable_grad() = g.to(torch::kFloat);
        low.mutable_grad() = g;
        a->step(step);
        b->step(step);
        CHECK(torch::equal(master, ref.detach()));
        CHECK(torch::equal(low.detach(), master.to(torch::kBFloat16)));
      }
      for (const auto& s : b->state())
        if (s.name != "w.step") CHECK((s.tensor.scalar_type() == torch::kFloat));
    }
  }

  TEST_CASE("updates below bfloat16's resolution still accumulate in the master") {
    torch::Tensor low = torch::ones({4}, torch::kBFloat16).requires_grad_(true);
    Sgd sgd(options_of<Sgd>({{"lr", 1e-4}}), RunContext{});
    TrainPlan plan;
    plan.total_steps = 100;
    sgd.init({{"w", low}}, plan);
    for (int s = 0; s < 100; ++s) {
      low.mutable_grad() = torch::ones({4}, torch::kBFloat16);
      sgd.step(s);
    }
    // 100 x 1e-4 = 0.01 below 1; bf16 steps near 1 are 2^-8 = 0.0039, so each single update
    // (1e-4) would round away, but the master moved by 0.01 and the parameter follows it.
    CHECK(low.detach().to(torch::kFloat).lt(0.995f).all().item<bool>());
  }
}

// =============================================================================================
TEST_SUITE("activation_checkpointing") {
  TEST_CASE("gpt: gradients equal with and without checkpointing (dropout replayed)") {
    for (const bool bf16 : {false, true}) {
      CAPTURE(bf16);
      torch::manual_seed(1);
      auto m = make_model("gpt", gpt_options(3, 32, 16, /*dropout=*/0.1), lm_context(16));
      m->train(true);
      const Batch b = lm_batch(4, 16);
      Bf16Mixed mixed(options_of<Bf16Mixed>(), RunContext{});
      Precision* p = bf16 ? &mixed : nullptr;
      set_checkpointing(*m, false);
      const auto plain = gradients(*m, b, 42, p);
      const torch::Tensor after_plain = torch::rand({8});
      set_checkpointing(*m, true);
      const auto ckpt = gradients(*m, b, 42, p);
      const torch::Tensor after_ckpt = torch::rand({8});
      const double diff = max_abs_diff(plain, ckpt);
      MESSAGE("max |grad difference| " << std::string(bf16 ? "(bf16-mixed)" : "(fp32)") << ": " << diff);
      CHECK(diff <= 1e-6);
      // The random stream after backward is where it would be without recomputation.
      CHECK(torch::equal(after_plain, after_ckpt));
      // A different dropout seed gives different gradients: the masks matter, so equality
      // above means they were replayed.
      set_checkpointing(*m, false);
      CHECK(max_abs_diff(plain, gradients(*m, b, 43, p)) > 1e-4);
    }
  }

  TEST_CASE("parameter gradient hooks fire once per parameter; evaluation runs plainly") {
    torch::manual_seed(2);
    auto m = make_model("gpt", gpt_options(2, 32, 8, 0.0), lm_context(8));
    set_checkpointing(*m, true);
    std::map<std::string, int> fired;
    for (auto& p : m->named_parameters()) {
      const std::string name = p.name;
      p.tensor.register_hook([&fired, name](const torch::Tensor&) { ++fired[name]; });
    }
    const Batch b = lm_batch(2, 8);
    m->forward(b).loss_sum.backward();
    for (auto& p : m->named_parameters()) CHECK_MESSAGE(fired[p.name] == 1, p.name);
    torch::NoGradGuard no_grad;
    const ModelOutput out = m->forward(b);
    CHECK_FALSE(out.loss_sum.requires_grad());
  }

  TEST_CASE("a unit whose input needs no gradient still trains its parameters") {
    torch::nn::Linear lin(6, 3);
    const torch::Tensor x = torch::randn({5, 6});
    auto fn = [&](const at::Tensor& in) { return torch::tanh(lin(in)); };
    fn(x).sum().backward();
    const torch::Tensor expected = lin->weight.grad().clone();
    lin->weight.mutable_grad() = at::Tensor();
    lin->bias.mutable_grad() = at::Tensor();
    const at::Tensor y = checkpoint(x, fn);
    REQUIRE(y.requires_grad());
    y.sum().backward();
    REQUIRE(lin->weight.grad().defined());
    CHECK(torch::allclose(lin->weight.grad(), expected, 0, 1e-7));
  }

  // Peak activation bytes of one forward + backward of a gpt with 8 blocks, with the weights'
  // gradients already allocated (a warm-up step, zeroed in place) so that the peak above the
  // starting point is activations and backward temporaries only. Tracked by the counting CPU
  // allocator (trainrun/runtime/memory.hpp).
  TEST_CASE("gpt n_layer 8: peak activation bytes fall by at least 40%") {
    REQUIRE_MESSAGE(memory::tracking(), "the CPU memory tracker is not installed");
    torch::manual_seed(5);
    auto m = make_model("gpt", gpt_options(8, 128, 128, 0.0), lm_context(128));
    m->train(true);
    const Batch b = lm_batch(8, 128);
    struct Figures {
      int64_t peak = 0;
      double seconds = 0;
    };
    auto measure = [&](bool on) {
      set_checkpointing(*m, on);
      m->forward(b).loss_sum.backward();  // warm-up: allocates .grad
      Figures f;
      f.seconds = 1e30;
      for (int rep = 0; rep < 2; ++rep) {
        for (auto& p : m->named_parameters()) p.tensor.grad().zero_();
        const int64_t base = memory::cpu_stats().current_bytes;
        memory::reset_peak();
        const auto t0 = std::chrono::steady_clock::now();
        m->forward(b).loss_sum.backward();
        f.seconds = std::min(f.seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        f.peak = memory::cpu_stats().peak_bytes - base;
      }
      for (auto& p : m->named_parameters()) p.tensor.mutable_grad() = at::Tensor();
      return f;
    };
    const Figures plain = measure(false);
    const Figures ckpt = measure(true);
    const double saved = 1.0 - static_cast<double>(ckpt.peak) / static_cast<double>(plain.peak);
    MESSAGE("gpt 8 x 128, batch 8 x 128 tokens: peak activation bytes "
            << plain.peak / 1048576.0 << " MiB without, " << ckpt.peak / 1048576.0
            << " MiB with checkpointing (" << 100 * saved << "% less); forward+backward "
            << plain.seconds << " s vs " << ckpt.seconds << " s ("
            << 100 * (ckpt.seconds / plain.seconds - 1) << "% more)");
    CHECK(plain.peak > 0);
    CHECK(saved >= 0.40);
  }
}
