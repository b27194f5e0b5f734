#pragma once
// Tensor fusion, as Horovod's fusion buffer: the gradients agreed in one negotiation round are
// packed into flat buffers of at most fusion_threshold_mb, one all-reduce each, so that many
// small tensors cost one collective's latency instead of one each.
#include <trainrun/interfaces.hpp>
#include <trainrun/strategy/replicated_strategy.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "timeline.hpp"

namespace trainrun::plugins::ring_strategy {

/// One agreed gradient to be placed in a fusion buffer.
struct FusionItem {
  size_t index = 0;  ///< in the caller's numbering
  int64_t bytes = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

/// Groups `items` (in reduction order) into fusion buffers, Horovod's fusion rule: per dtype,
/// consecutive items while the buffer stays within `threshold_bytes`; an item larger than the
/// threshold goes alone; threshold 0 disables fusion (every item alone). Buffers come in the
/// order of their first item. Pure function (unit-tested).
std::vector<std::vector<size_t>> plan_fusion(const std::vector<FusionItem>& items,
                                             int64_t threshold_bytes);

/// The fusion buffers, allocated once: one flat buffer per dtype, as Horovod keeps one, and its
/// compressed twin where gradient compression applies to that dtype.
class FusionBuffers {
 public:
  /// All-reduces a flat, contiguous tensor over the world with the given op.
  using AllReduce = std::function<void(at::Tensor& wire, v1::ReduceOp op)>;

  /// Sizes each dtype's buffer for `tensors` (every tensor that will be reduced): the
  /// threshold, but no more than all of that dtype's tensors and at least the largest one (a
  /// tensor over the threshold is still reduced through the buffer, alone).
  void allocate(const std::vector<at::Tensor>& tensors, int64_t threshold_bytes,
                const v1::GradientCompression& compression, c10::Device device);
  /// Reduces one planned buffer of `dtype` in place: the gradients `grads[i]` of `members`
  /// (indices into `grads` and `times`) are copied in, reduced with `op` over `world_size` ranks
  /// through `all_reduce` (compressed on the wire where that applies), and copied back. Notes
  /// each member's copy and reduction times; returns the buffer's span (its round left 0).
  BufferSpan reduce(c10::ScalarType dtype, const std::vector<size_t>& members,
                    const std::vector<at::Tensor>& grads, std::vector<TensorTimes>& times,
                    v1::ReduceOp op, int world_size, const AllReduce& all_reduce);

 private:
  std::map<c10::ScalarType, at::Tensor> fusion_;  ///< one buffer per dtype
  std::map<c10::ScalarType, at::Tensor> wire_;    ///< its compressed twin (compression only)
};

}  // namespace trainrun::plugins::ring_strategy
