// Forward throughput of the quantized Linear bases (quant-nf4, quant-int8) relative to a float32
// Linear of the same shape (issue 9):
//   bench_quant [features = 4096] [tokens = 256] [repeats = 5]
// A [tokens, features] input through a [features, features] layer; the median of `repeats`
// timed forwards after one warm-up, no autograd. The quantized forward dequantizes the whole
// weight every call (bitsandbytes' CPU path does the same), so its cost is the fp32 matmul plus
// one pass over the weight; the ratio printed is fp32 time / quantized time (1 = as fast).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "precisions/quant/quant.hpp"

using namespace trainrun::quant;

static double median_s(const std::function<at::Tensor()>& fn, int repeats) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor y = fn();
    (void)y.sum().item<float>();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  const int64_t f = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 256;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  c10::NoGradGuard no_grad;
  at::manual_seed(0);
  at::Tensor w = at::randn({f, f}) * 0.02, b = at::zeros({f}), x = at::randn({tokens, f});
  const double flops = 2.0 * tokens * f * f;
  std::printf("Linear %lldx%lld, %lld tokens, %d intra-op threads, median of %d\n", (long long)f,
              (long long)f, (long long)tokens, at::get_num_threads(), repeats);
  const double fp32 = median_s([&] { return at::linear(x, w, b); }, repeats);
  std::printf("  %-22s %8.2f ms  %7.1f GFLOP/s  %6.2f bits/parameter  ratio 1.00\n", "fp32 Linear",
              1e3 * fp32, flops / fp32 / 1e9, 32.0);
  Nf4Options o;
  o.double_quant = true;
  Nf4Base nf4(nf4_quantize(w, o, "bench"), at::kFloat);
  Nf4Base nf4_bf16(nf4.tensor(), at::kBFloat16);
  Int8Base int8(int8_quantize(w, "bench"), 6.0, at::kFloat);
  struct Case { const char* name; trainrun::v1::LinearBase* base; } cases[] = {
      {"nf4+dq, fp32 compute", &nf4}, {"nf4+dq, bf16 compute", &nf4_bf16}, {"int8, threshold 6", &int8}};
  for (const auto& c : cases) {
    const double s = median_s([&] { return c.base->forward(x, b); }, repeats);
    std::printf("  %-22s %8.2f ms  %7.1f GFLOP/s  %6.2f bits/parameter  ratio %.2f\n", c.name, 1e3 * s,
                flops / s / 1e9, 8.0 * c.base->storage_bytes() / (double)(f * f), fp32 / s);
  }
  return 0;
}
