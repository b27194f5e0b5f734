// Unit tests of the "models" (mlp, cnn, gpt, torchscript) and "data" (idx, text) plugins.
// The plugins' component objects are linked into this executable; components are created
// through their table entries (declare_options + create), as the host creates them.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <torch/script.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/trainrun.hpp"

namespace trainrun::models {
extern const trainrun_component_v1 kComponents[];
at::Tensor logits_of(v1::Model& model, const at::Tensor& input);
}  // namespace trainrun::models
namespace trainrun::data {
extern const trainrun_component_v1 kComponents[];
}

namespace {

namespace fs = std::filesystem;
using namespace trainrun::v1;
using Overrides = std::map<std::string, OptionValue>;

const trainrun_component_v1& component(const std::string& name) {
  for (int i = 0; i < 4; ++i)
    if (name == trainrun::models::kComponents[i].name) return trainrun::models::kComponents[i];
  for (int i = 0; i < 2; ++i)
    if (name == trainrun::data::kComponents[i].name) return trainrun::data::kComponents[i];
  throw std::runtime_error("no component " + name);
}

// Defaults from the component's schema, then the overrides (which must be declared options).
Options make_options(const trainrun_component_v1& c, const Overrides& overrides) {
  OptionSchema schema;
  c.declare_options(&schema);
  std::map<std::string, OptionValue> values;
  for (const auto& spec : schema.specs()) values[spec.name] = spec.default_value;
  for (const auto& [key, value] : overrides) {
    REQUIRE_MESSAGE(schema.find(key) != nullptr, "undeclared option " << key);
    values[key] = value;
  }
  return Options(values, std::string("[") + c.name + "] (test)");
}

template <class Interface>
std::unique_ptr<Interface> create(const std::string& name, const Overrides& overrides = {},
                                  const RunContext& ctx = {}) {
  const trainrun_component_v1& c = component(name);
  REQUIRE(c.kind == static_cast<uint32_t>(KindOf<Interface>::value));
  Options opts = make_options(c, overrides);
  return std::unique_ptr<Interface>(static_cast<Interface*>(c.create(&opts, &ctx)));
}

// The message of the trainrun::v1::Error f throws ("" when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// A fresh folder per test case, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("trainrun-unit-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void write_file(const std::string& path, const std::vector<uint8_t>& bytes, bool gz = false) {
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(gzwrite(f, bytes.data(), unsigned(bytes.size())) == int(bytes.size()));
    REQUIRE(gzclose(f) == Z_OK);
  } else {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    REQUIRE(out.good());
  }
}

