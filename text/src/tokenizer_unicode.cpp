// UTF-8, the byte-level alphabet, PCRE2 and ICU for the tokenizer (see tokenizer_internal.hpp).
#include "tokenizer_internal.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <stdexcept>

namespace trainrun::text::detail {

// ---- UTF-8 -------------------------------------------------------------------------------
namespace {
// Length of the well-formed prefix of the sequence starting at s[i] (Unicode table 3-7), and
// whether it is a complete character. A lone bad byte gives (1, false).
std::pair<size_t, bool> utf8_sequence(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {1, true};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
  else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false};
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= s.size()) return {k, false};
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {k, false};
  }
  return {k, true};
}
}  // namespace

size_t utf8_invalid_offset(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    auto [len, ok] = utf8_sequence(s, i);
    if (!ok) return i;
    i += len;
  }
  return std::string_view::npos;
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int n = b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : 1;
  uint32_t cp = b0 & (0x3F >> n);
  ++i;
  for (int k = 0; k < n && i < s.size(); ++k, ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3F);
  return cp;
}

uint32_t utf8_prev(std::string_view s, size_t& end) {
  size_t b = end;
  do {
    --b;
  } while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80);
  size_t i = b;
  const uint32_t cp = utf8_next(s, i);
  end = b;
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    auto [len, ok] = utf8_sequence(bytes, i);
    if (ok) out.append(bytes.substr(i, len));
    else out.append("\xEF\xBF\xBD");
    i += len;
  }
  return out;
}

bool is_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_word_char(uint32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  const auto t = u_charType(static_cast<UChar32>(c));
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_ALPHABETIC) || t == U_DECIMAL_DIGIT_NUMBER ||
         t == U_LETTER_NUMBER || t == U_OTHER_NUMBER || t == U_CONNECTOR_PUNCTUATION;
}

// ---- Byte-level alphabet -----------------------------------------------------------------
namespace {
struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::array<int, 324> byte_of{};  // code points 0..323 cover the whole alphabet
  ByteLevelTables() {
    byte_of.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      // Printable Latin-1 bytes stand for themselves; the others get 256, 257, ... in order.
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + static_cast<uint32_t>(extra++);
      utf8_append(chars[b], cp);
      byte_of[cp] = b;
    }
  }
};
const ByteLevelTables& byte_tables() {
  static const ByteLevelTables t;
  return t;
}
}  // namespace

const std::array<std::string, 256>& byte_level_chars() { return byte_tables().chars; }
int byte_level_byte(uint32_t cp) { return cp < 324 ? byte_tables().byte_of[cp] : -1; }

// ---- Regex -------------------------------------------------------------------------------
namespace {
// Oniguruma's \s (Unicode): U+0009..U+000D, U+0085 and the separators (Zs, Zl, Zp).
constexpr const char* kSpaceClassBody = "\\t-\\r \\x{85}\\p{Z}";

std::string translate_pattern(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kSpaceClassBody) : "[" + std::string(kSpaceClassBody) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kSpaceClassBody) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t end = p.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(p, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    // Long whitespace runs backtrack deeply in `\s+(?!\S)`; the default 32 KiB JIT stack is
    // too small for megabyte-long runs.
    stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};
ThreadMatchState& match_state() {
  thread_local ThreadMatchState s;
  return s;
}
}  // namespace

Regex::Regex(const std::string& pattern, bool literal, std::string origin)
    : pattern_(pattern), origin_(std::move(origin)) {
  const std::string p = literal ? pattern : translate_pattern(pattern);
  int err = 0;
  PCRE2_SIZE at = 0;
  // PCRE2_LITERAL refuses PCRE2_UCP (it has no classes to widen).
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), options, &err, &at, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw std::invalid_argument("regex /" + pattern + "/ does not compile: " +
                                reinterpret_cast<const char*>(msg) + " at offset " + std::to_string(at));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto& st = match_state();
  size_t start = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  while (start <= s.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, s.size(), start, PCRE2_NO_UTF_CHECK, st.data, st.context)
                  : pcre2_match(code, subject, s.size(), start, PCRE2_NO_UTF_CHECK, st.data, st.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtracking on the heap
      rc = pcre2_match(code, subject, s.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      // PCRE2_ERROR_MATCHLIMIT and its kin: a pattern of the tokenizer file, not the text, is at
      // fault (nested quantifiers backtrack exponentially), so the error names the file.
      throw v1::ConfigError(
          (origin_.empty() ? std::string("tokenizer regex") : origin_) + ": the pattern /" +
          pattern_ + "/ failed on a text of " + std::to_string(s.size()) +
          " bytes: " + reinterpret_cast<const char*>(msg) +
          " (the pattern backtracks too much; fix or remove it in the tokenizer file)");
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t b = ov[0], e = ov[1];
    out.emplace_back(b, e);
    if (e > b) {
      start = e;
    } else {  // empty match: step one character on
      if (e >= s.size()) break;
      size_t i = e;
      utf8_next(s, i);
      start = i;
    }
  }
}

// ---- ICU ---------------------------------------------------------------------------------
namespace {
bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}
}  // namespace

std::string unicode_normalize(std::string_view s, NormForm form) {
  if (is_ascii(s)) return std::string(s);  // ASCII is invariant under all four forms
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormForm::NFC: n = icu::Normalizer2::getNFCInstance(st); break;
    case NormForm::NFD: n = icu::Normalizer2::getNFDInstance(st); break;
    case NormForm::NFKC: n = icu::Normalizer2::getNFKCInstance(st); break;
    case NormForm::NFKD: n = icu::Normalizer2::getNFKDInstance(st); break;
  }
  if (U_FAILURE(st)) throw std::runtime_error(std::string("ICU normalizer unavailable: ") + u_errorName(st));
  const icu::StringPiece piece(s.data(), static_cast<int32_t>(s.size()));
  if (n->isNormalizedUTF8(piece, st) && U_SUCCESS(st)) return std::string(s);
  st = U_ZERO_ERROR;
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  icu::StringByteSink<std::string> sink(&out);
  n->normalizeUTF8(0, piece, sink, nullptr, st);
  if (U_FAILURE(st)) throw std::runtime_error(std::string("ICU normalization failed: ") + u_errorName(st));
  return out;
}

std::string unicode_lowercase(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return out;
  }
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  u.toLower(icu::Locale::getRoot());
  std::string out;
  u.toUTF8String(out);
  return out;
}

}  // namespace trainrun::text::detail
