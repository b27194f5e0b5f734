// Normalizers, pre-tokenizers, post-processors and decoders of tokenizer.json, each behaving as
// the `tokenizers` component of the same "type". Offsets are not tracked: only ids and text.
#include "tokenizer_internal.hpp"

#include <algorithm>
#include <sstream>

namespace trainrun::text::detail {

void Where::fail(const std::string& msg) const {
  throw v1::ConfigError(file + ": " + path + ": " + msg);
}

void check_id_range(int64_t max_id, int64_t entries, const Where& w, const std::string& what) {
  if (max_id >= entries + kMaxUnusedIds)
    w.fail(what + " holds id " + std::to_string(max_id) + " among " + std::to_string(entries) +
           " entries: more than " + std::to_string(kMaxUnusedIds) +
           " ids unused, which real tokenizers never leave (the id table would take " +
           std::to_string(max_id + 1) + " slots); the file is broken or hostile");
}

namespace {

using json = nlohmann::json;

std::string type_of(const json& j, const Where& w) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    w.fail("expected an object with a \"type\" string, got " + j.dump().substr(0, 80));
  return j["type"].get<std::string>();
}

std::string get_string(const json& j, const char* key, const Where& w, std::optional<std::string> dflt = {}) {
  if (!j.contains(key) || j[key].is_null()) {
    if (dflt) return *dflt;
    w.fail(std::string("missing \"") + key + "\"");
  }
  if (!j[key].is_string()) w.fail(std::string("\"") + key + "\" must be a string");
  return j[key].get<std::string>();
}

bool get_bool(const json& j, const char* key, const Where& w, bool dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) w.fail(std::string("\"") + key + "\" must be true or false");
  return j[key].get<bool>();
}

Where child(const Where& w, const std::string& suffix) { return Where{w.file, w.path + suffix}; }

// A {"String": s} or {"Regex": r} pattern of Split and Replace.
std::unique_ptr<Regex> make_pattern(const json& j, const Where& w) {
  if (!j.contains("pattern") || !j["pattern"].is_object()) w.fail("missing \"pattern\" object");
  const json& p = j["pattern"];
  try {
    const std::string origin =
        w.file + ": " + w.path + " (" + j.value("type", std::string("?")) + ")";
    if (p.contains("String") && p["String"].is_string())
      return std::make_unique<Regex>(p["String"].get<std::string>(), true, origin);
    if (p.contains("Regex") && p["Regex"].is_string())
      return std::make_unique<Regex>(p["Regex"].get<std::string>(), false, origin);
  } catch (const std::invalid_argument& e) {
    w.fail(std::string("pattern: ") + e.what());
  }
  w.fail("\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}, got " + p.dump());
}

uint32_t single_char(const std::string& s, const char* key, const Where& w) {
  if (s.empty() || utf8_invalid_offset(s) != std::string::npos) w.fail(std::string("\"") + key + "\" must be one character");
  size_t i = 0;
  const uint32_t cp = utf8_next(s, i);
  if (i != s.size()) w.fail(std::string("\"") + key + "\" must be one character, got \"" + s + "\"");
  return cp;
}

// ---- Normalizers -------------------------------------------------------------------------
class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormForm f) : form_(f) {}
  void apply(std::string& s) const override { s = unicode_normalize(s, form_); }

 private:
  NormForm form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void apply(std::string& s) const override { s = unicode_lowercase(s); }
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

