#include "reduce.hpp"

#include <ATen/ATen.h>

namespace trainrun::comm {

namespace {
template <class T>
void reduce_as(void* dst, const void* src, int64_t bytes, v1::ReduceOp op) {
  reduce_function<T>(op)(dst, dst, src, static_cast<size_t>(bytes) / sizeof(T));
}
}  // namespace

void reduce_bytes(void* dst, const void* src, int64_t bytes, c10::ScalarType dtype,
                  v1::ReduceOp op) {
  switch (dtype) {
    case c10::kFloat: return reduce_as<float>(dst, src, bytes, op);
    case c10::kDouble: return reduce_as<double>(dst, src, bytes, op);
    case c10::kInt: return reduce_as<int32_t>(dst, src, bytes, op);
    case c10::kLong: return reduce_as<int64_t>(dst, src, bytes, op);
    default: break;
  }
  // The rest through ATen on views of the two buffers (its 16-bit kernels are vectorised and
  // parallel; the results equal the kernels above: computed in float, rounded back).
  const int64_t n = bytes / static_cast<int64_t>(c10::elementSize(dtype));
  const auto opts = at::TensorOptions().dtype(dtype);
  at::Tensor d = at::from_blob(dst, {n}, opts);
  const at::Tensor s = at::from_blob(const_cast<void*>(src), {n}, opts);
  switch (op) {
    case v1::ReduceOp::Sum:
    case v1::ReduceOp::Avg: d.add_(s); return;
    case v1::ReduceOp::Min: at::minimum_out(d, d, s); return;
    case v1::ReduceOp::Max: at::maximum_out(d, d, s); return;
  }
}

void divide_in_place(at::Tensor& t, int world_size) {
  if (world_size == 1) return;
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
    t.div_(world_size, "trunc");
  else
    t.div_(world_size);
}

}  // namespace trainrun::comm
