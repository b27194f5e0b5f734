#pragma once
// The harness's LanguageModel (harness.hpp) answered by a model plugin through v1::PaddedDecoder
// (generation.hpp), as lm-eval 0.4.13's HFLM answers it (models/huggingface.py, api/model.py):
// `trainrun eval` and the [eval] tasks of a training run (core/src/run/eval_tasks.cpp) share it.
// The library trainrun_eval_model holds it (LibTorch); the harness itself does not use LibTorch.
// ShardedLanguageModel splits the requests over ranks and gathers the answers.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "trainrun/eval/harness.hpp"

namespace trainrun::v1 {
class IncrementalDecoder;
class PaddedDecoder;
}  // namespace trainrun::v1
namespace trainrun::text {
class Tokenizer;
}

namespace trainrun::eval {

/// lm-eval's max_length for an HF directory: config.json's (or its text_config's) n_positions,
/// max_position_embeddings or n_ctx, else 2048. Throws v1::ConfigError naming config.json when
/// it is not JSON.
int64_t model_max_length(const std::filesystem::path& dir);

/// The ids that end a completion as transformers' generate() takes them: eos_token_id of
/// generation_config.json, else of config.json (an int or a list), plus the tokenizer's
/// eos_token. Throws v1::ConfigError naming the file for an eos_token_id of another type.
std::set<int64_t> generation_eos_ids(const std::filesystem::path& dir, const text::Tokenizer& tok);

/// The text of generated token ids, special tokens skipped (tokenizers' decode with
/// skip_special_tokens). Ids at or past the tokenizer's vocabulary, which models that pad their
/// embedding table past it can produce (Qwen: 151936 vs 151669), have no text and are dropped.
std::string completion_text(const text::Tokenizer& tok, const std::vector<int64_t>& ids);

/// A LanguageModel over a model plugin's KV-cache decoding. Requests run in left-padded batches
/// of similar length, longest first; a multiple-choice document's context is prefilled once and
/// its keys and values repeated per choice (v1::DecodeStateRepeat), only the logits that are read
/// are computed (v1::LastLogitsDecoder). Runs under whatever autograd and thread settings the
/// caller set; the model must be in evaluation mode.
class DecoderLanguageModel : public LanguageModel {
 public:
  /// Tokens the forwards ran over, and tokens generated, so far (for throughput lines).
  virtual int64_t scored_tokens() const = 0;
  virtual int64_t generated_tokens() const = 0;
};

/// `decoder` must also be a v1::PaddedDecoder (Throws v1::ConfigError naming `label`
/// otherwise). `max_length`: tokens per input at most (left truncation, as HFLM); `batch_size`:
/// rows per forward; `eos`: the ids that end a generation (generation_eos_ids); `label` prefixes
/// errors ("model plugin 'llama'"). Throws v1::ConfigError when the tokenizer has neither a BOS
/// nor an EOS token to condition an empty context on.
std::unique_ptr<DecoderLanguageModel> make_decoder_language_model(
    const text::Tokenizer& tok, v1::IncrementalDecoder& decoder, int64_t max_length,
    int64_t batch_size, std::set<int64_t> eos, std::string label);

/// `inner` on this rank's share of every call's requests, the answers of all ranks gathered so
/// that every rank returns every answer (the metrics then agree on all ranks). Shares are
/// contiguous runs of requests of about equal text length (a document's choices stay together
/// but at a share's edge), so every rank calls `sum` the same number of times with vectors of
/// the same length: it must sum its argument element-wise over the ranks in place (an
/// all_reduce), float64. Answers are exact: each element is non-zero on one rank only.
class ShardedLanguageModel : public LanguageModel {
 public:
  ShardedLanguageModel(LanguageModel& inner, int rank, int world_size,
                       std::function<void(std::vector<double>&)> sum);
  void loglikelihood(const std::vector<Request*>& requests) override;
  void loglikelihood_rolling(const std::vector<Request*>& requests) override;
  void generate_until(const std::vector<Request*>& requests) override;
  /// Requests this rank answered itself so far.
  int64_t answered() const { return answered_; }
  /// Seconds this rank spent answering its shares so far (the rest of a call waits for the
  /// other ranks).
  double busy_seconds() const { return busy_s_; }

 private:
  /// This rank's [first, last) of `requests`.
  std::pair<size_t, size_t> share(const std::vector<Request*>& requests) const;
  /// `inner`'s `kind` on this rank's share; returns the share.
  std::pair<size_t, size_t> answer(const std::vector<Request*>& requests,
                                   void (LanguageModel::*kind)(const std::vector<Request*>&));
  void gather_scores(const std::vector<Request*>& requests, std::pair<size_t, size_t> mine);

  LanguageModel& inner_;
  int rank_, world_size_;
  std::function<void(std::vector<double>&)> sum_;
  int64_t answered_ = 0;
  double busy_s_ = 0;
};

}  // namespace trainrun::eval