std::string replace_all(const Regex& re, std::string_view s, const std::string& content) {
  std::vector<std::pair<size_t, size_t>> m;
  re.find_all(s, m);
  if (m.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size() + m.size() * content.size());
  size_t prev = 0;
  for (auto [b, e] : m) {
    out.append(s.substr(prev, b - prev));
    out += content;
    prev = e;
  }
  out.append(s.substr(prev));
  return out;
}

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void apply(std::string& s) const override { s = replace_all(*re_, s, content_); }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (right_)
      while (e > 0) {
        size_t p = e;
        if (!is_whitespace(utf8_prev(s, p))) break;
        e = p;
      }
    if (left_)
      while (b < e) {
        size_t n = b;
        if (!is_whitespace(utf8_next(s, n))) break;
        b = n;
      }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::string& s) const override {
    for (const auto& p : parts_) p->apply(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// ---- Pre-tokenizers ----------------------------------------------------------------------
enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const json& j, const Where& w) {
  const std::string b = get_string(j, "behavior", w);
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  w.fail("split behavior \"" + b + "\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

using Span = std::pair<uint32_t, uint32_t>;

// Cuts [b, e) of the buffer at the given matches (absolute offsets) as tokenizers'
// NormalizedString::split does, appending the kept non-empty pieces to `out`.
void split_piece(uint32_t b, uint32_t e, const std::vector<std::pair<size_t, size_t>>& matches, bool invert,
                 Behavior behavior, std::vector<Span>& out) {
  std::vector<std::pair<Span, bool>> parts;  // (range, is_match), covering [b, e)
  uint32_t prev = b;
  for (auto [mb, me] : matches) {
    if (prev != mb) parts.push_back({{prev, static_cast<uint32_t>(mb)}, invert});
    parts.push_back({{static_cast<uint32_t>(mb), static_cast<uint32_t>(me)}, !invert});
    prev = static_cast<uint32_t>(me);
  }
  if (prev != e) parts.push_back({{prev, e}, invert});
  std::vector<Span> kept;
  switch (behavior) {
    case Behavior::Removed:
      for (auto& [r, m] : parts)
        if (!m) kept.push_back(r);
      break;
    case Behavior::Isolated:
      for (auto& [r, m] : parts) kept.push_back(r);
      break;
    case Behavior::MergedWithPrevious: {
      bool prev_match = false;
      for (auto& [r, m] : parts) {
        if (m && !prev_match && !kept.empty()) kept.back().second = r.second;
        else kept.push_back(r);
        prev_match = m;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->second && !prev_match && !kept.empty()) kept.back().first = it->first.first;
        else kept.push_back(it->first);
        prev_match = it->second;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case Behavior::Contiguous: {
      bool prev_match = false;
      for (auto& [r, m] : parts) {
        if (m == prev_match && !kept.empty()) kept.back().second = r.second;
        else kept.push_back(r);
        prev_match = m;
      }
      break;
    }
  }
  for (const auto& r : kept)
    if (r.second > r.first) out.push_back(r);
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> re, Behavior b, bool invert) : re_(std::move(re)), behavior_(b), invert_(invert) {}
  void apply(PreTokenized& pt) const override {
    std::vector<Span> out;
    out.reserve(pt.pieces.size() * 2);
    std::vector<std::pair<size_t, size_t>> m;
    const std::string_view buf(pt.buf);
    for (auto [b, e] : pt.pieces) {
      m.clear();
      re_->find_all(buf.substr(b, e - b), m);
      for (auto& x : m) x = {x.first + b, x.second + b};
      split_piece(b, e, m, invert_, behavior_, out);
    }
    pt.pieces.swap(out);
  }

 private:
  std::unique_ptr<Regex> re_;
  Behavior behavior_;
  bool invert_;
};

const Regex& gpt2_regex() {
  static const Regex re("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
  return re;
}

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void apply(PreTokenized& pt) const override {
    const auto& chars = byte_level_chars();
    std::string buf;
    buf.reserve(pt.buf.size() * 2);
    std::vector<Span> pieces;
    pieces.reserve(pt.pieces.size());
    std::vector<std::pair<size_t, size_t>> m;
    std::vector<Span> sub;
    std::string prefixed;
    for (auto [b, e] : pt.pieces) {
      std::string_view piece(pt.buf.data() + b, e - b);
      if (add_prefix_space_ && piece[0] != ' ') {
        prefixed = " ";
        prefixed.append(piece);
        piece = prefixed;
      }
      sub.clear();
      if (use_regex_) {
        m.clear();
        gpt2_regex().find_all(piece, m);
        split_piece(0, static_cast<uint32_t>(piece.size()), m, false, Behavior::Isolated, sub);
      } else {
        sub.push_back({0, static_cast<uint32_t>(piece.size())});
      }
      for (auto [sb, se] : sub) {
        const auto start = static_cast<uint32_t>(buf.size());
        for (uint32_t k = sb; k < se; ++k) buf += chars[static_cast<unsigned char>(piece[k])];
        pieces.push_back({start, static_cast<uint32_t>(buf.size())});
      }
    }
    pt.buf.swap(buf);
    pt.pieces.swap(pieces);
  }

 private:
  bool add_prefix_space_, use_regex_;
};

enum class PrependScheme { Always, First, Never };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string rep, PrependScheme scheme, bool split)
      : rep_(std::move(rep)), scheme_(scheme), split_(split), splitter_(rep_, true) {}
  void apply(PreTokenized& pt) const override {
    std::string buf;
    buf.reserve(pt.buf.size() * 2);
    std::vector<Span> pieces;
    std::vector<std::pair<size_t, size_t>> m;
    for (auto [b, e] : pt.pieces) {
      std::string s;
      for (uint32_t k = b; k < e; ++k) {
        if (pt.buf[k] == ' ') s += rep_;
        else s += pt.buf[k];
      }
      const bool starts = s.compare(0, rep_.size(), rep_) == 0;
      if (!starts && (scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && b == 0 && pt.at_origin)))
        s.insert(0, rep_);
      const auto base = static_cast<uint32_t>(buf.size());
      buf += s;
      if (split_) {
        m.clear();
        splitter_.find_all(s, m);
        for (auto& x : m) x = {x.first + base, x.second + base};
        split_piece(base, static_cast<uint32_t>(buf.size()), m, false, Behavior::MergedWithNext, pieces);
      } else if (!s.empty()) {
        pieces.push_back({base, static_cast<uint32_t>(buf.size())});
      }
    }
    pt.buf.swap(buf);
    pt.pieces.swap(pieces);
  }

 private:
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
  Regex splitter_;
};

