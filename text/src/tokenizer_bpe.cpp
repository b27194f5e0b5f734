// Byte-pair encoding as tokenizers' `models::bpe::BPE` does it (without dropout): a word is cut
// into characters (unknown ones become byte-fallback tokens, the unk token, or nothing), then
// the pair of lowest merge rank is merged, leftmost first, until no ranked pair is left. A
// priority queue keeps this O(n log n) per word, and a cache of word -> ids (one per concurrent
// caller, see WordCache) makes repeated words (most of real text) a single hash look-up.
#include "tokenizer_internal.hpp"

#include <queue>
#include <unordered_map>

namespace trainrun::text::detail {

// The two maps are in a named namespace, not an anonymous one: BpeModel::Maps (declared in a
// header) holds them, and GCC warns about a member of internal-linkage type once this file is
// compiled inside a unity unit (it is then an included file, not the main one).
namespace bpe {
// Open-addressing map from a token pair to (rank, merged id): the hot look-up of merging.
class PairMap {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
  }
  // Keeps the first insertion of a pair, as the first (lowest-rank) merge wins.
  void insert(uint64_t key, int32_t rank, int32_t id) {
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == 0) {
        slots_[i] = {key + 1, rank, id};
        return;
      }
      if (slots_[i].key == key + 1) return;
    }
  }
  const std::pair<int32_t, int32_t>* find(uint64_t key, std::pair<int32_t, int32_t>& out) const {
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == 0) return nullptr;
      if (slots_[i].key == key + 1) {
        out = {slots_[i].rank, slots_[i].id};
        return &out;
      }
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;  // pair + 1; 0 = empty
    int32_t rank = 0, id = 0;
  };
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Open-addressing map from token text to id; the texts live in the model's id -> token table.
// Each slot keeps the full hash, so a probe touches the string only on a likely hit.
class TokenMap {
 public:
  explicit TokenMap(const std::vector<std::string>& tokens) : tokens_(tokens) {}
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
  }
  void insert(int32_t id) {
    const std::string& t = tokens_[static_cast<size_t>(id)];
    const uint64_t h = hash(t);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].id < 0) {
        slots_[i] = {h, id};
        return;
      }
      if (slots_[i].hash == h && tokens_[static_cast<size_t>(slots_[i].id)] == t) return;
    }
  }
  int32_t find(std::string_view t) const {
    const uint64_t h = hash(t);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash == h && tokens_[static_cast<size_t>(s.id)] == t) return s.id;
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    int32_t id = -1;
  };
  static uint64_t hash(std::string_view t) { return std::hash<std::string_view>{}(t); }
  const std::vector<std::string>& tokens_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

}  // namespace bpe

namespace {
uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

constexpr size_t kCacheMaxEntries = 200000;
constexpr size_t kCacheMaxWordBytes = 256;
}  // namespace

struct BpeModel::Maps {
  explicit Maps(const std::vector<std::string>& tokens) : vocab(tokens) {}
  bpe::TokenMap vocab;
  bpe::PairMap merges;
  // Ids of one-character tokens by code point (-1: none), for the characters a word starts as;
  // covers the byte-level alphabet (U+0000..U+0143) and Latin.
  std::array<int32_t, 0x250> char_ids;
};

BpeModel::~BpeModel() = default;

