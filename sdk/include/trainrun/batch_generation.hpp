#pragma once
// Batched generation over a PaddedDecoder (generation.hpp, ABI 1.10): prompts of different
// lengths left-padded into one batch with a KV cache, `num_generations` completions per prompt,
// greedy or sampled with transformers' logits warpers in their order (temperature, then top-k,
// then top-p; Holtzman et al. 2020 for the nucleus), stopping a row at an EOS id, at a stop
// predicate (stop strings need the tokenizer, so the caller decides) or after
// max_completion_length tokens. The option names are TRL's / transformers' GenerationConfig
// names. Header-only: `trainrun generate` and online RL rollouts share it. The model runs in
// whatever state the caller left it (eval mode, adapters active or not): generation goes through
// the model's own modules, LoRA adapters included.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/generation.hpp"

namespace trainrun::v1 {

/// `decoder`'s LastLogitsDecoder::decode_padded_last (ABI 1.16) when it has one, else
/// decode_padded narrowed to the last `logits_to_keep` slots: float32 [B, logits_to_keep,
/// vocab_size] either way. Throws Error unless 1 <= logits_to_keep <= ids.size(1), and as
/// decode_padded.
inline at::Tensor decode_padded_last(PaddedDecoder& decoder, const at::Tensor& ids,
                                     const at::Tensor& attention_mask, DecodeState& state,
                                     int64_t logits_to_keep) {
  TR_CHECK(ids.dim() == 2 && logits_to_keep >= 1 && logits_to_keep <= ids.size(1),
           "decode_padded_last: logits_to_keep ", logits_to_keep, " for ids ", ids.sizes());
  if (auto* last = dynamic_cast<LastLogitsDecoder*>(&decoder))
    return last->decode_padded_last(ids, attention_mask, state, logits_to_keep);
  at::Tensor logits = decoder.decode_padded(ids, attention_mask, state);
  return logits.narrow(1, logits.size(1) - logits_to_keep, logits_to_keep);
}

/// What to generate. Token ids are int64 and must be below the model's vocabulary size.
struct GenerationRequest {
  /// The prompts' token ids, each non-empty.
  std::vector<std::vector<int64_t>> prompts;
  /// Completions per prompt (TRL's num_generations); completion c belongs to prompt
  /// c / num_generations.
  int64_t num_generations = 1;
  /// New tokens per completion at most (TRL's max_completion_length, transformers'
  /// max_new_tokens).
  int64_t max_completion_length = 16;
  /// New tokens before which the EOS ids cannot be chosen (their logits -inf, as transformers'
  /// MinNewTokensLengthLogitsProcessor); 0: none.
  int64_t min_new_tokens = 0;
  /// 0: greedy (arg-max, transformers' do_sample=False); > 0: sample from softmax(logits / T).
  double temperature = 0.0;
  /// Sampling: keep the top_k most likely tokens (0: all), as TopKLogitsWarper (ties at the k-th
  /// value are kept).
  int64_t top_k = 0;
  /// Sampling: keep the smallest set of most likely tokens whose probability reaches top_p (the
  /// most likely one always), as TopPLogitsWarper; 1 keeps all.
  double top_p = 1.0;
  /// A row stops after emitting any of these (the EOS token is part of its completion).
  std::vector<int64_t> eos_token_ids;
  /// Filler for the left padding and for rows that stopped while others go on.
  int64_t pad_token_id = 0;
  /// Completion c samples from its own generator seeded from (seed, c), so a completion's tokens
  /// do not depend on batch_size or on which other completions share its batch.
  uint64_t seed = 0;
  /// Completions decoded together (one KV cache); 0: all of them at once.
  int64_t batch_size = 0;
  /// Optional: called after each token of a still-running completion with its index and its
  /// tokens so far; true stops it with finish "stop" (stop strings).
  std::function<bool(int64_t completion, const std::vector<int64_t>& ids)> stop;
  /// Optional: one seed per completion (prompts x num_generations of them), used instead of
  /// (seed, c), so that a completion's draws do not depend on which request holds it either (an
  /// online rollout seeds each by the prompt's place in the global batch: the same completions
  /// at any world size).
  std::vector<uint64_t> completion_seeds;
};

/// One completion: its new tokens and why it ended ("eos", "stop" or "length").
struct Completion {
  int64_t prompt = 0;
  std::vector<int64_t> ids;
  std::string finish = "length";
};

/// The completions, prompt-major (prompt 0's num_generations first), and where time went.
struct GenerationResult {
  std::vector<Completion> completions;
  /// Real (unpadded) prompt tokens prefilled (each prompt once per batch when its completions
  /// share a prefill, DecodeStateRepeat), and new tokens decoded after each batch's first.
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_s = 0, decode_s = 0;
};

namespace detail {

// SplitMix64 (Steele et al. 2014) mixes the seed and the completion index into one generator
// seed, so neighbouring completions do not get neighbouring Mersenne Twister seeds.
inline uint64_t mix_seed(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// As TopPLogitsWarper on scores [B, n]: in ascending order, the tokens whose cumulative
// probability (the less likely ones included) is <= 1 - top_p get -inf; the most likely stays.
inline at::Tensor top_p_filter(const at::Tensor& scores, double top_p) {
  auto [sorted, order] = scores.sort(-1, /*descending=*/false);
  at::Tensor drop = sorted.softmax(-1).cumsum(-1) <= (1.0 - top_p);
  drop.narrow(-1, drop.size(-1) - 1, 1).fill_(false);
  return scores.masked_fill(drop.scatter(-1, order, drop),
                            -std::numeric_limits<double>::infinity());
}

}  // namespace detail

/// logits float32 [B, V] -> the probabilities generate_batch samples from, float32 [B, V]:
/// softmax(logits / temperature) after top-k and top-p removed tokens (their probability 0).
/// temperature must be > 0.
inline at::Tensor sampling_probabilities(const at::Tensor& logits, double temperature,
                                         int64_t top_k, double top_p) {
  at::Tensor scores = logits.to(at::kFloat) / temperature;
  if (top_k > 0 && top_k < scores.size(-1)) {
    auto [values, index] = scores.topk(top_k, -1);
    const at::Tensor kth = values.narrow(-1, top_k - 1, 1);
    // TopKLogitsWarper keeps every token tied with the k-th value; without such ties the k
    // values stand for the whole vocabulary, and top-p sorts k values instead of V per step.
    if ((scores >= kth).sum().item<int64_t>() == top_k * scores.size(0)) {
      if (top_p < 1.0) values = detail::top_p_filter(values, top_p);
      return at::zeros_like(scores).scatter(-1, index, values.softmax(-1));
    }
    scores = scores.masked_fill(scores < kth, -std::numeric_limits<double>::infinity());
  }
  if (top_p < 1.0) scores = detail::top_p_filter(scores, top_p);
  return scores.softmax(-1);
}

/// Generates req.prompts x req.num_generations completions with `decoder`, which must also be a
/// PaddedDecoder (the llama model is). Throws Error on bad options (naming them) or when the
/// decoder is not a PaddedDecoder; the model's own errors pass through.
inline GenerationResult generate_batch(IncrementalDecoder& decoder, const GenerationRequest& req) {
  auto* padded = dynamic_cast<PaddedDecoder*>(&decoder);
  TR_CHECK(padded, "generate: the model does not decode padded batches (v1::PaddedDecoder)");
  TR_CHECK(req.num_generations > 0, "generate: num_generations must be positive, got ",
           req.num_generations);
  TR_CHECK(req.max_completion_length > 0, "generate: max_completion_length must be positive, got ",
           req.max_completion_length);
  TR_CHECK(req.temperature >= 0, "generate: temperature must be >= 0, got ", req.temperature);
  TR_CHECK(req.top_k >= 0, "generate: top_k must be >= 0, got ", req.top_k);
  TR_CHECK(req.top_p > 0 && req.top_p <= 1, "generate: top_p must be in (0, 1], got ", req.top_p);
  TR_CHECK(req.batch_size >= 0, "generate: batch_size must be >= 0, got ", req.batch_size);
  for (size_t i = 0; i < req.prompts.size(); ++i)
    TR_CHECK(!req.prompts[i].empty(), "generate: prompt ", i, " has no tokens");
  TR_CHECK(req.completion_seeds.empty() ||
               static_cast<int64_t>(req.completion_seeds.size()) ==
                   static_cast<int64_t>(req.prompts.size()) * req.num_generations,
           "generate: ", req.completion_seeds.size(), " completion seeds for ",
           req.prompts.size() * req.num_generations, " completions");
  GenerationResult out;
  const int64_t total = static_cast<int64_t>(req.prompts.size()) * req.num_generations;
  out.completions.resize(static_cast<size_t>(total));
  const int64_t chunk = req.batch_size > 0 ? req.batch_size : std::max<int64_t>(total, 1);
  const bool sample = req.temperature > 0;
  using clock = std::chrono::steady_clock;
  for (int64_t first = 0; first < total; first += chunk) {
    const int64_t B = std::min(chunk, total - first);
    int64_t P = 0;
    for (int64_t r = 0; r < B; ++r) {
      Completion& c = out.completions[static_cast<size_t>(first + r)];
      c.prompt = (first + r) / req.num_generations;
      P = std::max<int64_t>(P, static_cast<int64_t>(req.prompts[c.prompt].size()));
    }
    // Left padding: row r's prompt ends at slot P - 1.
    std::vector<int64_t> ids(static_cast<size_t>(B * P), req.pad_token_id), mask(ids.size(), 0);
    std::vector<at::Generator> gens;
    int64_t chunk_tokens = 0;
    for (int64_t r = 0; r < B; ++r) {
      const auto& p = req.prompts[out.completions[static_cast<size_t>(first + r)].prompt];
      const int64_t off = r * P + P - static_cast<int64_t>(p.size());
      std::copy(p.begin(), p.end(), ids.begin() + off);
      std::fill(mask.begin() + off, mask.begin() + (r + 1) * P, 1);
      chunk_tokens += static_cast<int64_t>(p.size());
      if (sample)
        gens.push_back(at::detail::createCPUGenerator(
            req.completion_seeds.empty()
                ? detail::mix_seed(req.seed, static_cast<uint64_t>(first + r))
                : req.completion_seeds[static_cast<size_t>(first + r)]));
    }
    auto t0 = clock::now();
    at::Tensor attention = at::tensor(mask, at::kLong).view({B, P});
    at::Tensor all_ids = at::tensor(ids, at::kLong).view({B, P});
    // A chunk of whole groups prefills each prompt once and repeats its cache rows (ABI 1.12
    // DecodeStateRepeat): num_generations times less prefill, the same logits row by row.
    const int64_t G = req.num_generations;
    auto* repeat = dynamic_cast<DecodeStateRepeat*>(&decoder);
    const bool share = repeat != nullptr && G > 1 && first % G == 0 && B % G == 0;
    std::unique_ptr<DecodeState> state =
        decoder.new_decode_state(share ? B / G : B, P + req.max_completion_length);
    out.prefill_tokens += share ? chunk_tokens / G : chunk_tokens;
    at::Tensor logits;
    if (share) {
      const at::Tensor one = at::arange(0, B, G, at::kLong);
      logits = decode_padded_last(*padded, all_ids.index_select(0, one),
                                  attention.index_select(0, one), *state, 1)
                   .repeat_interleave(G, 0);
      repeat->repeat_rows(*state, G);
    } else {
      logits = decode_padded_last(*padded, all_ids, attention, *state, 1);
    }
    std::vector<char> running(static_cast<size_t>(B), 1);
    int64_t left = B;
    for (int64_t step = 0;; ++step) {
      at::Tensor last = logits.select(1, logits.size(1) - 1);  // [B, V]
      if (step < req.min_new_tokens && !req.eos_token_ids.empty())
        last = last.index_fill(-1, at::tensor(req.eos_token_ids, at::kLong).to(last.device()),
                               -std::numeric_limits<double>::infinity());
      std::vector<int64_t> next(static_cast<size_t>(B), req.pad_token_id);
      if (!sample) {
        const at::Tensor arg = last.argmax(-1).to(at::kCPU).contiguous();
        const int64_t* a = arg.data_ptr<int64_t>();
        for (int64_t r = 0; r < B; ++r)
          if (running[r]) next[r] = a[r];
      } else {
        const at::Tensor probs =
            sampling_probabilities(last, req.temperature, req.top_k, req.top_p).to(at::kCPU);
        // With replacement: one uniform draw against the cumulative distribution (without, LibTorch
        // draws one exponential per vocabulary entry, which cost more than the model's step).
        for (int64_t r = 0; r < B; ++r)
          if (running[r]) next[r] = at::multinomial(probs[r], 1, true, gens[r]).item<int64_t>();
      }
      for (int64_t r = 0; r < B; ++r) {
        if (!running[r]) continue;
        Completion& c = out.completions[static_cast<size_t>(first + r)];
        c.ids.push_back(next[r]);
        const bool eos = std::find(req.eos_token_ids.begin(), req.eos_token_ids.end(), next[r]) !=
                         req.eos_token_ids.end();
        if (eos)
          c.finish = "eos";
        else if (req.stop && req.stop(first + r, c.ids))
          c.finish = "stop";
        else if (static_cast<int64_t>(c.ids.size()) < req.max_completion_length)
          continue;
        running[r] = 0;
        --left;
      }
      if (step == 0) {
        out.prefill_s += std::chrono::duration<double>(clock::now() - t0).count();
        t0 = clock::now();
      }
      if (left == 0) break;
      // Every row advances (a stopped one on padding), as transformers' generate does.
      attention = at::cat({attention, at::ones({B, 1}, at::kLong)}, 1);
      logits = padded->decode_padded(at::tensor(next, at::kLong).view({B, 1}), attention, *state);
      out.decode_tokens += left;
    }
    out.decode_s += std::chrono::duration<double>(clock::now() - t0).count();
  }
  return out;
}

}  // namespace trainrun::v1