// Whitespace (`\w+|[^\w\s]+` kept), WhitespaceSplit (whitespace removed), Digits.
class RegexKeepPreTokenizer : public PreTokenizer {
 public:
  RegexKeepPreTokenizer(const std::string& pattern, bool invert, Behavior behavior)
      : re_(pattern), invert_(invert), behavior_(behavior) {}
  void apply(PreTokenized& pt) const override {
    std::vector<Span> out;
    std::vector<std::pair<size_t, size_t>> m;
    const std::string_view buf(pt.buf);
    for (auto [b, e] : pt.pieces) {
      m.clear();
      re_.find_all(buf.substr(b, e - b), m);
      for (auto& x : m) x = {x.first + b, x.second + b};
      split_piece(b, e, m, invert_, behavior_, out);
    }
    pt.pieces.swap(out);
  }

 private:
  Regex re_;
  bool invert_;
  Behavior behavior_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void apply(PreTokenized& pt) const override {
    for (const auto& p : parts_) p->apply(pt);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

PrependScheme parse_prepend_scheme(const json& j, const Where& w) {
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const std::string s = get_string(j, "prepend_scheme", w);
    if (s == "always") return PrependScheme::Always;
    if (s == "first") return PrependScheme::First;
    if (s == "never") return PrependScheme::Never;
    w.fail("prepend_scheme \"" + s + "\" is not one of always, first, never");
  }
  // Files written before prepend_scheme existed say add_prefix_space.
  return get_bool(j, "add_prefix_space", w, true) ? PrependScheme::Always : PrependScheme::Never;
}

// ---- Post-processors ---------------------------------------------------------------------
class TemplatePostProcessor : public PostProcessor {
 public:
  // Each item: the special tokens' ids, or empty with is_sequence for $A.
  struct Item {
    bool is_sequence;
    std::vector<int32_t> ids;
  };
  explicit TemplatePostProcessor(std::vector<Item> items) : items_(std::move(items)) {}
  void apply(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& it : items_) {
      if (it.is_sequence) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), it.ids.begin(), it.ids.end());
    }
    ids.swap(out);
  }

 private:
  std::vector<Item> items_;
};

