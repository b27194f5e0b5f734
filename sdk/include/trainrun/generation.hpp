#pragma once
// Capability of a Model that can decode incrementally with a key/value cache (the `llama`
// plugin): what `trainrun generate` needs to produce text one token per step without running the
// whole sequence again (transformers' past_key_values / DynamicCache, computed the same way).
// Found with dynamic_cast on the Model; header-only and independent of the ABI minor, so
// plugins built against an earlier SDK are unaffected (they simply lack the capability).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace trainrun::v1 {

/// The keys and values of every layer for the tokens decoded so far, for one batch of
/// sequences that advance together. Owned by the caller, opaque to it; only the model that
/// made it may use it.
class DecodeState {
 public:
  virtual ~DecodeState() = default;
  /// Tokens per sequence already in the cache (the position the next token gets).
  virtual int64_t length() const = 0;
  /// Tokens per sequence the cache can hold (new_decode_state's max_length).
  virtual int64_t capacity() const = 0;
};

/// Incremental decoding: prefill the prompt, then one token per call.
class IncrementalDecoder {
 public:
  virtual ~IncrementalDecoder() = default;
  /// A cache for `batch_size` sequences of at most `max_length` tokens each (prompt plus
  /// generated), on the model's device and in its dtype. Memory: 2 x layers x batch_size x
  /// max_length x key/value heads x head_dim elements. Throws Error when batch_size or
  /// max_length is not positive.
  virtual std::unique_ptr<DecodeState> new_decode_state(int64_t batch_size, int64_t max_length) = 0;
  /// ids int64 [B, T]: the next T tokens of each sequence, at positions state.length() ..
  /// state.length() + T - 1 (T = prompt length for the prefill, then 1) -> logits float32
  /// [B, T, vocab_size], equal (to rounding) to the full forward's logits at those positions.
  /// Appends the tokens' keys and values to `state`. Runs without autograd. Throws Error when B
  /// differs from the state's batch, the state would overflow, or `state` is not this model's.
  virtual at::Tensor decode(const at::Tensor& ids, DecodeState& state) = 0;
};

}  // namespace trainrun::v1
