#include "fusion.hpp"

#include <trainrun/error.hpp>
#include <trainrun/strategy/strategy_helpers.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

namespace trainrun::plugins::ring_strategy {

using namespace trainrun::v1;

std::vector<std::vector<size_t>> plan_fusion(const std::vector<FusionItem>& items,
                                             int64_t threshold_bytes) {
  TR_CHECK(threshold_bytes >= 0, "plan_fusion: negative threshold (", threshold_bytes, " bytes)");
  struct Open {
    std::vector<size_t> positions;
    int64_t bytes = 0;
  };
  std::map<c10::ScalarType, Open> open;  // one open buffer per dtype (a buffer is one tensor)
  std::vector<std::vector<size_t>> closed;
  auto close = [&](Open& b) {
    if (!b.positions.empty()) closed.push_back(std::move(b.positions));
    b.positions.clear();
    b.bytes = 0;
  };
  for (size_t pos = 0; pos < items.size(); ++pos) {
    Open& b = open[items[pos].dtype];
    // Close rather than overshoot: a buffer never exceeds the threshold unless it holds a
    // single tensor that is larger by itself (Horovod reduces such a tensor on its own).
    if (!b.positions.empty() && b.bytes + items[pos].bytes > threshold_bytes) close(b);
    b.positions.push_back(pos);
    b.bytes += items[pos].bytes;
  }
  for (auto& [dtype, b] : open) close(b);
  std::sort(closed.begin(), closed.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  std::vector<std::vector<size_t>> out;
  for (const auto& positions : closed) {
    out.emplace_back();
    for (size_t pos : positions) out.back().push_back(items[pos].index);
  }
  return out;
}

void FusionBuffers::allocate(const std::vector<at::Tensor>& tensors, int64_t threshold_bytes,
                             const GradientCompression& compression, c10::Device device) {
  std::map<c10::ScalarType, std::pair<int64_t, int64_t>> per_dtype;  // total, largest (elements)
  for (const auto& t : tensors) {
    auto& [total, largest] = per_dtype[t.scalar_type()];
    total += t.numel();
    largest = std::max(largest, t.numel());
  }
  for (const auto& [dtype, tl] : per_dtype) {
    const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t cap = std::max(std::min(tl.first, threshold_bytes / esize), tl.second);
    auto opts = at::TensorOptions().dtype(dtype).device(device);
    fusion_[dtype] = at::zeros({cap}, opts);
    if (compression.applies_to(dtype))
      wire_[dtype] = at::zeros({cap}, opts.dtype(compression.wire_dtype));
  }
}

BufferSpan FusionBuffers::reduce(c10::ScalarType dtype, const std::vector<size_t>& members,
                                 const std::vector<at::Tensor>& grads,
                                 std::vector<TensorTimes>& times, ReduceOp op, int world_size,
                                 const AllReduce& all_reduce) {
  at::Tensor& fused = fusion_.at(dtype);
  BufferSpan span;
  span.t0 = now_us();
  int64_t off = 0;
  for (size_t i : members) {
    const int64_t numel = grads[i].numel();
    times[i].in0 = now_us();
    fused.narrow(0, off, numel).copy_(grads[i].reshape({-1}));
    times[i].in1 = now_us();
    off += numel;
  }
  at::Tensor flat = fused.narrow(0, 0, off);
  auto w = wire_.find(dtype);
  at::Tensor wire;
  if (w != wire_.end()) {
    // Compression as Horovod's fp16 compressor: cast, sum, cast back.
    wire = w->second.narrow(0, 0, off);
    op = GradientCompression::fill_wire(wire, flat, op, world_size);
  } else {
    wire = flat;
  }
  span.red0 = now_us();
  all_reduce(wire, op);
  span.red1 = now_us();
  if (!wire.is_same(flat)) flat.copy_(wire);
  off = 0;
  for (size_t i : members) {
    const int64_t numel = grads[i].numel();
    times[i].red0 = span.red0;
    times[i].red1 = span.red1;
    times[i].out0 = now_us();
    grads[i].copy_(flat.narrow(0, off, numel).view(grads[i].sizes()));
    times[i].out1 = now_us();
    off += numel;
  }
  span.t1 = now_us();
  span.tensors = static_cast<int64_t>(members.size());
  span.bytes = static_cast<int64_t>(wire.nbytes());
  span.dtype = dtype_name(wire.scalar_type());
  return span;
}

}  // namespace trainrun::plugins::ring_strategy
