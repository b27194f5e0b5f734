// y = x W^T for a few rows of x (the decode steps of a small batch), reading W once. OpenBLAS
// 0.3.21's sgemm packs the whole weight on every call, which at 8 rows made each decode step
// about 1.8 times slower than transformers' with MKL; here each row of W is loaded once and
// multiplied into up to 8 rows of x held in registers, so the step is bound by reading the
// weights, as the single-row matrix-vector path is. x86-64 with AVX2 and FMA only (checked at run
// time); elsewhere the caller uses the layer's own forward.
#include "small_batch_linear.hpp"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace trainrun::llama::detail {

namespace {

// Rows n0 .. n1 - 1 of W [N, K] against the M rows of x [M, K]: y[m, n] (row stride N).
template <int M>
__attribute__((target("avx2,fma"))) void rows_kernel(const float* x, const float* w, int64_t K,
                                                     int64_t N, int64_t n0, int64_t n1, float* y) {
  for (int64_t n = n0; n < n1; ++n) {
    const float* wr = w + n * K;
    __m256 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      const __m256 wv = _mm256_loadu_ps(wr + k);
      for (int m = 0; m < M; ++m)
        acc[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * K + k), acc[m]);
    }
    for (int m = 0; m < M; ++m) {
      // Horizontal sum of the 8 lanes, then the tail.
      __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[m]), _mm256_extractf128_ps(acc[m], 1));
      s = _mm_add_ps(s, _mm_movehl_ps(s, s));
      s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
      float total = _mm_cvtss_f32(s);
      for (int64_t kk = k; kk < K; ++kk) total += wr[kk] * x[m * K + kk];
      y[m * N + n] = total;
    }
  }
}

using Kernel = void (*)(const float*, const float*, int64_t, int64_t, int64_t, int64_t, float*);

template <int... Ms>
Kernel kernel_for(int m, std::integer_sequence<int, Ms...>) {
  Kernel k = nullptr;
  ((m == Ms + 1 ? (k = &rows_kernel<Ms + 1>) : k), ...);
  return k;
}

}  // namespace

bool small_batch_linear_available() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t K = x.size(-1), rows = x.numel() / K, N = weight.size(0);
  const at::Tensor xc = x.reshape({rows, K}).contiguous();
  const at::Tensor wc = weight.contiguous();
  at::Tensor y = at::empty({rows, N}, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Groups of at most kSmallBatchRows rows of x, each a pass over W.
  for (int64_t r0 = 0; r0 < rows; r0 += kSmallBatchRows) {
    const int m = static_cast<int>(std::min<int64_t>(kSmallBatchRows, rows - r0));
    const Kernel kernel =
        kernel_for(m, std::make_integer_sequence<int, static_cast<int>(kSmallBatchRows)>{});
    // y rows r0 .. r0 + m - 1 start at yp + r0 * N, with row stride N.
    at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
      kernel(xp + r0 * K, wp, K, N, n0, n1, yp + r0 * N);
    });
  }
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

}  // namespace trainrun::llama::detail