class NoOpPostProcessor : public PostProcessor {
 public:
  void apply(std::vector<int32_t>&, bool) const override {}
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<int32_t>& ids, bool add) const override {
    for (const auto& p : parts_) p->apply(ids, add);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

std::unique_ptr<PostProcessor> make_template(const json& j, const Where& w) {
  if (!j.contains("special_tokens") || !j["special_tokens"].is_object()) w.fail("missing \"special_tokens\" object");
  const json& specials = j["special_tokens"];
  auto special_ids = [&](const std::string& name) {
    if (!specials.contains(name)) w.fail("template names special token \"" + name + "\" missing from \"special_tokens\"");
    const json& s = specials[name];
    if (!s.contains("ids") || !s["ids"].is_array()) w.fail("special_tokens." + name + " has no \"ids\" array");
    return s["ids"].get<std::vector<int32_t>>();
  };
  std::vector<TemplatePostProcessor::Item> items;
  const json& single = j.contains("single") ? j["single"] : json();
  auto add_sequence = [&](const std::string& id) {
    if (id != "A") w.fail("the \"single\" template refers to sequence \"" + id + "\"; only A exists for one text");
    items.push_back({true, {}});
  };
  if (single.is_array()) {
    for (const auto& piece : single) {
      if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id"))
        items.push_back({false, special_ids(piece["SpecialToken"]["id"].get<std::string>())});
      else if (piece.contains("Sequence") && piece["Sequence"].contains("id"))
        add_sequence(piece["Sequence"]["id"].get<std::string>());
      else
        w.fail("template piece " + piece.dump() + " is neither SpecialToken nor Sequence");
    }
  } else if (single.is_string()) {  // "<s> $A" shorthand
    std::string s = single.get<std::string>(), tok;
    std::istringstream in(s);
    while (in >> tok) {
      const std::string name = tok.substr(0, tok.find(':'));
      if (!name.empty() && name[0] == '$') add_sequence(name.size() == 1 || name == "$0" ? "A" : name.substr(1));
      else items.push_back({false, special_ids(name)});
    }
  } else {
    w.fail("missing \"single\" template");
  }
  return std::make_unique<TemplatePostProcessor>(std::move(items));
}

// ---- Decoders ----------------------------------------------------------------------------
class ByteLevelDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      const size_t mark = bytes.size();
      bool ok = true;
      for (size_t i = 0; i < t.size();) {
        const int b = byte_level_byte(utf8_next(t, i));
        if (b < 0) {
          ok = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!ok) {  // a token outside the byte alphabet (an added token) stands for its own bytes
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = replace_all(*re_, t, content_);
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8_invalid_offset(pending) == std::string::npos) out.push_back(pending);
      else
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (auto& t : tokens) {
      int hi = -1, lo = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        hi = hex_digit(t[3]);
        lo = hex_digit(t[4]);
      }
      if (hi >= 0 && lo >= 0) {
        pending.push_back(static_cast<char>(hi * 16 + lo));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, all);
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(uint32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<uint32_t, size_t>> chars;  // (code point, byte offset)
      for (size_t i = 0; i < t.size();) {
        const size_t at = i;
        chars.push_back({utf8_next(t, i), at});
      }
      size_t start_cut = 0;
      for (size_t k = 0; k < start_ && k < chars.size(); ++k) {
        if (chars[k].first != content_) break;
        start_cut = k + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t k = 0; k < stop_ && k < chars.size(); ++k) {
        const size_t idx = chars.size() - k - 1;
        if (chars[idx].first != content_) break;
        stop_cut = idx;
      }
      const size_t b = start_cut < chars.size() ? chars[start_cut].second : t.size();
      const size_t e = stop_cut < chars.size() ? chars[stop_cut].second : t.size();
      t = e > b ? t.substr(b, e - b) : std::string();
    }
  }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(uint32_t rep, PrependScheme scheme) : rep_(rep), scheme_(scheme) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string out;
      const std::string& t = tokens[k];
      for (size_t i = 0; i < t.size();) {
        const size_t at = i;
        const uint32_t cp = utf8_next(t, i);
        if (cp != rep_) out.append(t, at, i - at);
        else if (!(k == 0 && scheme_ != PrependScheme::Never)) out += ' ';
      }
      tokens[k] = std::move(out);
    }
  }

 private:
  uint32_t rep_;
  PrependScheme scheme_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->apply(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

template <class T, class F>
std::vector<std::unique_ptr<T>> make_list(const json& j, const char* key, const Where& w, F make) {
  if (!j.contains(key) || !j[key].is_array()) w.fail(std::string("missing \"") + key + "\" array");
  std::vector<std::unique_ptr<T>> parts;
  for (size_t k = 0; k < j[key].size(); ++k)
    parts.push_back(make(j[key][k], child(w, std::string(".") + key + "[" + std::to_string(k) + "]")));
  return parts;
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const Where& w) {
  const std::string type = type_of(j, w);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(get_string(j, "prepend", w));
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(make_pattern(j, w), get_string(j, "content", w));
  if (type == "Strip") return std::make_unique<StripNormalizer>(get_bool(j, "strip_left", w, true), get_bool(j, "strip_right", w, true));
  if (type == "Sequence")
    return std::make_unique<SequenceNormalizer>(make_list<Normalizer>(j, "normalizers", w, make_normalizer));
  w.fail("normalizer type \"" + type + "\" is not supported");
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const Where& w) {
  const std::string type = type_of(j, w);
  if (type == "Split") return std::make_unique<SplitPreTokenizer>(make_pattern(j, w), parse_behavior(j, w), get_bool(j, "invert", w, false));
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPreTokenizer>(get_bool(j, "add_prefix_space", w, true), get_bool(j, "use_regex", w, true));
  if (type == "Metaspace") {
    const std::string rep = get_string(j, "replacement", w, std::string("\xE2\x96\x81"));
    single_char(rep, "replacement", w);
    return std::make_unique<MetaspacePreTokenizer>(rep, parse_prepend_scheme(j, w), get_bool(j, "split", w, true));
  }
  if (type == "Whitespace") return std::make_unique<RegexKeepPreTokenizer>("\\w+|[^\\w\\s]+", true, Behavior::Removed);
  if (type == "WhitespaceSplit") return std::make_unique<RegexKeepPreTokenizer>("\\s+", false, Behavior::Removed);
  if (type == "Digits")
    return std::make_unique<RegexKeepPreTokenizer>(get_bool(j, "individual_digits", w, false) ? "\\p{N}" : "\\p{N}+", false, Behavior::Isolated);
  if (type == "Sequence")
    return std::make_unique<SequencePreTokenizer>(make_list<PreTokenizer>(j, "pretokenizers", w, make_pre_tokenizer));
  w.fail("pre-tokenizer type \"" + type + "\" is not supported");
}

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const Where& w, const TokenLookup& lookup) {
  const std::string type = type_of(j, w);
  if (type == "TemplateProcessing") return make_template(j, w);
  if (type == "ByteLevel") return std::make_unique<NoOpPostProcessor>();  // it only trims offsets
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto token = [&](const char* key) {
      if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 || !j[key][1].is_number_integer())
        w.fail(std::string("\"") + key + "\" must be [token, id]");
      return j[key][1].get<int32_t>();
    };
    std::vector<TemplatePostProcessor::Item> items{{false, {token("cls")}}, {true, {}}, {false, {token("sep")}}};
    return std::make_unique<TemplatePostProcessor>(std::move(items));
  }
  if (type == "Sequence") {
    auto make = [&](const json& p, const Where& pw) { return make_post_processor(p, pw, lookup); };
    return std::make_unique<SequencePostProcessor>(make_list<PostProcessor>(j, "processors", w, make));
  }
  w.fail("post-processor type \"" + type + "\" is not supported");
}