BpeModel::BpeModel(const nlohmann::json& model, const Where& where) {
  auto str_opt = [&](const char* key) -> std::optional<std::string> {
    if (!model.contains(key) || model[key].is_null()) return std::nullopt;
    if (!model[key].is_string()) where.fail(std::string("\"") + key + "\" must be a string or null");
    return model[key].get<std::string>();
  };
  auto bool_opt = [&](const char* key) {
    if (!model.contains(key) || model[key].is_null()) return false;
    if (!model[key].is_boolean()) where.fail(std::string("\"") + key + "\" must be true or false");
    return model[key].get<bool>();
  };
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0.0)
    where.fail("BPE dropout " + model["dropout"].dump() + " is not supported (encoding would not be deterministic)");
  prefix_ = str_opt("continuing_subword_prefix").value_or("");
  suffix_ = str_opt("end_of_word_suffix").value_or("");
  byte_fallback_ = bool_opt("byte_fallback");
  fuse_unk_ = bool_opt("fuse_unk");
  ignore_merges_ = bool_opt("ignore_merges");

  const auto& vocab = model.contains("vocab") ? model["vocab"] : nlohmann::json();
  if (!vocab.is_object()) where.fail("\"vocab\" must be an object of token -> id");
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
      where.fail("vocab entry \"" + it.key() + "\" has id " + it.value().dump() + ", not a non-negative integer");
    max_id = std::max(max_id, it.value().get<int32_t>());
  }
  check_id_range(max_id, static_cast<int64_t>(vocab.size()),
                 Where{where.file, where.path + ".vocab"}, "the vocabulary");
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) id_to_token_[it.value().get<int32_t>()] = it.key();
  maps_ = std::make_unique<Maps>(id_to_token_);
  maps_->vocab.reserve(id_to_token_.size());
  for (size_t id = 0; id < id_to_token_.size(); ++id)
    if (!id_to_token_[id].empty()) maps_->vocab.insert(static_cast<int32_t>(id));
  for (uint32_t cp = 0; cp < maps_->char_ids.size(); ++cp) {
    std::string ch;
    utf8_append(ch, cp);
    maps_->char_ids[cp] = maps_->vocab.find(ch);
  }

  if (auto unk = str_opt("unk_token")) {
    const int32_t found = maps_->vocab.find(*unk);
    // tokenizers fails only when the unk token is needed; an absent one then drops the character.
    if (found >= 0) unk_id_ = found;
  }
  if (byte_fallback_) {
    static const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const std::string name = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
      byte_fallback_ids_[b] = maps_->vocab.find(name);
    }
  }

  const auto& merges = model.contains("merges") ? model["merges"] : nlohmann::json::array();
  if (!merges.is_array()) where.fail("\"merges\" must be an array");
  maps_->merges.reserve(merges.size());
  auto lookup = [&](std::string_view tok, size_t rank) {
    const int32_t found = maps_->vocab.find(tok);
    if (found < 0)
      where.fail("merges[" + std::to_string(rank) + "]: token \"" + std::string(tok) + "\" is not in the vocabulary");
    return found;
  };
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    std::string_view a, b;
    if (m.is_string()) {  // "a b"
      const std::string_view s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        where.fail("merges[" + std::to_string(rank) + "] \"" + std::string(s) + "\" is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    } else {
      where.fail("merges[" + std::to_string(rank) + "] is neither \"a b\" nor [\"a\", \"b\"]: " + m.dump());
    }
    const int32_t ia = lookup(a, rank), ib = lookup(b, rank);
    merged.assign(a);
    merged.append(!prefix_.empty() && b.substr(0, prefix_.size()) == prefix_ ? b.substr(prefix_.size()) : b);
    const int32_t im = lookup(merged, rank);
    maps_->merges.insert(pair_key(ia, ib), static_cast<int32_t>(rank), im);
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const int32_t found = maps_->vocab.find(token);
  if (found < 0) return std::nullopt;
  return found;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= size()) return nullptr;
  const std::string& t = id_to_token_[static_cast<size_t>(id)];
  // Gaps in the id range are empty; a real token is never empty.
  return t.empty() ? nullptr : &t;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out, WordCache& cache) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const int32_t found = maps_->vocab.find(word);
    if (found >= 0) {
      out.push_back(found);
      return;
    }
  }
  if (word.size() > kCacheMaxWordBytes) {
    merge_word(word, out);
    return;
  }
  cache.key.assign(word.data(), word.size());
  auto hit = cache.map.find(cache.key);
  if (hit != cache.map.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  const size_t before = out.size();
  merge_word(word, out);
  if (cache.map.size() >= kCacheMaxEntries) cache.map.clear();
  cache.map.emplace(cache.key, std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(before), out.end()));
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  auto add = [&](int32_t id) {
    const int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, -1, true});
    if (n > 0) syms[static_cast<size_t>(n - 1)].next = n;
  };
  std::optional<int32_t> pending_unk;  // fuse_unk joins a run of unknown characters
  std::string piece;
  for (size_t i = 0; i < word.size();) {
    const size_t begin = i;
    utf8_next(word, i);
    std::string_view ch = word.substr(begin, i - begin);
    int32_t found;
    if (!prefix_.empty() || !suffix_.empty()) {
      piece.clear();
      if (begin > 0) piece += prefix_;
      piece.append(ch);
      if (i >= word.size()) piece += suffix_;
      ch = piece;
      found = maps_->vocab.find(ch);
    } else {
      size_t k = 0;
      const uint32_t cp = utf8_next(ch, k);
      found = cp < maps_->char_ids.size() ? maps_->char_ids[cp] : maps_->vocab.find(ch);
    }
    if (found >= 0) {
      if (pending_unk) {
        add(*pending_unk);
        pending_unk.reset();
      }
      add(found);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_fallback_ids_[b] >= 0;
      if (all) {
        // As tokenizers: a pending unk is not flushed here (it can only exist when some byte
        // tokens are missing).
        for (unsigned char b : ch) add(byte_fallback_ids_[b]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) add(*pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk) add(*pending_unk);

  struct Candidate {
    int32_t rank, pos, id;
    bool operator<(const Candidate& o) const {  // priority_queue top = lowest rank, then leftmost
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  std::pair<int32_t, int32_t> hit;
  for (size_t k = 0; k + 1 < syms.size(); ++k)
    if (maps_->merges.find(pair_key(syms[k].id, syms[k + 1].id), hit))
      queue.push({hit.first, static_cast<int32_t>(k), hit.second});
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = syms[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = syms[static_cast<size_t>(left.next)];
    // Stale entry: one side has merged since it was queued.
    if (!maps_->merges.find(pair_key(left.id, right.id), hit) || hit.second != top.id) continue;
    left.id = top.id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) syms[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) {
      const Symbol& p = syms[static_cast<size_t>(left.prev)];
      if (maps_->merges.find(pair_key(p.id, left.id), hit)) queue.push({hit.first, left.prev, hit.second});
    }
    if (left.next >= 0) {
      const Symbol& n = syms[static_cast<size_t>(left.next)];
      if (maps_->merges.find(pair_key(left.id, n.id), hit)) queue.push({hit.first, top.pos, hit.second});
    }
  }
  for (const auto& s : syms)
    if (s.alive) out.push_back(s.id);
}

}  // namespace trainrun::text::detail
