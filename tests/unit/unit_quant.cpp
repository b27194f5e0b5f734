// Unit tests of the quant plugin's kernels (NF4, double quantization, int8), the SDK's
// trainrun::v1::Linear and the lora plugin's adapters (issue 9).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdio>
#include <filesystem>

#include "callbacks/lora/lora.hpp"
#include "precisions/quant/quant.hpp"
#include "trainrun/model/module_model.hpp"

using namespace trainrun;
using namespace trainrun::quant;

namespace {

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A model of two trainrun Linear layers (or plain torch::nn::Linear ones).
struct TwoLayers : torch::nn::Module {
  explicit TwoLayers(bool plain) {
    if (plain) {
      p1 = register_module("fc1", torch::nn::Linear(6, 5));
      p2 = register_module("fc2", torch::nn::Linear(5, 3));
    } else {
      l1 = register_module("fc1", v1::Linear(6, 5));
      l2 = register_module("fc2", v1::Linear(5, 3));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (p1) return p2->forward(torch::relu(p1->forward(x)));
    return l2->forward(torch::relu(l1->forward(x)));
  }
  torch::nn::Linear p1{nullptr}, p2{nullptr};
  v1::Linear l1{nullptr}, l2{nullptr};
};

class TwoLayerModel final : public v1::ModuleModel {
 public:
  explicit TwoLayerModel(bool plain) : net(std::make_shared<TwoLayers>(plain)) { set_module(net); }
  v1::ModelOutput forward(const v1::Batch& b) override {
    return v1::cross_entropy_sum(net->forward(b.input), b.target);
  }
  std::string describe() const override { return "two-layer test model"; }
  std::shared_ptr<TwoLayers> net;
};

v1::Options lora_options(int64_t r, double alpha, const std::string& bias,
                         std::vector<std::string> targets = {"all-linear"}) {
  std::map<std::string, v1::OptionValue> m;
  m["r"] = r;
  m["lora_alpha"] = alpha;
  m["lora_dropout"] = 0.0;
  m["target_modules"] = std::move(targets);
  m["use_rslora"] = false;
  m["bias"] = bias;
  m["save_adapter"] = true;
  m["adapter_dir"] = std::string("adapter");
  m["modules_to_save"] = std::vector<std::string>{};
  return v1::Options(m, "[[callbacks]] lora (test)");
}

}  // namespace

TEST_SUITE("nf4") {
  TEST_CASE("code values, nibble order and exact round trip of the codes") {
    CHECK(kNf4Code[7] == 0.0f);
    CHECK(kNf4Code[0] == -1.0f);
    CHECK(kNf4Code[15] == 1.0f);
    CHECK(kNf4Code[8] == doctest::Approx(0.07958029955625534));
    // The 16 code values times 2: every value is its own code, absmax is 2.
    at::Tensor w = at::from_blob(const_cast<float*>(kNf4Code), {16}, at::kFloat).clone() * 2;
    Nf4Options o;
    o.blocksize = 16;
    Nf4Tensor q = nf4_quantize(w, o, "codes");
    REQUIRE(q.packed.numel() == 8);
    const uint8_t expected[8] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF};
    for (int i = 0; i < 8; ++i) CHECK(q.packed[i].item<uint8_t>() == expected[i]);
    CHECK(q.absmax.item<float>() == 2.0f);
    CHECK(at::equal(nf4_dequantize(q), w));
  }

  TEST_CASE("odd count: last low nibble is the code of 0; ties and nearest codes") {
    at::Tensor w = at::tensor({1.0f, -1.0f, 0.5f});
    Nf4Tensor q = nf4_quantize(w, {}, "odd");
    REQUIRE(q.packed.numel() == 2);
    CHECK(q.packed[0].item<uint8_t>() == 0xF0);
    // 0.5 lies below the midpoint of 0.4407 and 0.5626: code 12; the padding nibble is 7.
    CHECK(q.packed[1].item<uint8_t>() == 0xC7);
    at::Tensor d = nf4_dequantize(q);
    CHECK((d.sizes() == w.sizes()));
    CHECK(d[2].item<float>() == doctest::Approx(0.44070982933044434));
  }

