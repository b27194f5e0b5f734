#pragma once
// What a token model needs to honour packed and masked batches (Batch's ABI 1.6 fields): the
// positions of each token, and the attention mask that keeps the samples of a packed row apart.
// Reference: transformers' position_ids and the block-diagonal causal mask its packing
// collators (DataCollatorWithFlattening) rely on.
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>

#include "trainrun/error.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/types.hpp"

namespace trainrun::v1 {

/// Boolean attention mask, true where query i must NOT see key j: j > i (causal); with
/// `segment_ids` (int64 [B, T]) also where the two tokens belong to different segments of the
/// row; with window > 0 also where i - j >= window (sliding window, Mistral). Shape [T, T]
/// without segment ids, else [B, 1, T, T] (broadcasts over heads). Every row keeps its diagonal,
/// so a softmax over it never sees only -inf. Throws Error when segment_ids is not [B, T].
inline at::Tensor attention_blocked(int64_t T, c10::Device device, const at::Tensor& segment_ids,
                                    int64_t window = 0) {
  at::Tensor i = at::arange(T, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(1);
  at::Tensor j = i.transpose(0, 1);
  at::Tensor blocked = j > i;
  if (window > 0) blocked = blocked.logical_or((i - j) >= window);
  if (!segment_ids.defined()) return blocked;
  TR_CHECK(segment_ids.dim() == 2 && segment_ids.size(1) == T, "segment_ids must be [B, ", T,
           "], got ", segment_ids.sizes());
  const at::Tensor seg = segment_ids.to(device);
  const at::Tensor other = seg.unsqueeze(2).ne(seg.unsqueeze(1));  // [B, T, T]
  return blocked.unsqueeze(0).logical_or(other).unsqueeze(1);
}

/// The positions to use for a [B, T] batch: batch.position_ids when present (moved to `device`),
/// else 0..T-1 as int64 [1, T] (broadcasts over the rows). Throws Error when position_ids is
/// not [B, T] like the input.
inline at::Tensor positions_of(const Batch& batch, int64_t B, int64_t T, c10::Device device) {
  if (!batch.position_ids.defined())
    return at::arange(T, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0);
  TR_CHECK(batch.position_ids.dim() == 2 && batch.position_ids.size(0) == B &&
               batch.position_ids.size(1) == T,
           "position_ids must be [", B, ", ", T, "] like the input, got ", batch.position_ids.sizes());
  return batch.position_ids.to(device, at::kLong);
}

/// Base for a Model that honours Batch's ABI 1.6 fields: remembers what the core says through
/// BatchFieldsReader and gives the fields, or undefined tensors when the strategy's copies of
/// the batch cannot carry them.
class BatchFieldsReaderBase : public BatchFieldsReader {
 public:
  void set_batch_fields_available(bool available) override { batch_fields_ = available; }

 protected:
  /// Batch::position_ids, or undefined when the fields are unavailable.
  at::Tensor position_ids(const Batch& b) const { return batch_fields_ ? b.position_ids : at::Tensor(); }
  /// Batch::segment_ids, or undefined when the fields are unavailable.
  at::Tensor segment_ids(const Batch& b) const { return batch_fields_ ? b.segment_ids : at::Tensor(); }
  /// The batch with the 1.6 fields cleared when unavailable (never read from an older copy).
  Batch fields_of(const Batch& b) const {
    Batch out;
    out.input = b.input;
    out.target = b.target;
    out.num_samples = b.num_samples;
    out.num_targets = b.num_targets;
    out.num_tokens = b.num_tokens;
    if (batch_fields_) out.position_ids = b.position_ids, out.segment_ids = b.segment_ids;
    return out;
  }

 private:
  bool batch_fields_ = true;
};

}  // namespace trainrun::v1
