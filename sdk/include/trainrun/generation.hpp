#pragma once
// Capability of a Model that can decode incrementally with a key/value cache (the `llama`
// plugin): what `trainrun generate` needs to produce text one token per step without running the
// whole sequence again (transformers' past_key_values / DynamicCache, computed the same way).
// Found with dynamic_cast on the Model; header-only and independent of the ABI minor, so
// plugins built against an earlier SDK are unaffected (they simply lack the capability).
// PaddedDecoder (ABI 1.10) adds rows of different lengths in one batch (left padding with an
// attention mask, as transformers' generate batches prompts); the sampling loop over it, shared
// by `trainrun generate` and online RL rollouts, is v1::generate_batch (batch_generation.hpp).
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

/// Incremental decoding of a batch whose rows have different lengths (ABI 1.10): each row is
/// left-padded, and an attention mask says which cache slots hold real tokens, exactly as
/// transformers' generate(input_ids, attention_mask) runs a left-padded batch. Positions (RoPE)
/// count real tokens only: a row's first real token is position 0 whatever its padding.
class PaddedDecoder {
 public:
  virtual ~PaddedDecoder() = default;
  /// ids int64 [B, T] at cache slots state.length() .. state.length() + T - 1; attention_mask
  /// int64 or bool [B, state.length() + T] (1 = a real token, 0 = padding) over every slot so
  /// far, these included -> logits float32 [B, T, vocab_size]. A real token sees the real tokens
  /// at or before its slot; a padding slot's logits are meaningless. A row's padding must come
  /// before its real tokens (left padding). Appends the keys and values to `state` (made by
  /// IncrementalDecoder::new_decode_state of the same model). Runs without autograd. Throws Error
  /// on a shape mismatch, an overflow or a foreign state, as IncrementalDecoder::decode.
  virtual at::Tensor decode_padded(const at::Tensor& ids, const at::Tensor& attention_mask,
                                   DecodeState& state) = 0;
};

/// ABI 1.16. A PaddedDecoder that computes the logits of the last slots only, as transformers'
/// logits_to_keep: a prefill read at its last position (generation) or a scored continuation
/// read at its few (log-likelihoods) skips the output head, the largest matrix of a small model,
/// and the [B, T, vocab_size] tensor for the other slots. Found with dynamic_cast on the model;
/// v1::decode_padded_last (batch_generation.hpp) falls back to decode_padded and narrows.
class LastLogitsDecoder {
 public:
  virtual ~LastLogitsDecoder() = default;
  /// As PaddedDecoder::decode_padded (every new slot's keys and values are cached), returning
  /// the logits of the last `logits_to_keep` of the T new slots only: float32
  /// [B, logits_to_keep, vocab_size], equal to decode_padded's at those slots. Throws Error
  /// unless 1 <= logits_to_keep <= T, and as decode_padded.
  virtual at::Tensor decode_padded_last(const at::Tensor& ids, const at::Tensor& attention_mask,
                                        DecodeState& state, int64_t logits_to_keep) = 0;
};

/// ABI 1.12. A decoder whose cache rows can be repeated after a prefill, so that a prompt with
/// several completions (GRPO's num_generations) is prefilled once and each completion continues
/// from a copy of its keys and values, as prefix caching in vLLM shares them. Found with
/// dynamic_cast on the model; v1::generate_batch uses it when present.
class DecodeStateRepeat {
 public:
  virtual ~DecodeStateRepeat() = default;
  /// Row b of `state` becomes rows b * repeats .. b * repeats + repeats - 1 (torch's
  /// repeat_interleave over the batch), every filled slot copied; the state then holds
  /// batch x repeats rows of the same length and capacity. Throws Error for a state this model
  /// did not make or repeats < 1.
  virtual void repeat_rows(DecodeState& state, int64_t repeats) = 0;
};

}  // namespace trainrun::v1
