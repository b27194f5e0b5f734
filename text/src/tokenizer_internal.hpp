#pragma once
// Private pieces of the tokenizer (text/src only): UTF-8 helpers, the PCRE2 regex wrapper,
// Unicode normalization through ICU, and the component interfaces the pipeline is built from.
// Each component reproduces the behaviour of the Hugging Face `tokenizers` component of the
// same "type" name in tokenizer.json.
#include <trainrun/text/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace trainrun::text {

/// The state behind a Tokenizer: tokenizer.json pipeline or a sentencepiece model.
class TokenizerImpl {
 public:
  virtual ~TokenizerImpl() = default;
  virtual void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& out) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;

  std::string dir;
  std::optional<std::string> bos, eos, pad, unk;
};

/// tokenizer.json (+ the config) in `dir`; `config` is tokenizer_config.json merged over
/// special_tokens_map.json (an empty object when neither exists).
std::shared_ptr<TokenizerImpl> load_hf_tokenizer(const std::string& dir, const nlohmann::json& config);
/// DIR/tokenizer.model through the sentencepiece module (tokenizer_sentencepiece.cpp).
std::shared_ptr<TokenizerImpl> load_sentencepiece_tokenizer(const std::string& dir, const nlohmann::json& config);

namespace detail {

// ---- UTF-8 -------------------------------------------------------------------------------
/// Offset of the first byte that is not part of valid UTF-8, or npos.
size_t utf8_invalid_offset(std::string_view s);
/// Code point starting at s[i] (s valid UTF-8); advances i past it.
uint32_t utf8_next(std::string_view s, size_t& i);
/// Code point ending just before s[end] (s valid UTF-8); sets end to its first byte.
uint32_t utf8_prev(std::string_view s, size_t& end);
void utf8_append(std::string& out, uint32_t cp);
/// Bytes to text as Rust's String::from_utf8_lossy: each maximal ill-formed subsequence
/// becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);
/// Rust's char::is_whitespace (Unicode White_Space).
bool is_whitespace(uint32_t cp);
/// Rust's char::is_alphanumeric (Alphabetic or Numeric) plus '_': tokenizers' "word character".
bool is_word_char(uint32_t cp);

// ---- Byte-level alphabet (GPT-2's bytes_to_unicode) --------------------------------------
/// UTF-8 of the printable character standing for each byte.
const std::array<std::string, 256>& byte_level_chars();
/// The byte a byte-level character stands for, or -1.
int byte_level_byte(uint32_t cp);

// ---- Regex (PCRE2, JIT) ------------------------------------------------------------------
/// A compiled Oniguruma-syntax pattern as tokenizers writes them. \s and \S are rewritten to
/// Oniguruma's Unicode meaning (White_Space), which PCRE2's \s differs from (U+180E).
class Regex {
 public:
  /// Throws std::invalid_argument with PCRE2's message and the offset in the pattern.
  /// `origin` ("FILE: COMPONENT PATH (TYPE)") names a pattern a tokenizer file gave, for the
  /// error when a match fails.
  explicit Regex(const std::string& pattern, bool literal = false, std::string origin = "");
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  /// Non-overlapping matches [begin, end) of s, left to right, appended to `out`. Throws
  /// v1::ConfigError naming the origin and the pattern when PCRE2 gives up (its match limit:
  /// a pattern that backtracks catastrophically on this input).
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
  std::string pattern_, origin_;
};

// ---- Unicode normalization (ICU) ---------------------------------------------------------
enum class NormForm { NFC, NFD, NFKC, NFKD };
std::string unicode_normalize(std::string_view s, NormForm form);
std::string unicode_lowercase(std::string_view s);

// ---- Components --------------------------------------------------------------------------
/// Where component errors point: the file and the JSON path of the component.
struct Where {
  std::string file;
  std::string path;
  [[noreturn]] void fail(const std::string& msg) const;
};

/// Ids beyond the entries a tokenizer file lists that it may leave unused. Real vocabularies
/// are dense (ids 0..n-1, added tokens right after); the largest id sizes the id table and the
/// vocabulary a model is built with, so a file stating a huge id for a handful of entries would
/// make trainrun allocate in proportion to that number.
constexpr int64_t kMaxUnusedIds = 65536;

/// Fails (naming `w`) unless `max_id` < `entries` + kMaxUnusedIds.
void check_id_range(int64_t max_id, int64_t entries, const Where& w, const std::string& what);

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
};

/// Text after normalization, cut into pieces [begin, end) of `buf` by pre-tokenizers.
struct PreTokenized {
  std::string buf;
  std::vector<std::pair<uint32_t, uint32_t>> pieces;
  /// buf[0] is the first character of the whole input (Metaspace prepend_scheme "first").
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(PreTokenized& pt) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void apply(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

/// Look-up from token text to id for post-processors' special tokens.
using TokenLookup = std::function<std::optional<int32_t>(const std::string&)>;

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const Where& where);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const Where& where);
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j, const Where& where,
                                                   const TokenLookup& lookup);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const Where& where);
/// "$A" with BOS/EOS around it, as transformers builds from add_bos_token/add_eos_token.
std::unique_ptr<PostProcessor> make_bos_eos_processor(std::optional<int32_t> bos, std::optional<int32_t> eos);

// ---- BPE model ---------------------------------------------------------------------------
/// Word -> ids of one BPE model, used by one thread at a time (the tokenizer keeps a pool).
struct WordCache {
  std::unordered_map<std::string, std::vector<int32_t>> map;
  std::string key;  // reused look-up buffer
};

class BpeModel {
 public:
  BpeModel(const nlohmann::json& model, const Where& where);
  ~BpeModel();
  /// Ids of one pre-tokenized word, appended to out.
  void tokenize(std::string_view word, std::vector<int32_t>& out, WordCache& cache) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// Model vocabulary string of an id, or nullptr.
  const std::string* id_to_token(int32_t id) const;
  int32_t size() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  struct Maps;
  std::unique_ptr<Maps> maps_;
  std::vector<std::string> id_to_token_;
  std::optional<int32_t> unk_id_;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_fallback_ids_{};
};

}  // namespace detail
}  // namespace trainrun::text