  TEST_CASE("all-zero blocks, sizes not a multiple of the block, single-row layers") {
    at::Tensor w = at::zeros({130});
    w.slice(0, 64, 128).normal_();
    Nf4Tensor q = nf4_quantize(w, {}, "zeros");
    CHECK(q.absmax.numel() == 3);
    CHECK(q.absmax[0].item<float>() == 0.0f);
    CHECK(q.packed[0].item<uint8_t>() == 0x77);
    at::Tensor d = nf4_dequantize(q);
    CHECK(at::isfinite(d).all().item<bool>());
    CHECK(at::equal(d.slice(0, 0, 64), at::zeros({64})));
    CHECK(at::equal(d.slice(0, 128), at::zeros({2})));
    at::Tensor row = at::randn({1, 5});
    Nf4Tensor qr = nf4_quantize(row, {}, "row");
    CHECK((nf4_dequantize(qr).sizes() == row.sizes()));
    CHECK((nf4_dequantize(qr) - row).abs().max().item<float>() <=
          row.abs().max().item<float>() * nf4_max_normalized_error() + 1e-6);
    Nf4Options dq;
    dq.double_quant = true;
    CHECK(at::isfinite(nf4_dequantize(nf4_quantize(at::zeros({3, 7}), dq, "z"))).all().item<bool>());
  }

  TEST_CASE("the fused dequantization equals the torch-op reference bit for bit") {
    // Odd sizes, a partial last block, several blocksizes, with and without double quantization.
    for (int64_t bs : {2, 16, 64, 128})
      for (bool dq : {false, true})
        for (int64_t n : {1, 7, 130, 4099}) {
          Nf4Options o;
          o.blocksize = bs;
          o.double_quant = dq;
          o.dq_blocksize = 4;
          at::Tensor w = at::randn({n}) * 3;
          Nf4Tensor q = nf4_quantize(w, o, "w");
          at::Tensor fused = nf4_dequantize(q), ref = nf4_dequantize_reference(q);
          CHECK((fused.sizes() == ref.sizes()));
          CHECK(at::equal(fused, ref));
        }
  }

  TEST_CASE("NaN or Inf weights are an error naming the layer") {
    at::Tensor w = at::randn({4, 4});
    w[1][2] = std::numeric_limits<float>::quiet_NaN();
    const std::string m = message_of([&] { nf4_quantize(w, {}, "blocks.0.attn.c_attn"); });
    CHECK(m.find("layer 'blocks.0.attn.c_attn'") != std::string::npos);
    CHECK(m.find("1 NaN") != std::string::npos);
    w[1][2] = std::numeric_limits<float>::infinity();
    CHECK(message_of([&] { int8_quantize(w, "fc1"); }).find("layer 'fc1'") != std::string::npos);
  }

  TEST_CASE("1024x1024 standard normal, blocksize 64: mean absolute error vs bitsandbytes' 0.0728") {
    torch::manual_seed(0);
    at::Tensor a = at::randn({1024, 1024});
    Nf4Tensor q = nf4_quantize(a, {}, "randn");
    at::Tensor err = (a - nf4_dequantize(q)).abs();
    const double mae = err.mean().item<double>();
    Nf4Options dqo;
    dqo.double_quant = true;
    Nf4Tensor qd = nf4_quantize(a, dqo, "randn");
    const double mae_dq = (a - nf4_dequantize(qd)).abs().mean().item<double>();
    const double bits = 8.0 * static_cast<double>(q.storage_bytes()) / static_cast<double>(a.numel());
    const double bits_dq = 8.0 * static_cast<double>(qd.storage_bytes()) / static_cast<double>(a.numel());
    std::printf("nf4 1024x1024 randn blocksize 64: mean abs error %.5f (bitsandbytes 0.0728, %+.2f%%), "
                "with double quant %.5f; bits/parameter %.4f, with double quant %.4f\n",
                mae, 100 * (mae / 0.0728 - 1), mae_dq, bits, bits_dq);
    CHECK(std::abs(mae / 0.0728 - 1) < 0.02);
    CHECK(bits == doctest::Approx(4.5));
    CHECK(bits_dq == doctest::Approx(4.127).epsilon(0.0005));
    // Per block: no element further from its value than absmax x half the widest code gap.
    at::Tensor block_err = err.reshape({-1, 64}).amax(1);
    at::Tensor bound = q.absmax * nf4_max_normalized_error() + 1e-6;
    CHECK((block_err <= bound).all().item<bool>());
    // Double quantization: the absmax constants within half a dynamic-map step of their block.
    const at::Tensor& map = dynamic_map();
    const double half_gap = ((map.slice(0, 1) - map.slice(0, 0, 255)).max().item<double>()) / 2;
    at::Tensor am_err = (nf4_absmax(qd) - q.absmax).abs();
    at::Tensor am_bound = qd.absmax2.repeat_interleave(256).slice(0, 0, q.absmax.numel()) * half_gap + 1e-6;
    CHECK((am_err <= am_bound).all().item<bool>());
    CHECK(mae_dq < mae * 1.01);
  }

