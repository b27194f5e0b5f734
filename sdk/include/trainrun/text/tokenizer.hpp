#pragma once
// Hugging Face tokenizers in C++: loads a model directory's tokenizer.json (with
// tokenizer_config.json and special_tokens_map.json) and encodes/decodes exactly as the
// `tokenizers` library (PyPI) does with the same file. No Python, no LibTorch.
//
// Supported components (anything else is a trainrun::v1::ConfigError naming the component type
// and the file): model BPE (byte-level or SentencePiece-style, byte_fallback, ignore_merges,
// merges as "a b" or ["a","b"]); normalizers NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace,
// Strip, Sequence; pre-tokenizers ByteLevel, Split, Metaspace, Whitespace, WhitespaceSplit,
// Digits, Sequence; post-processors TemplateProcessing, ByteLevel, RobertaProcessing,
// BertProcessing, Sequence; decoders ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
// Sequence. A directory with only tokenizer.model (no tokenizer.json) goes through Debian's
// sentencepiece library (a module loaded on demand, libtrainrun_text_sentencepiece.so).
// tokenizer.json's "truncation" and "padding" are ignored (transformers overrides them on every
// call too); offsets are not computed; only the single-sequence post-processor template is used.
#include <trainrun/error.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainrun::text {

class TokenizerImpl;

/// A loaded tokenizer. Cheap to copy (shared state); safe to use from many threads at once
/// (word caches are pooled: each concurrent call takes its own, and they outlive the call).
class Tokenizer {
 public:
  /// Loads DIR/tokenizer.json (+ DIR/tokenizer_config.json, DIR/special_tokens_map.json when
  /// present), or DIR/tokenizer.model when there is no tokenizer.json.
  /// Throws trainrun::v1::ConfigError naming the file (and key) when a file is missing,
  /// malformed, or uses a component this library does not implement.
  static Tokenizer from_directory(const std::string& dir);

  /// Token ids of UTF-8 `text`, as tokenizers' `Tokenizer.encode(text, add_special_tokens)`:
  /// added/special tokens are split out first, then normalizer, pre-tokenizer and model run on
  /// each stretch between them; with add_special_tokens the post-processor adds BOS/EOS (as the
  /// post-processor, or tokenizer_config.json's add_bos_token/add_eos_token, say).
  /// Throws std::invalid_argument when `text` is not valid UTF-8 (the message gives the byte
  /// offset).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;

  /// encode() of every text, on `threads` threads (0: all hardware threads). Results are in
  /// input order and equal encode() of each. `progress`, when given, is called from the worker
  /// threads with the number of texts finished so far (not necessarily in order).
  std::vector<std::vector<int32_t>> encode_batch(
      const std::vector<std::string>& texts, bool add_special_tokens = false, int threads = 0,
      const std::function<void(size_t done)>& progress = {}) const;

  /// Text of `ids`, as tokenizers' `Tokenizer.decode(ids, skip_special_tokens)`: the decoder
  /// chain runs over the tokens; invalid UTF-8 becomes U+FFFD. Throws std::out_of_range for an
  /// id outside the vocabulary (the message gives the id and its position).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  /// Number of ids (model vocabulary plus added tokens): every id is below this.
  int32_t vocab_size() const;
  /// Id of a token string (added tokens first, then the model vocabulary), if any.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// Token string of an id (as stored, e.g. "Ġthe" or "▁the"). Throws std::out_of_range.
  std::string id_to_token(int32_t id) const;
  /// True for ids of added tokens marked "special" (what skip_special_tokens drops).
  bool is_special(int32_t id) const;

  /// Special tokens named by tokenizer_config.json / special_tokens_map.json ("bos_token", ...);
  /// empty optionals where the files name none or the token is not in the vocabulary.
  std::optional<std::string> bos_token() const;
  std::optional<std::string> eos_token() const;
  std::optional<std::string> pad_token() const;
  std::optional<std::string> unk_token() const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  /// The directory it was loaded from.
  const std::string& directory() const;

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl);
  std::shared_ptr<const TokenizerImpl> impl_;
};

}  // namespace trainrun::text
