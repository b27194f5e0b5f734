#pragma once
// A matrix product for a few rows (small_batch_linear.cpp): the decode steps of a small batch.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace trainrun::llama::detail {

/// Rows of x one pass over the weight serves (kept in registers).
constexpr int64_t kSmallBatchRows = 8;

/// Whether this CPU runs small_batch_linear (AVX2 and FMA).
bool small_batch_linear_available();

/// x float32 [..., K] (a few rows, on the CPU) times weight float32 [N, K] transposed -> [..., N],
/// without a bias. Each group of kSmallBatchRows rows reads the weight once. The sums' order
/// differs from BLAS's, so results agree with torch::linear to rounding.
at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& weight);

}  // namespace trainrun::llama::detail