  TEST_CASE("dynamic map: bitsandbytes' signed 8-bit map") {
    const at::Tensor& m = dynamic_map();
    REQUIRE(m.numel() == 256);
    CHECK((m.slice(0, 1) > m.slice(0, 0, 255)).all().item<bool>());
    CHECK(m[255].item<float>() == 1.0f);
    CHECK(m[0].item<float>() == doctest::Approx(-0.99296875));
    CHECK((m == 0).sum().item<int64_t>() == 1);
    CHECK(m.abs().min().item<float>() == 0.0f);
    // The smallest non-zero magnitude: 10^-6 x mean(0.1, 1) = 5.5e-7.
    CHECK(m.abs().masked_fill(m == 0, 1).min().item<float>() == doctest::Approx(5.5e-7));
  }
}

TEST_SUITE("int8") {
  TEST_CASE("row-wise absmax codes and values (LLM.int8() vector-wise)") {
    at::Tensor w = at::tensor({-2.0f, 1.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.25f, -0.125f, 0.1f}).view({3, 3});
    Int8Tensor q = int8_quantize(w, "known");
    const int8_t expected[9] = {-127, 64, 32, 0, 0, 0, 127, -64, 51};  // round half to even
    for (int i = 0; i < 9; ++i) CHECK(q.q.view({-1})[i].item<int8_t>() == expected[i]);
    CHECK(q.scale[0].item<float>() == 2.0f);
    CHECK(q.scale[1].item<float>() == 0.0f);
    at::Tensor d = int8_dequantize(q);
    CHECK(d[0][1].item<float>() == doctest::Approx(64 * 2.0 / 127));
    CHECK(at::equal(d[1], at::zeros({3})));
    torch::manual_seed(1);
    at::Tensor r = at::randn({64, 300});
    Int8Tensor qr = int8_quantize(r, "randn");
    at::Tensor err = (r - int8_dequantize(qr)).abs().amax(1);
    CHECK((err <= qr.scale / 254 + 1e-6).all().item<bool>());
    std::printf("int8 64x300 randn: mean abs error %.5f, bits/parameter %.3f\n",
                (r - int8_dequantize(qr)).abs().mean().item<double>(),
                8.0 * qr.storage_bytes() / r.numel());
  }

  TEST_CASE("outlier columns stay out of the int8 product; gradient reaches the input") {
    at::Tensor w = at::eye(3);
    Int8Tensor q = int8_quantize(w, "eye");
    at::Tensor x = at::tensor({8.0f, 0.1f, 0.2f}).view({1, 3}).requires_grad_(true);
    at::Tensor with = int8_linear(x, q, {}, 6.0, at::kFloat);
    at::Tensor without = int8_linear(x, q, {}, 0.0, at::kFloat);
    const double e_with = (with - x).abs().max().item<double>();
    const double e_without = (without - x).abs().max().item<double>();
    CHECK(with[0][0].item<float>() == 8.0f);  // the outlier column, not quantized
    CHECK(e_with < 0.001);
    CHECK(e_without > 0.01);
    with.sum().backward();
    REQUIRE(x.grad().defined());
    CHECK(at::allclose(x.grad(), at::ones({1, 3})));
  }
}