std::unique_ptr<PostProcessor> make_bos_eos_processor(std::optional<int32_t> bos, std::optional<int32_t> eos) {
  std::vector<TemplatePostProcessor::Item> items;
  if (bos) items.push_back({false, {*bos}});
  items.push_back({true, {}});
  if (eos) items.push_back({false, {*eos}});
  return std::make_unique<TemplatePostProcessor>(std::move(items));
}

std::unique_ptr<Decoder> make_decoder(const json& j, const Where& w) {
  const std::string type = type_of(j, w);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(make_pattern(j, w), get_string(j, "content", w));
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const uint32_t content = single_char(get_string(j, "content", w), "content", w);
    auto count = [&](const char* key) {
      if (!j.contains(key) || !j[key].is_number_unsigned()) w.fail(std::string("\"") + key + "\" must be a count");
      return j[key].get<size_t>();
    };
    return std::make_unique<StripDecoder>(content, count("start"), count("stop"));
  }
  if (type == "Metaspace") {
    const uint32_t rep = single_char(get_string(j, "replacement", w, std::string("\xE2\x96\x81")), "replacement", w);
    return std::make_unique<MetaspaceDecoder>(rep, parse_prepend_scheme(j, w));
  }
  if (type == "Sequence") return std::make_unique<SequenceDecoder>(make_list<Decoder>(j, "decoders", w, make_decoder));
  w.fail("decoder type \"" + type + "\" is not supported");
}

}  // namespace trainrun::text::detail
