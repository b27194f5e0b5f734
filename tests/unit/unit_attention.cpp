// trainrun::v1::attention (sdk trainrun/model/attention.hpp): what the masks mean, checked on every
// LibTorch through properties that do not depend on how the scores are computed, and on
// LibTorch >= 2.1 the fused at::scaled_dot_product_attention path against the explicit math.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <limits>

#include <trainrun/model/attention.hpp>

using trainrun::v1::attention;
using trainrun::v1::attention_math;
using trainrun::v1::AttentionOptions;

namespace {

at::Tensor randn(std::initializer_list<int64_t> shape, at::ScalarType dtype = at::kFloat) {
  return at::randn(shape, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace

TEST_SUITE("attention_semantics") {
  TEST_CASE("causal: a query's output does not change when later keys and values do") {
    at::manual_seed(1);
    auto q = randn({2, 3, 7, 8}), k = randn({2, 3, 7, 8}), v = randn({2, 3, 7, 8});
    at::Tensor out = attention(q, k, v);
    const int64_t t = 3;
    at::Tensor k2 = k.clone(), v2 = v.clone();
    k2.narrow(2, t + 1, 7 - t - 1).normal_();
    v2.narrow(2, t + 1, 7 - t - 1).normal_();
    at::Tensor out2 = attention(q, k2, v2);
    CHECK(max_abs_diff(out.narrow(2, 0, t + 1), out2.narrow(2, 0, t + 1)) < 1e-6);
    // ...and the later positions do change (the perturbation reached them).
    CHECK(max_abs_diff(out.narrow(2, t + 1, 1), out2.narrow(2, t + 1, 1)) > 1e-3);
  }

  TEST_CASE("equal scores: query t gets the mean of values 0..t") {
    at::manual_seed(2);
    auto q = at::zeros({1, 2, 5, 4}), k = randn({1, 2, 5, 4}), v = randn({1, 2, 5, 4});
    at::Tensor out = attention(q, k, v);
    for (int64_t t = 0; t < 5; ++t)
      CHECK(max_abs_diff(out.select(2, t), v.narrow(2, 0, t + 1).mean(2)) < 1e-6);
  }

  TEST_CASE("KV cache: the last query over all keys equals the last row of full attention") {
    at::manual_seed(3);
    auto q = randn({2, 4, 6, 8}), k = randn({2, 4, 6, 8}), v = randn({2, 4, 6, 8});
    at::Tensor full = attention(q, k, v);
    at::Tensor last = attention(q.narrow(2, 5, 1), k, v);
    CHECK(max_abs_diff(full.narrow(2, 5, 1), last) < 1e-5);
    at::Tensor two = attention(q.narrow(2, 4, 2), k, v);
    CHECK(max_abs_diff(full.narrow(2, 4, 2), two) < 1e-5);
  }

  TEST_CASE("grouped-query attention equals attention with the key/value heads repeated") {
    at::manual_seed(4);
    auto q = randn({2, 6, 5, 8}), k = randn({2, 2, 5, 8}), v = randn({2, 2, 5, 8});
    at::Tensor gqa = attention(q, k, v);
    at::Tensor rep = attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1));
    CHECK(max_abs_diff(gqa, rep) < 1e-6);
  }

  TEST_CASE("a bool mask and the equal additive mask give the same output") {
    at::manual_seed(5);
    auto q = randn({2, 2, 5, 8}), k = randn({2, 2, 5, 8}), v = randn({2, 2, 5, 8});
    // Padding: the first key of batch 1 is hidden from every query.
    at::Tensor allow = at::ones({2, 1, 1, 5}, at::TensorOptions().dtype(at::kBool));
    allow[1][0][0][0] = false;
    at::Tensor additive = at::zeros({2, 1, 1, 5}).masked_fill(allow.logical_not(),
                                                              -std::numeric_limits<float>::infinity());
    AttentionOptions ob, oa;
    ob.mask = allow;
    oa.mask = additive;
    at::Tensor by_bool = attention(q, k, v, ob), by_add = attention(q, k, v, oa);
    CHECK(max_abs_diff(by_bool.narrow(2, 1, 4), by_add.narrow(2, 1, 4)) < 1e-6);
    // Batch 0 is unmasked, so it equals plain causal attention.
    CHECK(max_abs_diff(by_bool[0], attention(q, k, v)[0]) < 1e-6);
    // Batch 1, query 1 sees only key 1 (key 0 is hidden): its output is v[1, :, 1].
    CHECK(max_abs_diff(by_bool[1].select(1, 1), v[1].select(1, 1)) < 1e-6);
  }

  TEST_CASE("sliding window: a query sees only the last `window` keys") {
    at::manual_seed(6);
    auto q = at::zeros({1, 1, 6, 4}), k = randn({1, 1, 6, 4}), v = randn({1, 1, 6, 4});
    AttentionOptions o;
    o.window = 2;
    at::Tensor out = attention(q, k, v, o);
    CHECK(max_abs_diff(out.select(2, 5), v.narrow(2, 4, 2).mean(2)) < 1e-6);
    CHECK(max_abs_diff(out.select(2, 0), v.select(2, 0)) < 1e-6);
  }

  TEST_CASE("softcap: the scaled scores pass through cap * tanh(s / cap) before the softmax") {
    at::manual_seed(5);
    auto q = randn({1, 2, 5, 4}) * 3, k = randn({1, 2, 5, 4}) * 3, v = randn({1, 2, 5, 4});
    AttentionOptions o;
    o.scale = 0.7;
    o.softcap = 1.5;
    at::Tensor s = at::matmul(q, k.transpose(-2, -1)) * 0.7;
    s = at::tanh(s / 1.5) * 1.5;
    s = s.masked_fill(at::ones({5, 5}, at::kBool).triu(1), -std::numeric_limits<float>::infinity());
    const at::Tensor ref = at::matmul(at::softmax(s, -1), v);
    CHECK(max_abs_diff(attention(q, k, v, o), ref) < 1e-6);
    o.softcap.reset();
    CHECK(max_abs_diff(attention(q, k, v, o), ref) > 1e-2);  // the cap bites on these scores
    o.softcap = -1.0;
    CHECK_THROWS_WITH(attention(q, k, v, o), doctest::Contains("softcap must be positive"));
  }

  TEST_CASE("not causal: every query sees every key") {
    at::manual_seed(7);
    auto q = at::zeros({1, 1, 3, 4}), k = randn({1, 1, 5, 4}), v = randn({1, 1, 5, 4});
    AttentionOptions o;
    o.causal = false;
    at::Tensor out = attention(q, k, v, o);
    for (int64_t t = 0; t < 3; ++t) CHECK(max_abs_diff(out.select(2, t), v.mean(2)) < 1e-6);
  }

  TEST_CASE("bad shapes and dtypes are errors naming the tensors") {
    auto q = randn({1, 3, 4, 8}), k = randn({1, 2, 4, 8});
    CHECK_THROWS_WITH(attention(q, k, k), doctest::Contains("not a multiple of 2 key/value heads"));
    CHECK_THROWS_WITH(attention(randn({1, 2, 4}), k, k), doctest::Contains("[batch, heads"));
    CHECK_THROWS_WITH(attention(randn({1, 2, 5, 8}), k, k), doctest::Contains("needs at least"));
    AttentionOptions o;
    o.mask = at::zeros({1, 1, 4, 4}, at::TensorOptions().dtype(at::kLong));
    CHECK_THROWS_WITH(attention(randn({1, 2, 4, 8}), k, k, o), doctest::Contains("mask has dtype"));
  }
}

#if TRAINRUN_HAS_SDPA
// The fused path (at::scaled_dot_product_attention) against the explicit math, values and
// gradients, for every masking form attention() sends through a different SDPA call.
TEST_SUITE("attention_sdpa") {
  void compare(const AttentionOptions& o, int64_t tq, int64_t tk, int64_t h, int64_t hkv,
               at::ScalarType dtype, double tol) {
    at::manual_seed(11);
    auto q = randn({2, h, tq, 16}, dtype).requires_grad_(true);
    auto k = randn({2, hkv, tk, 16}, dtype).requires_grad_(true);
    auto v = randn({2, hkv, tk, 16}, dtype).requires_grad_(true);
    at::Tensor a = attention(q, k, v, o), b = attention_math(q, k, v, o);
    CHECK(a.sizes() == b.sizes());
    CHECK(static_cast<bool>(a.scalar_type() == dtype));
    CHECK(max_abs_diff(a, b) < tol);
    at::Tensor g = randn({2, h, tq, 16}, dtype);
    auto ga = torch::autograd::grad({a}, {q, k, v}, {g});
    auto gb = torch::autograd::grad({b}, {q, k, v}, {g});
    for (size_t i = 0; i < 3; ++i) CHECK(max_abs_diff(ga[i], gb[i]) < 4 * tol);
  }

  TEST_CASE("causal square (SDPA's is_causal), float32") {
    compare({}, 9, 9, 4, 4, at::kFloat, 1e-5);
  }
  TEST_CASE("causal with a KV cache (explicit bottom-right mask), float32") {
    compare({}, 3, 9, 4, 4, at::kFloat, 1e-5);
  }
  TEST_CASE("grouped-query attention and a sliding window, float32") {
    AttentionOptions o;
    o.window = 4;
    compare(o, 9, 9, 4, 2, at::kFloat, 1e-5);
  }
  TEST_CASE("bool padding mask with causal, float32") {
    AttentionOptions o;
    at::Tensor allow = at::ones({2, 1, 1, 9}, at::TensorOptions().dtype(at::kBool));
    allow.narrow(3, 0, 2)[1].fill_(false);
    o.mask = allow;
    compare(o, 7, 9, 4, 4, at::kFloat, 1e-5);
  }
  TEST_CASE("additive mask without causal, float32") {
    AttentionOptions o;
    o.causal = false;
    o.mask = at::randn({1, 1, 9, 9});
    compare(o, 9, 9, 2, 2, at::kFloat, 1e-5);
  }
  TEST_CASE("causal square, bfloat16 (both paths round to bfloat16)") {
    compare({}, 9, 9, 4, 4, at::kBFloat16, 3e-2);
  }
}
#endif