TEST_SUITE("linear") {
  TEST_CASE("trainrun Linear initialises and computes exactly as torch::nn::Linear") {
    for (bool bias : {true, false}) {
      torch::manual_seed(3);
      torch::nn::Linear a(torch::nn::LinearOptions(7, 5).bias(bias));
      torch::manual_seed(3);
      v1::Linear b(torch::nn::LinearOptions(7, 5).bias(bias));
      CHECK(at::equal(a->weight, b->weight));
      CHECK(b->named_parameters().size() == (bias ? 2u : 1u));
      if (bias) CHECK(at::equal(a->bias, b->bias));
      at::Tensor x = at::randn({4, 7});
      CHECK(at::equal(a->forward(x), b->forward(x)));
    }
  }

  TEST_CASE("an NF4 base: weight parameter gone, frozen storage registered, no gradient to the base") {
    torch::manual_seed(4);
    v1::Linear l(64, 32);
    at::Tensor dense = l->weight.detach().clone();
    Nf4Options o;
    o.double_quant = true;
    auto base = std::make_shared<Nf4Base>(nf4_quantize(l->weight, o, "l"), at::kFloat);
    l->set_base(base, base->buffers());
    // The packed storage and its state are frozen parameters (as bitsandbytes' Params4bit), so
    // sharding strategies shard them as bytes with the layer's unit; only bias trains.
    auto params = l->named_parameters();
    CHECK(params.size() == 5);
    CHECK(params.contains("bias"));
    CHECK(params.contains("weight_nf4"));
    CHECK((params["weight_nf4"].scalar_type() == at::kByte));
    CHECK_FALSE(params["weight_nf4"].requires_grad());
    CHECK(l->named_buffers().size() == 0);
    CHECK_FALSE(l->weight.defined());
    at::Tensor x = at::randn({2, 3, 64}).requires_grad_(true);
    at::Tensor y = l->forward(x);
    at::Tensor xr = x.detach().clone().requires_grad_(true);
    at::Tensor br = l->bias.detach().clone().requires_grad_(true);
    at::Tensor ref = at::linear(xr, base->dequantized_weight(), br);
    CHECK((y - ref).abs().max().item<double>() < 1e-5);
    // The backward dequantizes again (bitsandbytes' MatMul4Bit) instead of keeping a dense
    // weight alive from forward to backward; its gradients are at::linear's.
    const at::Tensor gy = at::randn_like(ref);
    ref.backward(gy);
    y.backward(gy);
    CHECK((x.grad() - xr.grad()).abs().max().item<double>() < 1e-5);
    CHECK((l->bias.grad() - br.grad()).abs().max().item<double>() < 1e-5);
    x.mutable_grad() = at::Tensor();
    l->bias.mutable_grad() = at::Tensor();
    y = l->forward(x);
    CHECK((base->dequantized_weight() - dense).abs().max().item<double>() <=
          dense.abs().max().item<double>() * nf4_max_normalized_error() * 1.02);
    y.sum().backward();
    CHECK(x.grad().defined());
    CHECK(l->bias.grad().defined());
    for (const auto& p : l->named_parameters())
      if (p.key() != "bias") CHECK_FALSE(p.value().grad().defined());
    // bf16 compute: output in the input's dtype, close to the fp32 one.
    auto base16 = std::make_shared<Nf4Base>(base->tensor(), at::kBFloat16);
    at::Tensor y16 = base16->forward(x.detach(), l->bias.detach());
    CHECK((y16.scalar_type() == at::kFloat));
    CHECK((y16 - ref.detach()).abs().max().item<double>() < 0.05);
  }

  TEST_CASE("target_modules: PEFT names, globs, all-linear; plain torch::nn::Linear is an error") {
    using v1::module_name_matches;
    CHECK(module_name_matches("blocks.0.attn.c_attn", {"c_attn"}));
    CHECK(module_name_matches("blocks.0.attn.c_proj", {"attn.c_proj"}));
    CHECK_FALSE(module_name_matches("blocks.0.mlp.c_proj", {"attn.c_proj"}));
    CHECK_FALSE(module_name_matches("blocks.0.attn.c_attn2", {"c_attn"}));
    CHECK(module_name_matches("blocks.1.mlp.c_fc", {"blocks.1.*"}));
    CHECK(module_name_matches("blocks.1.mlp.c_fc", {"c_*"}));
    CHECK(module_name_matches("blocks.1.mlp.c_fc", {"all-linear"}));
    CHECK_FALSE(module_name_matches("lm_head", {"all-linear"}));
    // Classification heads train whole (PEFT's modules_to_save for SEQ_CLS), never adapted.
    CHECK_FALSE(module_name_matches("score", {"all-linear"}));
    CHECK_FALSE(module_name_matches("model.classifier", {"all-linear"}));
    CHECK(module_name_matches("model.layers.0.mlp.scorer", {"all-linear"}));
    TwoLayerModel ours(false);
    CHECK(v1::find_linear_layers(ours, {"fc2"}, {}, "test").size() == 1);
    CHECK(v1::find_linear_layers(ours, {"fc*"}, {"fc1"}, "test").front().name == "fc2");
    TwoLayerModel plain(true);
    const std::string m = message_of([&] { v1::find_linear_layers(plain, {"all-linear"}, {}, "precision 'quant-nf4'"); });
    CHECK(m.find("precision 'quant-nf4': no trainrun Linear layers match target_modules [\"all-linear\"]") != std::string::npos);
    CHECK(m.find("two-layer test model") != std::string::npos);
    CHECK(m.find("torch::nn::Linear") != std::string::npos);
    CHECK(m.find("fc1") != std::string::npos);
  }
}

