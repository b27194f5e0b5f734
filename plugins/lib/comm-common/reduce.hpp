#pragma once
// The element-wise reduction kernels of the collective backends, one set for every transport:
// gloo-cpu's TCP collectives (as Gloo reduce functions) and its shared-memory recv_reduce
// (reduce_bytes) run the same code. One op vocabulary, the SDK's ReduceOp: Avg reduces as Sum,
// the division by the group size comes after the collective.
//  - Sum: signed integer sums wrap (two's complement) as NCCL's do, instead of being undefined
//    behaviour; unsigned ones wrap anyway.
//  - Min / Max: a NaN on either side wins, as at::minimum / at::maximum (and the ring's own
//    reduction on tensors) have it.
//  - float16 and bfloat16 are computed in float and rounded back, as ATen does on the CPU.
#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <trainrun/interfaces.hpp>

namespace trainrun::comm {

/// The type a reduction computes in: float for the 16-bit floats, T itself otherwise.
template <class T>
struct Compute {
  using type = T;
};
template <>
struct Compute<c10::Half> {
  using type = float;
};
template <>
struct Compute<c10::BFloat16> {
  using type = float;
};

struct SumOp {
  template <class A>
  static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A> && std::is_signed_v<A>) {
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return static_cast<A>(a + b);
    }
  }
};
/// Min (kMax false) and Max share the NaN rule, so it is written once.
template <bool kMax>
struct MinMaxOp {
  template <class A>
  static A apply(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
    }
    return (kMax ? a < b : b < a) ? b : a;
  }
};
using MinOp = MinMaxOp<false>;
using MaxOp = MinMaxOp<true>;

/// Gloo's reduce-function signature: c[i] = a[i] op b[i] for i < n elements of T; c may alias
/// a or b.
template <class T, class Op>
void reduce_into(void* c, const void* a, const void* b, size_t n) {
  using A = typename Compute<T>::type;
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<T>(Op::apply(static_cast<A>(x[i]), static_cast<A>(y[i])));
}

/// A reduce function, in Gloo's signature.
using ReduceFunction = void (*)(void*, const void*, const void*, size_t);

/// The kernel of `op` for elements of T (Avg: Sum).
template <class T>
ReduceFunction reduce_function(v1::ReduceOp op) {
  switch (op) {
    case v1::ReduceOp::Min: return &reduce_into<T, MinOp>;
    case v1::ReduceOp::Max: return &reduce_into<T, MaxOp>;
    case v1::ReduceOp::Sum:
    case v1::ReduceOp::Avg: break;
  }
  return &reduce_into<T, SumOp>;
}

/// dst[0 .. bytes) = dst op src, element-wise as `dtype` (Avg: Sum): the kernels above for
/// float32, float64, int32 and int64 (no allocation), ATen's on views of the two buffers for
/// the other dtypes (same results: 16-bit floats computed in float).
void reduce_bytes(void* dst, const void* src, int64_t bytes, c10::ScalarType dtype,
                  v1::ReduceOp op);

/// Avg's second half: `t` /= world_size in place after the Sum (nothing for a world of one).
/// Integers truncate toward zero, as NCCL's ncclAvg does for them.
void divide_in_place(at::Tensor& t, int world_size);

}  // namespace trainrun::comm
