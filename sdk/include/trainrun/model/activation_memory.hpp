#pragma once
// ABI 1.15: a model's own estimate of the activation memory of a training step, which
// `trainrun check` and the report add to the model-state estimate to predict the peak per rank.
// Only the model knows which tensors its layers keep for the backward pass.
#include <cstdint>

namespace trainrun::v1 {

/// What activation_bytes() is asked about: one micro-batch as the run feeds it.
struct ActivationShape {
  int64_t micro_batch_size = 1;  ///< rows per micro-batch
  int64_t seq_len = 0;           ///< tokens per row (a language model), 0 when not a sequence
  double bytes_per_element = 4;  ///< activations' dtype: 4 fp32, 2 under bf16/fp16 autocast
  bool checkpointing = false;    ///< [trainer] activation_checkpointing: units recompute
};

/// Capability of a Model (found with dynamic_cast; since ABI 1.15).
class ActivationMemory {
 public:
  virtual ~ActivationMemory() = default;
  /// Bytes the forward of one micro-batch keeps alive for the backward, at the backward's
  /// start (their most), plus the largest transient of the loss (a chunk of logits): an
  /// estimate from the architecture, not a measurement. Parameters, gradients and optimizer
  /// state are not included. After Korthikanti et al., "Reducing Activation Recomputation in
  /// Large Transformer Models" (MLSys 2023), sec. 4, counted for this implementation's layers.
  virtual double activation_bytes(const ActivationShape& shape) const = 0;
};

}  // namespace trainrun::v1