std::vector<uint8_t> idx_bytes(std::vector<uint32_t> dims, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> b = {0, 0, 0x08, uint8_t(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

std::vector<uint8_t> iota_bytes(size_t n, uint8_t start = 0) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(start + i);
  return v;
}

// Four small IDX files: 5 training images 4x3, 3 test images; labels include 7 -> 8 classes.
void write_idx_set(const TempDir& dir, bool gz) {
  write_file(dir / "tri", idx_bytes({5, 4, 3}, iota_bytes(60)), gz);
  write_file(dir / "trl", idx_bytes({5}, {0, 1, 2, 7, 4}), gz);
  write_file(dir / "tei", idx_bytes({3, 4, 3}, iota_bytes(36, 100)), gz);
  write_file(dir / "tel", idx_bytes({3}, {3, 2, 1}), gz);
}

Overrides idx_options(const TempDir& dir) {
  return {{"dir", dir.path.string()}, {"train_images", std::string("tri")},
          {"train_labels", std::string("trl")}, {"test_images", std::string("tei")},
          {"test_labels", std::string("tel")}};
}

RunContext lm_context(int64_t block, int64_t vocab = 256) {
  RunContext ctx;
  ctx.data.task = "language_modeling";
  ctx.data.sample_shape = {block};
  ctx.data.vocab_size = vocab;
  return ctx;
}

RunContext image_context() {
  RunContext ctx;
  ctx.data.task = "classification";
  ctx.data.sample_shape = {1, 28, 28};
  ctx.data.num_classes = 10;
  return ctx;
}

Overrides small_gpt() {
  return {{"n_layer", int64_t(2)}, {"n_head", int64_t(2)}, {"n_embd", int64_t(32)},
          {"block_size", int64_t(16)}};
}

Batch lm_batch(int64_t B, int64_t T, int64_t vocab = 256) {
  Batch b;
  b.input = torch::randint(vocab, {B, T}, torch::kLong);
  b.target = torch::randint(vocab, {B, T}, torch::kLong);
  b.num_samples = B;
  b.num_targets = b.num_tokens = B * T;
  return b;
}

Batch image_batch(int64_t B) {
  Batch b;
  b.input = torch::randn({B, 1, 28, 28});
  b.target = torch::randint(10, {B}, torch::kLong);
  b.num_samples = b.num_targets = B;
  return b;
}

bool same_parameters(Model& a, Model& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return false;
  for (size_t i = 0; i < pa.size(); ++i)
    if (pa[i].name != pb[i].name || !torch::equal(pa[i].tensor, pb[i].tensor)) return false;
  return true;
}

// Loss is a finite float32 scalar and backward reaches every parameter.
void check_trains(Model& m, const Batch& b) {
  ModelOutput out = m.forward(b);
  REQUIRE(out.loss_sum.dim() == 0);
  CHECK((out.loss_sum.scalar_type() == torch::kFloat));
  CHECK(std::isfinite(out.loss_sum.item<double>()));
  CHECK(out.num_correct == -1);  // not counted while training (autograd on)
  {
    torch::NoGradGuard no_grad;  // evaluation counts correct predictions
    ModelOutput eval = m.forward(b);
    CHECK(eval.num_correct >= 0);
    CHECK(eval.num_correct <= b.num_targets);
  }
  out.loss_sum.backward();
  for (const auto& p : m.named_parameters()) {
    INFO(p.name);
    REQUIRE(p.tensor.grad().defined());
    CHECK(torch::isfinite(p.tensor.grad()).all().item<bool>());
  }
}

}  // namespace

// =============================================================================================
TEST_SUITE("idx") {
  TEST_CASE("parses raw and gzipped IDX files") {
    for (bool gz : {false, true}) {
      CAPTURE(gz);
      TempDir dir;
      write_idx_set(dir, gz);
      Overrides o = idx_options(dir);
      o["normalize"] = false;
      auto ds = create<Dataset>("idx", o);
      DataInfo info = ds->info();
      CHECK(info.task == "classification");
      CHECK(info.sample_shape == std::vector<int64_t>{1, 4, 3});
      CHECK(info.num_classes == 8);
      CHECK(ds->size(Split::Train) == 5);
      CHECK(ds->size(Split::Eval) == 3);

      Batch b = ds->batch(Split::Train, {3, 0});
      CHECK(b.input.sizes() == torch::IntArrayRef({2, 1, 4, 3}));
      CHECK((b.input.scalar_type() == torch::kFloat));
      CHECK((b.target.scalar_type() == torch::kLong));
      CHECK(b.target[0].item<int64_t>() == 7);
      CHECK(b.target[1].item<int64_t>() == 0);
      CHECK(b.num_samples == 2);
      CHECK(b.num_targets == 2);
      CHECK(b.num_tokens == 0);
      // Image 3 holds bytes 36..47 in row-major order.
      CHECK(b.input[0][0][0][0].item<float>() == doctest::Approx(36 / 255.0));
      CHECK(b.input[0][0][3][2].item<float>() == doctest::Approx(47 / 255.0));

      Batch e = ds->batch(Split::Eval, {2});
      CHECK(e.target[0].item<int64_t>() == 1);
      CHECK(e.input[0][0][0][1].item<float>() == doctest::Approx((100 + 24 + 1) / 255.0));
    }
  }

  TEST_CASE("normalizes with mean and std") {
    TempDir dir;
    write_idx_set(dir, true);
    Overrides o = idx_options(dir);
    o["mean"] = 0.5;
    o["std"] = 0.25;
    auto ds = create<Dataset>("idx", o);
    Batch b = ds->batch(Split::Train, {1});
    CHECK(b.input[0][0][0][0].item<float>() == doctest::Approx((12 / 255.0 - 0.5) / 0.25));
  }

  TEST_CASE("errors name the file") {
    TempDir dir;
    write_idx_set(dir, false);
    write_file(dir / "bad", {0x12, 0x34, 0x08, 0x03, 0, 0, 0, 0});
    Overrides o = idx_options(dir);
    o["train_images"] = std::string("bad");
    std::string msg = error_of([&] { create<Dataset>("idx", o); });
    CHECK(contains(msg, dir / "bad"));
    CHECK(contains(msg, "magic"));

    // Labels that do not match the number of images.
    write_file(dir / "short", idx_bytes({4}, {0, 1, 2, 3}), true);
    o = idx_options(dir);
    o["train_labels"] = std::string("short");
    msg = error_of([&] { create<Dataset>("idx", o); });
    CHECK(contains(msg, dir / "short"));
    CHECK(contains(msg, "4 labels"));

    // Dimensions that promise more data than the file holds.
    write_file(dir / "trunc", idx_bytes({5, 4, 4}, iota_bytes(60)));
    o = idx_options(dir);
    o["train_images"] = std::string("trunc");
    msg = error_of([&] { create<Dataset>("idx", o); });
    CHECK(contains(msg, dir / "trunc"));

    o = idx_options(dir);
    o["test_labels"] = std::string("missing");
    CHECK(contains(error_of([&] { create<Dataset>("idx", o); }), dir / "missing"));

    auto ds = create<Dataset>("idx", idx_options(dir));
    CHECK(contains(error_of([&] { ds->batch(Split::Eval, {3}); }), "out of range"));
  }
}

// =============================================================================================
TEST_SUITE("text") {
  TEST_CASE("training and evaluation windows") {
    TempDir dir;
    // 20 bytes over two files matched by one pattern (sorted: a before b).
    write_file(dir / "b.txt", iota_bytes(8, 'A' + 12));
    write_file(dir / "a.txt", iota_bytes(12, 'A'));
    write_file(dir / "skip.dat", iota_bytes(5));
    auto ds = create<Dataset>("text", {{"paths", std::vector<std::string>{dir / "*.txt"}},
                                       {"block_size", int64_t(4)},
                                       {"eval_fraction", 0.25}});
    DataInfo info = ds->info();
    CHECK(info.task == "language_modeling");
    CHECK(info.sample_shape == std::vector<int64_t>{4});
    CHECK(info.vocab_size == 256);
    // 15 training tokens -> windows of 5 at offsets 0..10; 5 held out -> one window.
    CHECK(ds->size(Split::Train) == 11);
    CHECK(ds->size(Split::Eval) == 1);

    Batch b = ds->batch(Split::Train, {0, 10});
    CHECK(b.input.sizes() == torch::IntArrayRef({2, 4}));
    CHECK(b.target.sizes() == torch::IntArrayRef({2, 4}));
    CHECK((b.input.scalar_type() == torch::kLong));
    CHECK(b.num_samples == 2);
    CHECK(b.num_tokens == 8);
    CHECK(b.num_targets == 8);
    auto expect_row = [](const at::Tensor& row, int64_t first) {
      for (int64_t t = 0; t < row.size(0); ++t) CHECK(row[t].item<int64_t>() == 'A' + first + t);
    };
    expect_row(b.input[0], 0);
    expect_row(b.target[0], 1);
    expect_row(b.input[1], 10);
    expect_row(b.target[1], 11);  // the last target is token 14, the last training token

    Batch e = ds->batch(Split::Eval, {0});
    expect_row(e.input[0], 15);
    expect_row(e.target[0], 16);

    CHECK(contains(error_of([&] { ds->batch(Split::Train, {11}); }), "out of range"));
  }

  TEST_CASE("evaluation windows do not overlap") {
    TempDir dir;
    write_file(dir / "x", iota_bytes(100));
    auto ds = create<Dataset>("text", {{"paths", std::vector<std::string>{dir / "x"}},
                                       {"block_size", int64_t(3)},
                                       {"eval_fraction", 0.1}});
    CHECK(ds->size(Split::Train) == 87);
    CHECK(ds->size(Split::Eval) == 3);  // (10 - 1) / 3
    Batch e = ds->batch(Split::Eval, {0, 1, 2});
    for (int64_t i = 0; i < 3; ++i) CHECK(e.input[i][0].item<int64_t>() == 90 + 3 * i);
  }

  TEST_CASE("uint16 tokens") {
    TempDir dir;
    std::vector<uint8_t> bytes;
    for (int t = 0; t < 40; ++t) {
      const int token = 1000 + t;
      bytes.push_back(uint8_t(token & 0xff));
      bytes.push_back(uint8_t(token >> 8));
    }
    write_file(dir / "tok.bin", bytes);
    auto ds = create<Dataset>("text", {{"paths", std::vector<std::string>{dir / "tok.bin"}},
                                       {"format", std::string("uint16")},
                                       {"block_size", int64_t(8)},
                                       {"eval_fraction", 0.5}});
    CHECK(ds->info().vocab_size == 1040);
    Batch b = ds->batch(Split::Train, {2});
    CHECK(b.input[0][0].item<int64_t>() == 1002);
    CHECK(b.target[0][7].item<int64_t>() == 1010);

    write_file(dir / "odd.bin", {1, 2, 3});
    CHECK(contains(error_of([&] {
                     create<Dataset>("text", {{"paths", std::vector<std::string>{dir / "odd.bin"}},
                                              {"format", std::string("uint16")}});
                   }),
                   dir / "odd.bin"));
    CHECK(contains(error_of([&] {
                     create<Dataset>("text", {{"paths", std::vector<std::string>{dir / "tok.bin"}},
                                              {"format", std::string("uint16")},
                                              {"block_size", int64_t(8)},
                                              {"vocab_size", int64_t(1000)}});
                   }),
                   "vocab_size"));
  }

  TEST_CASE("a pattern that matches nothing is an error") {
    TempDir dir;
    write_file(dir / "a.txt", iota_bytes(100));
    const std::string pattern = dir / "*.none";
    std::string msg = error_of([&] {
      create<Dataset>("text", {{"paths", std::vector<std::string>{dir / "a.txt", pattern}}});
    });
    CHECK(contains(msg, pattern));
    CHECK(contains(msg, "matches no file"));
    // Too little text for one window of block_size + 1.
    CHECK(contains(error_of([&] {
                     create<Dataset>("text", {{"paths", std::vector<std::string>{dir / "a.txt"}},
                                              {"block_size", int64_t(128)}});
                   }),
                   "block_size"));
  }
}

// =============================================================================================
TEST_SUITE("gpt") {
  TEST_CASE("logits shape and loss at initialisation") {
    torch::manual_seed(0);
    auto m = create<Model>("gpt", small_gpt(), lm_context(16));
    m->train(false);
    Batch b = lm_batch(3, 16);
    at::Tensor logits = trainrun::models::logits_of(*m, b.input);
    CHECK(logits.sizes() == torch::IntArrayRef({3, 16, 256}));
    ModelOutput out = m->forward(b);
    const double mean_loss = out.loss_sum.item<double>() / double(b.num_targets);
    CHECK(mean_loss == doctest::Approx(std::log(256.0)).epsilon(0.01));
    CHECK(out.num_correct == -1);

    // Shorter sequences are fine.
    CHECK(trainrun::models::logits_of(*m, b.input.narrow(1, 0, 5)).sizes() ==
          torch::IntArrayRef({3, 5, 256}));
    check_trains(*m, b);
  }

  TEST_CASE("attention is causal") {
    torch::manual_seed(1);
    auto m = create<Model>("gpt", small_gpt(), lm_context(16));
    m->train(false);
    torch::NoGradGuard no_grad;
    at::Tensor x = torch::randint(256, {1, 16}, torch::kLong);
    at::Tensor y = x.clone();
    y[0][10] = (x[0][10].item<int64_t>() + 1) % 256;
    at::Tensor lx = trainrun::models::logits_of(*m, x), ly = trainrun::models::logits_of(*m, y);
    CHECK(torch::allclose(lx.narrow(1, 0, 10), ly.narrow(1, 0, 10)));
    CHECK_FALSE(torch::allclose(lx.narrow(1, 10, 6), ly.narrow(1, 10, 6)));
  }

  TEST_CASE("T > block_size is a clear error") {
    auto m = create<Model>("gpt", small_gpt(), lm_context(16));
    std::string msg = error_of([&] { m->forward(lm_batch(2, 17)); });
    CHECK(contains(msg, "block_size = 16"));
    CHECK(contains(msg, "T = 17"));
    // The dataset's sequences longer than the model's block are refused up front.
    CHECK(contains(error_of([&] { create<Model>("gpt", small_gpt(), lm_context(32)); }),
                   "block_size"));
  }

  TEST_CASE("parameters, tied weights, units") {
    auto m = create<Model>("gpt", small_gpt(), lm_context(16));
    auto params = m->named_parameters();
    std::map<std::string, at::Tensor> by_name;
    for (const auto& p : params) by_name[p.name] = p.tensor;
    CHECK(by_name.size() == params.size());
    CHECK(by_name.at("wte.weight").sizes() == torch::IntArrayRef({256, 32}));
    CHECK(by_name.at("wpe.weight").sizes() == torch::IntArrayRef({16, 32}));
    CHECK(by_name.at("blocks.1.attn.c_attn.weight").sizes() == torch::IntArrayRef({96, 32}));
    CHECK(by_name.at("blocks.0.mlp.c_fc.weight").sizes() == torch::IntArrayRef({128, 32}));
    CHECK(by_name.count("lm_head.weight") == 0);
    // GPT-2 init: residual projections are scaled down by sqrt(2 * n_layer).
    CHECK(by_name.at("blocks.0.mlp.c_proj.weight").std().item<double>() ==
          doctest::Approx(0.02 / 2.0).epsilon(0.1));
    CHECK(by_name.at("blocks.0.attn.c_attn.bias").abs().sum().item<double>() == 0.0);

    Overrides untied = small_gpt();
    untied["tie_weights"] = false;
    untied["bias"] = false;
    auto u = create<Model>("gpt", untied, lm_context(16));
    bool has_head = false, has_bias = false;
    for (const auto& p : u->named_parameters()) {
      has_head = has_head || p.name == "lm_head.weight";
      has_bias = has_bias || contains(p.name, "bias");
    }
    CHECK(has_head);
    CHECK_FALSE(has_bias);

    auto units = m->units();
    REQUIRE(units.size() == 2);
    CHECK(units[0]->name() == "blocks.0");
    CHECK(units[1]->name() == "blocks.1");
    CHECK(units[1]->module().parameters()[0].is_same(by_name.at("blocks.1.ln_1.weight")));

    struct Counter : UnitHooks {
      std::vector<std::string> calls;
      void pre_forward(Unit& u) override { calls.push_back("pre " + u.name()); }
      void post_forward(Unit& u) override { calls.push_back("post " + u.name()); }
    } hooks;
    for (Unit* unit : units) unit->set_hooks(&hooks);
    m->forward(lm_batch(1, 4));
    CHECK(hooks.calls ==
          std::vector<std::string>{"pre blocks.0", "post blocks.0", "pre blocks.1", "post blocks.1"});
    for (Unit* unit : units) unit->set_hooks(nullptr);
  }

  TEST_CASE("vocab_size 0 comes from the dataset") {
    auto m = create<Model>("gpt", [] { auto o = small_gpt(); o["vocab_size"] = int64_t(0); return o; }(),
                           lm_context(16, 1000));
    CHECK(trainrun::models::logits_of(*m, torch::zeros({1, 3}, torch::kLong)).size(2) == 1000);
    CHECK(contains(error_of([&] { create<Model>("gpt", small_gpt(), lm_context(16, 1000)); }),
                   "vocab_size"));
  }
}

// =============================================================================================
TEST_SUITE("classifiers") {
  TEST_CASE("mlp and cnn: finite loss, backward reaches every parameter") {
    for (const char* name : {"mlp", "cnn"}) {
      CAPTURE(name);
      torch::manual_seed(0);
      auto m = create<Model>(name, {}, image_context());
      m->train(true);
      Batch b = image_batch(8);
      check_trains(*m, b);
      // Chance level at initialisation.
      m->train(false);
      torch::NoGradGuard no_grad;
      const double mean = m->forward(b).loss_sum.item<double>() / 8.0;
      CHECK(mean == doctest::Approx(std::log(10.0)).epsilon(0.2));
      CHECK(trainrun::models::logits_of(*m, b.input).sizes() == torch::IntArrayRef({8, 10}));
    }
  }

  TEST_CASE("options shape the networks") {
    auto mlp = create<Model>("mlp", {{"hidden", std::vector<int64_t>{16}}, {"dropout", 0.5}},
                             image_context());
    auto params = mlp->named_parameters();
    REQUIRE(params.size() == 4);
    CHECK(params[0].name == "layers.0.weight");
    CHECK(params[0].tensor.sizes() == torch::IntArrayRef({16, 784}));
    CHECK(params[2].tensor.sizes() == torch::IntArrayRef({10, 16}));

    auto cnn = create<Model>("cnn", {{"channels", std::vector<int64_t>{4, 8, 16}}, {"hidden", int64_t(20)}},
                             image_context());
    std::map<std::string, at::Tensor> by_name;
    for (const auto& p : cnn->named_parameters()) by_name[p.name] = p.tensor;
    CHECK(by_name.at("convs.2.weight").sizes() == torch::IntArrayRef({16, 8, 3, 3}));
    CHECK(by_name.at("fc1.weight").sizes() == torch::IntArrayRef({20, 16 * 3 * 3}));
    check_trains(*cnn, image_batch(2));

    auto wrong = image_batch(2);
    wrong.input = torch::randn({2, 1, 27, 28});
    CHECK(contains(error_of([&] { cnn->forward(wrong); }), "expected [B, 1, 28, 28]"));
    RunContext lm = lm_context(16);
    CHECK(contains(error_of([&] { create<Model>("cnn", {}, lm); }), "classification"));
  }
}

// =============================================================================================
TEST_SUITE("determinism") {
  TEST_CASE("same seed, same parameters; another seed, others") {
    for (const char* name : {"mlp", "cnn", "gpt"}) {
      CAPTURE(name);
      const bool gpt = std::string(name) == "gpt";
      RunContext ctx = gpt ? lm_context(16) : image_context();
      Overrides o = gpt ? small_gpt() : Overrides{};
      torch::manual_seed(42);
      auto a = create<Model>(name, o, ctx);
      torch::manual_seed(42);
      auto b = create<Model>(name, o, ctx);
      torch::manual_seed(43);
      auto c = create<Model>(name, o, ctx);
      CHECK(same_parameters(*a, *b));
      CHECK_FALSE(same_parameters(*a, *c));
    }
  }

  TEST_CASE("dropout: same seed, same loss; another seed or eval mode, another") {
    Overrides o = small_gpt();
    o["dropout"] = 0.2;
    torch::manual_seed(5);
    auto m = create<Model>("gpt", o, lm_context(16));
    m->train(true);
    Batch b = lm_batch(2, 16);
    torch::manual_seed(9);
    const double l1 = m->forward(b).loss_sum.item<double>();
    torch::manual_seed(9);
    const double l2 = m->forward(b).loss_sum.item<double>();
    CHECK(l1 == l2);
    // Dropout must act: another seed draws other masks, and evaluation (no dropout) differs from
    // both; a dropout that did nothing would give the same loss all three times.
    torch::manual_seed(10);
    const double l3 = m->forward(b).loss_sum.item<double>();
    CHECK(l3 != l1);
    m->train(false);
    torch::manual_seed(9);
    const double eval = m->forward(b).loss_sum.item<double>();
    torch::manual_seed(10);
    CHECK(m->forward(b).loss_sum.item<double>() == eval);
    CHECK(eval != l1);
  }
}

// =============================================================================================
TEST_SUITE("torchscript") {
  TEST_CASE("loads, trains and names the parameters of a saved module") {
    TempDir dir;
    {
      // What torch.jit.save writes for a one-layer classifier, built here without Python.
      torch::jit::Module s("Linear");
      s.register_parameter("weight", torch::randn({10, 784}) * 0.01, /*is_buffer=*/false);
      s.register_parameter("bias", torch::zeros({10}), false);
      s.define(R"(
        def forward(self, x):
            return torch.matmul(x.flatten(1), self.weight.t()) + self.bias
      )");
      for (const auto& p : s.parameters()) p.requires_grad_(true);
      s.save(dir / "model.pt");
    }
    auto m = create<Model>("torchscript", {{"path", dir / "model.pt"}}, image_context());
    auto params = m->named_parameters();
    REQUIRE(params.size() == 2);
    CHECK(params[0].name == "weight");
    CHECK(params[1].name == "bias");
    CHECK(m->module() == nullptr);
    CHECK(contains(m->describe(), "model.pt"));
    m->train(true);
    check_trains(*m, image_batch(4));
  }

  TEST_CASE("missing or invalid files name the file") {
    TempDir dir;
    const std::string missing = dir / "nope.pt";
    CHECK(contains(error_of([&] { create<Model>("torchscript", {{"path", missing}}, image_context()); }),
                   missing));
    const std::string junk = dir / "junk.pt";
    write_file(junk, iota_bytes(200));
    std::string msg = error_of([&] { create<Model>("torchscript", {{"path", junk}}, image_context()); });
    CHECK(contains(msg, junk));
    CHECK(contains(msg, "not a TorchScript archive"));
  }
}
