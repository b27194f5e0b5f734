// Tokenizer: loading a model directory, added-token splitting, the encode/decode pipeline and
// the multithreaded batch encoder. The pipeline is tokenizers' (`TokenizerImpl::encode_single_
// sequence`): added tokens that are not "normalized" are cut out of the raw text first; each
// stretch between them is normalized on its own, normalized added tokens are cut out of that,
// and the rest goes through the pre-tokenizer and the model; the post-processor adds BOS/EOS.
#include "tokenizer_internal.hpp"
#include "trainrun/json_depth.hpp"

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace trainrun::text {

namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::Where;

namespace {

json read_json(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw v1::ConfigError(p.string() + ": cannot be read");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (v1::json_too_deep(ss.str()))
    throw v1::ConfigError(p.string() + ": JSON nested deeper than " + std::to_string(v1::kMaxJsonDepth) + " levels");
  try {
    return json::parse(ss.str());
  } catch (const json::parse_error& e) {
    throw v1::ConfigError(p.string() + ": not valid JSON: " + v1::parse_error_text(e.what()));
  }
}

// A special-token entry of tokenizer_config.json / special_tokens_map.json: "text" or an
// AddedToken object {"content": "text", ...}.
std::optional<std::string> token_text(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

struct AddedToken {
  int32_t id;
  std::string content;
  bool single_word, lstrip, rstrip, normalized, special;
};

// Finds added tokens in text as tokenizers' AddedVocabulary does: leftmost-longest,
// non-overlapping matches, then the single_word / lstrip / rstrip rules.
class AddedTokenMatcher {
 public:
  struct Split {
    int32_t token;  // index into the token list, or -1 for plain text
    size_t begin, end;
  };

  void add(const std::string& pattern, int32_t token) {
    if (pattern.empty()) return;
    int32_t node = 0;
    for (unsigned char c : pattern) {
      int32_t next = -1;
      for (auto [k, n] : nodes_[static_cast<size_t>(node)].kids)
        if (k == c) next = n;
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[static_cast<size_t>(node)].kids.push_back({c, next});
        nodes_.emplace_back();
      }
      node = next;
    }
    auto& n = nodes_[static_cast<size_t>(node)];
    if (n.token < 0) n.token = token;  // the first token with this text wins
    first_[static_cast<unsigned char>(pattern[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }

  void split(std::string_view s, const std::vector<AddedToken>& tokens, std::vector<Split>& out) const {
    out.clear();
    size_t start_offset = 0;
    size_t i = 0;
    while (i < s.size()) {
      if (!first_[static_cast<unsigned char>(s[i])]) {
        ++i;
        continue;
      }
      int32_t node = 0, found = -1;
      size_t found_end = 0;
      for (size_t j = i; j < s.size(); ++j) {
        int32_t next = -1;
        for (auto [k, n] : nodes_[static_cast<size_t>(node)].kids)
          if (k == static_cast<unsigned char>(s[j])) next = n;
        if (next < 0) break;
        node = next;
        if (nodes_[static_cast<size_t>(node)].token >= 0) {
          found = nodes_[static_cast<size_t>(node)].token;
          found_end = j + 1;
        }
      }
      if (found < 0) {
        ++i;
        continue;
      }
      size_t start = i, stop = found_end;
      i = found_end;
      const AddedToken& t = tokens[static_cast<size_t>(found)];
      if (t.single_word) {
        size_t p = start, q = stop;
        const bool word_before = start > 0 && detail::is_word_char(detail::utf8_prev(s, p));
        const bool word_after = stop < s.size() && detail::is_word_char(detail::utf8_next(s, q));
        if (word_before || word_after) continue;
      }
      if (t.lstrip) {
        size_t p = start;
        while (p > 0) {
          size_t q = p;
          if (!detail::is_whitespace(detail::utf8_prev(s, q))) break;
          p = q;
        }
        start = std::max(p, start_offset);  // spaces an earlier match took stay with it
      }
      if (t.rstrip) {
        while (stop < s.size()) {
          size_t q = stop;
          if (!detail::is_whitespace(detail::utf8_next(s, q))) break;
          stop = q;
        }
      }
      if (start_offset < start) out.push_back({-1, start_offset, start});
      out.push_back({found, start, stop});
      start_offset = stop;
    }
    if (start_offset < s.size() || out.empty()) out.push_back({-1, start_offset, s.size()});
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> kids;
    int32_t token = -1;
  };
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_{};
  bool empty_ = true;
};

class HfTokenizer : public TokenizerImpl {
 public:
  HfTokenizer(const std::string& directory, const json& config);

  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& out) const override {
    const size_t bad = detail::utf8_invalid_offset(text);
    if (bad != std::string_view::npos)
      throw std::invalid_argument("text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
    out.clear();
    CacheLease cache(*this);
    std::vector<AddedTokenMatcher::Split> splits;
    raw_added_.split(text, added_, splits);
    for (const auto& sp : splits) {
      if (sp.token >= 0) out.push_back(added_[static_cast<size_t>(sp.token)].id);
      else encode_stretch(text.substr(sp.begin, sp.end - sp.begin), sp.begin == 0, *cache.cache, out);
    }
    if (post_) post_->apply(out, add_special_tokens);
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (size_t k = 0; k < ids.size(); ++k) {
      const int32_t id = ids[k];
      auto added = added_by_id_.find(id);
      if (added != added_by_id_.end()) {
        const AddedToken& t = added_[added->second];
        if (!(skip_special_tokens && t.special)) tokens.push_back(t.content);
        continue;
      }
      const std::string* tok = model_->id_to_token(id);
      if (!tok)
        throw std::out_of_range("token id " + std::to_string(id) + " (position " + std::to_string(k) +
                                ") is not in the vocabulary of " + dir);
      tokens.push_back(*tok);
    }
    if (!decoder_) {
      std::string out;
      for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
      return out;
    }
    decoder_->apply(tokens);
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }

  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    auto it = added_by_content_.find(std::string(token));
    if (it != added_by_content_.end()) return added_[it->second].id;
    return model_->token_to_id(token);
  }
  std::string id_to_token(int32_t id) const override {
    auto added = added_by_id_.find(id);
    if (added != added_by_id_.end()) return added_[added->second].content;
    const std::string* tok = model_->id_to_token(id);
    if (!tok) throw std::out_of_range("token id " + std::to_string(id) + " is not in the vocabulary of " + dir);
    return *tok;
  }
  bool is_special(int32_t id) const override {
    auto added = added_by_id_.find(id);
    return added != added_by_id_.end() && added_[added->second].special;
  }

 private:
  // A word cache taken from the pool for one encode() and given back after: caches outlive the
  // threads of encode_batch, and concurrent callers never share one.
  struct CacheLease {
    const HfTokenizer& owner;
    std::unique_ptr<detail::WordCache> cache;
    explicit CacheLease(const HfTokenizer& o) : owner(o) {
      std::lock_guard<std::mutex> lock(owner.pool_mutex_);
      if (owner.pool_.empty()) {
        cache = std::make_unique<detail::WordCache>();
      } else {
        cache = std::move(owner.pool_.back());
        owner.pool_.pop_back();
      }
    }
    ~CacheLease() {
      std::lock_guard<std::mutex> lock(owner.pool_mutex_);
      owner.pool_.push_back(std::move(cache));
    }
  };

  void encode_stretch(std::string_view raw, bool at_origin, detail::WordCache& cache, std::vector<int32_t>& out) const {
    std::string text(raw);
    if (normalizer_) normalizer_->apply(text);
    if (norm_added_.empty()) {
      model_words(std::move(text), at_origin, cache, out);
      return;
    }
    std::vector<AddedTokenMatcher::Split> splits;
    norm_added_.split(text, added_, splits);
    for (const auto& sp : splits) {
      if (sp.token >= 0) out.push_back(added_[static_cast<size_t>(sp.token)].id);
      else model_words(text.substr(sp.begin, sp.end - sp.begin), at_origin && sp.begin == 0, cache, out);
    }
  }

  void model_words(std::string text, bool at_origin, detail::WordCache& cache, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    detail::PreTokenized pt;
    pt.pieces.push_back({0, static_cast<uint32_t>(text.size())});
    pt.buf = std::move(text);
    pt.at_origin = at_origin;
    if (pre_) pre_->apply(pt);
    const std::string_view buf(pt.buf);
    for (auto [b, e] : pt.pieces) model_->tokenize(buf.substr(b, e - b), out, cache);
  }

  std::unique_ptr<detail::Normalizer> normalizer_;
  std::unique_ptr<detail::PreTokenizer> pre_;
  std::unique_ptr<detail::BpeModel> model_;
  std::unique_ptr<detail::PostProcessor> post_;
  std::unique_ptr<detail::Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::unordered_map<std::string, size_t> added_by_content_;
  AddedTokenMatcher raw_added_, norm_added_;
  int32_t vocab_size_ = 0;
  mutable std::mutex pool_mutex_;
  mutable std::vector<std::unique_ptr<detail::WordCache>> pool_;
};

HfTokenizer::HfTokenizer(const std::string& directory, const json& config) {
  dir = directory;
  const std::string file = (fs::path(directory) / "tokenizer.json").string();
  const json j = read_json(file);
  if (!j.is_object()) throw v1::ConfigError(file + ": expected a JSON object");
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };

  if (!present("model")) throw v1::ConfigError(file + ": missing \"model\"");
  const json& model = j["model"];
  const std::string model_type = model.value("type", std::string("BPE"));
  if (model_type != "BPE")
    throw v1::ConfigError(file + ": model: model type \"" + model_type + "\" is not supported (only BPE is)");
  model_ = std::make_unique<detail::BpeModel>(model, Where{file, "model"});
  if (present("normalizer")) normalizer_ = detail::make_normalizer(j["normalizer"], Where{file, "normalizer"});
  if (present("pre_tokenizer")) pre_ = detail::make_pre_tokenizer(j["pre_tokenizer"], Where{file, "pre_tokenizer"});
  if (present("decoder")) decoder_ = detail::make_decoder(j["decoder"], Where{file, "decoder"});

  vocab_size_ = model_->size();
  if (present("added_tokens")) {
    if (!j["added_tokens"].is_array()) throw v1::ConfigError(file + ": \"added_tokens\" must be an array");
    for (size_t k = 0; k < j["added_tokens"].size(); ++k) {
      const json& t = j["added_tokens"][k];
      const Where w{file, "added_tokens[" + std::to_string(k) + "]"};
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") || !t["content"].is_string())
        w.fail("needs an integer \"id\" and a string \"content\"");
      // Read wide and bounded: get<int32_t> silently wraps a larger JSON integer, and an id of
      // INT32_MAX would overflow vocab_size_ (id + 1) below.
      const int64_t id = t["id"].is_number_unsigned() && t["id"].get<uint64_t>() > INT64_MAX
                             ? INT64_MAX
                             : t["id"].get<int64_t>();
      if (id < 0) w.fail("negative id");
      if (id >= INT32_MAX) w.fail("id " + std::to_string(id) + " out of range (at most " + std::to_string(INT32_MAX - 1) + ")");
      AddedToken a{static_cast<int32_t>(id), t["content"].get<std::string>(), t.value("single_word", false),
                   t.value("lstrip", false), t.value("rstrip", false), t.value("normalized", false), t.value("special", false)};
      added_by_id_[a.id] = added_.size();
      added_by_content_.emplace(a.content, added_.size());
      vocab_size_ = std::max(vocab_size_, a.id + 1);
      added_.push_back(std::move(a));
    }
    detail::check_id_range(vocab_size_ - 1, static_cast<int64_t>(model_->size() + added_.size()),
                           detail::Where{file, "added_tokens"},
                           "the model's vocabulary with the added tokens");
  }
  for (size_t k = 0; k < added_.size(); ++k) {
    const AddedToken& a = added_[k];
    if (!a.normalized) {
      raw_added_.add(a.content, static_cast<int32_t>(k));
    } else {
      std::string pattern = a.content;
      if (normalizer_) normalizer_->apply(pattern);
      norm_added_.add(pattern, static_cast<int32_t>(k));
    }
  }

  bos = token_text(config, "bos_token");
  eos = token_text(config, "eos_token");
  pad = token_text(config, "pad_token");
  unk = token_text(config, "unk_token");
  detail::TokenLookup lookup = [this](const std::string& t) { return token_to_id(t); };
  if (present("post_processor")) post_ = detail::make_post_processor(j["post_processor"], Where{file, "post_processor"}, lookup);
  // transformers (TokenizersBackend.update_post_processor) replaces the post-processor with
  // [BOS] $A [EOS] when the config sets either flag; an unset flag counts as false.
  const bool has_add_bos = config.contains("add_bos_token") && config["add_bos_token"].is_boolean();
  const bool has_add_eos = config.contains("add_eos_token") && config["add_eos_token"].is_boolean();
  if (has_add_bos || has_add_eos) {
    const bool add_bos = has_add_bos && config["add_bos_token"].get<bool>();
    const bool add_eos = has_add_eos && config["add_eos_token"].get<bool>();
    auto id_of = [&](const std::optional<std::string>& tok, const char* key) -> std::optional<int32_t> {
      if (!tok) return std::nullopt;  // transformers drops the flag when no such token is named
      auto id = token_to_id(*tok);
      if (!id) throw v1::ConfigError(dir + "/tokenizer_config.json: " + key + " \"" + *tok + "\" is not in the vocabulary");
      return id;
    };
    post_ = detail::make_bos_eos_processor(add_bos ? id_of(bos, "bos_token") : std::nullopt,
                                           add_eos ? id_of(eos, "eos_token") : std::nullopt);
  }
  // The ids a post-processor adds are written in the file, not looked up: one that names no
  // token would reach a model's embedding as an index past its end. What it adds around an
  // empty text is every id it can add.
  if (post_) {
    std::vector<int32_t> added;
    post_->apply(added, true);
    for (int32_t id : added)
      if (id < 0 || (!added_by_id_.count(id) && !model_->id_to_token(id)))
        throw v1::ConfigError(file + ": post_processor adds token id " + std::to_string(id) +
                              ", which is not in the vocabulary (" + std::to_string(vocab_size_) + " ids)");
  }
}

}  // namespace

std::shared_ptr<TokenizerImpl> load_hf_tokenizer(const std::string& dir, const json& config) {
  try {
    return std::make_shared<HfTokenizer>(dir, config);
  } catch (const json::exception& e) {  // a value of the wrong JSON type somewhere unchecked
    throw v1::ConfigError((fs::path(dir) / "tokenizer.json").string() + ": " + e.what());
  }
}

// ---- Tokenizer ---------------------------------------------------------------------------
Tokenizer::Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_directory(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) throw v1::ConfigError(dir + ": no such tokenizer directory");
  json config = json::object();
  // tokenizer_config.json wins over special_tokens_map.json, as in transformers.
  for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {
    const fs::path p = d / name;
    if (!fs::exists(p)) continue;
    json j = read_json(p);
    if (!j.is_object()) throw v1::ConfigError(p.string() + ": expected a JSON object");
    for (auto it = j.begin(); it != j.end(); ++it) config[it.key()] = it.value();
  }
  if (fs::exists(d / "tokenizer.json")) return Tokenizer(load_hf_tokenizer(dir, config));
  if (fs::exists(d / "tokenizer.model")) return Tokenizer(load_sentencepiece_tokenizer(dir, config));
  throw v1::ConfigError(dir + ": has neither tokenizer.json nor tokenizer.model");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  impl_->encode(text, add_special_tokens, out);
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts, bool add_special_tokens,
                                                          int threads, const std::function<void(size_t)>& progress) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(texts.size(), 1)));
  std::atomic<size_t> next{0}, done{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < texts.size();) {
        impl_->encode(texts[i], add_special_tokens, out[i]);
        const size_t d = done.fetch_add(1) + 1;
        if (progress) progress(d);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(texts.size());
    }
  };
  if (threads == 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(work);
    for (auto& th : pool) th.join();
  }
  if (error) std::rethrow_exception(error);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}
int32_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }
std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const { return impl_->token_to_id(token); }
std::string Tokenizer::id_to_token(int32_t id) const { return impl_->id_to_token(id); }
bool Tokenizer::is_special(int32_t id) const { return impl_->is_special(id); }
std::optional<std::string> Tokenizer::bos_token() const { return impl_->bos; }
std::optional<std::string> Tokenizer::eos_token() const { return impl_->eos; }
std::optional<std::string> Tokenizer::pad_token() const { return impl_->pad; }
std::optional<std::string> Tokenizer::unk_token() const { return impl_->unk; }
std::optional<int32_t> Tokenizer::bos_token_id() const { return impl_->bos ? impl_->token_to_id(*impl_->bos) : std::nullopt; }
std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos ? impl_->token_to_id(*impl_->eos) : std::nullopt; }
std::optional<int32_t> Tokenizer::pad_token_id() const { return impl_->pad ? impl_->token_to_id(*impl_->pad) : std::nullopt; }
const std::string& Tokenizer::directory() const { return impl_->dir; }

}  // namespace trainrun::text