TEST_SUITE("lora") {
  TEST_CASE("B starts at zero; merged and unmerged forward agree within 1e-5") {
    torch::manual_seed(5);
    for (bool quantized : {false, true}) {
      v1::Linear l(48, 40);
      if (quantized) {
        auto base = std::make_shared<Nf4Base>(nf4_quantize(l->weight, {}, "l"), at::kFloat);
        l->set_base(base, base->buffers());
      }
      at::Tensor x = at::randn({6, 48});
      at::Tensor before = l->forward(x).detach();
      auto adapter = std::make_shared<lora::LoraAdapter>(48, 40, 4, 8.0, 0.0, false);
      l->add_adapter(adapter);
      CHECK(adapter->scaling() == 2.0);
      CHECK(at::equal(l->forward(x), before));
      CHECK(l->named_parameters().contains("lora_A.weight"));
      CHECK((l->named_parameters()["lora_B.weight"].sizes() == at::IntArrayRef({40, 4})));
      {
        torch::NoGradGuard ng;
        adapter->B().normal_(0, 0.5);
      }
      at::Tensor unmerged = l->forward(x);
      at::Tensor merged = at::linear(x, l->merged_weight(), l->bias);
      const double diff = (unmerged - merged).abs().max().item<double>();
      std::printf("lora merged vs unmerged (%s base): max abs difference %.3g\n",
                  quantized ? "nf4" : "dense", diff);
      CHECK(diff < 1e-5);
      CHECK((unmerged - before).abs().max().item<double>() > 0.1);
    }
    CHECK(lora::lora_scaling(4, 8.0, true) == 4.0);
  }

  TEST_CASE("callback: freezes the base, trains adapters (and biases as asked), saves PEFT files") {
    for (std::string bias : {"none", "all", "lora_only"}) {
      torch::manual_seed(6);
      TwoLayerModel model(false);
      v1::RunContext ctx;
      ctx.run_dir = (std::filesystem::temp_directory_path() / "trainrun-unit-lora").string();
      lora::LoraCallback cb(lora_options(2, 4.0, bias, {"fc1"}), ctx);
      cb.on_setup(model, ctx);
      std::set<std::string> trainable;
      for (const auto& p : model.named_parameters())
        if (p.tensor.requires_grad()) trainable.insert(p.name);
      std::set<std::string> expected = {"fc1.lora_A.weight", "fc1.lora_B.weight"};
      if (bias != "none") expected.insert("fc1.bias");
      if (bias == "all") expected.insert("fc2.bias");
      CHECK(trainable == expected);
      CHECK(cb.total_parameters() == 6 * 5 + 5 + 5 * 3 + 3 + 2 * 6 + 5 * 2);
      cb.save(ctx.run_dir + "/adapter-" + bias);
      CHECK(std::filesystem::exists(ctx.run_dir + "/adapter-" + bias + "/adapter_model.safetensors"));
      CHECK(std::filesystem::exists(ctx.run_dir + "/adapter-" + bias + "/adapter_config.json"));
    }
  }
}
