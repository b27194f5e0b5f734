// Jinja2 lexer for chat templates. Facts from jinja2 3.1 (lexer.py): newlines are normalised to
// "\n" and one trailing newline dropped; `{%-`/`-%}` strip all whitespace on that side;
// trim_blocks drops the newline right after `%}`/`#}`; lstrip_blocks drops spaces and tabs between
// the start of a line and `{%`/`{#` (not `{{`), unless `+` asks to keep them; `%}` and `}}` end a
// tag only outside brackets; string literals take Python escapes.
#include "jinja_lexer.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "jinja_value.hpp"

namespace trainrun::text::jinja {
namespace {

bool is_space_str(const std::string& s, size_t from) {
  if (from >= s.size()) return false;
  for (char32_t c : utf8_decode(s.substr(from)))
    if (!is_py_space(c)) return false;
  return true;
}

std::string rstrip_py(const std::string& s) {
  std::u32string u = utf8_decode(s);
  size_t n = u.size();
  while (n > 0 && is_py_space(u[n - 1])) --n;
  return utf8_encode(u.substr(0, n));
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal's body, as jinja2 applies it.
std::string unescape(const std::string& body, int line) {
  std::string out;
  for (size_t k = 0; k < body.size(); ++k) {
    if (body[k] != '\\' || k + 1 >= body.size()) {
      out += body[k];
      continue;
    }
    const char e = body[++k];
    switch (e) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        char32_t cp = 0;
        for (size_t m = 0; m < n; ++m) {
          const int h = k + 1 + m < body.size() ? hexval(body[k + 1 + m]) : -1;
          if (h < 0)
            throw Error("truncated \\" + std::string(1, e) + " escape in a string literal", line);
          cp = cp * 16 + static_cast<char32_t>(h);
        }
        k += n;
        out += utf8_encode(cp);
        break;
      }
      case 'N':
        throw Error("\\N{...} escapes in string literals are not supported", line);
      default:
        if (e >= '0' && e <= '7') {
          char32_t cp = static_cast<char32_t>(e - '0');
          for (int m = 0; m < 2 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7';
               ++m)
            cp = cp * 8 + static_cast<char32_t>(body[++k] - '0');
          out += utf8_encode(cp);
        } else {
          out += '\\';  // unknown escapes stay as written
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) {
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += source[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t found = std::string::npos;
      for (size_t k = src_.find('{', pos_); k != std::string::npos && k + 1 < src_.size();
           k = src_.find('{', k + 1)) {
        const char c = src_[k + 1];
        if (c == '{' || c == '%' || c == '#') {
          found = k;
          break;
        }
      }
      if (found == std::string::npos) {
        data(src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      const char opener = src_[found + 1];
      const char sign =
          found + 2 < src_.size() && (src_[found + 2] == '-' || src_[found + 2] == '+')
              ? src_[found + 2]
              : 0;
      std::string text = src_.substr(pos_, found - pos_);
      const int text_lines = count_lines(text);
      text = strip_before_tag(std::move(text), sign, opener != '{', line_starting);
      data(text);
      line_ += text_lines - count_lines(text);
      pos_ = found + 2 + (sign ? 1 : 0);
      if (opener == '#') {
        line_starting = comment();
      } else if (opener == '%' && raw_begin()) {
        line_starting = raw();
      } else {
        line_starting = tag(opener == '%');
      }
    }
    toks_.push_back(Token{Token::Eof, "", line_});
    return std::move(toks_);
  }

 private:
  static int count_lines(const std::string& s) {
    int n = 0;
    for (char c : s) n += c == '\n';
    return n;
  }

  static std::string strip_before_tag(std::string text, char sign, bool is_block,
                                      bool line_starting) {
    if (sign == '-') return rstrip_py(text);
    if (sign == '+' || !is_block) return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting) && is_space_str(text, l_pos)) text.resize(l_pos);
    return text;
  }

  void data(const std::string& text) {
    if (!text.empty()) toks_.push_back(Token{Token::Data, text, line_});
    line_ += count_lines(text);
  }

  // Consumes what follows a closing `%}`/`#}`: `-` ate all whitespace, trim_blocks one newline.
  // Returns whether the consumed text ends with a newline (lstrip_blocks' "line starting").
  bool after_close(char sign) {
    bool newline = false;
    if (sign == '-') {
      while (pos_ < src_.size()) {
        // Python's \s in the lexer; ASCII whitespace covers what templates contain.
        const char c = src_[pos_];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\v' && c != '\f') break;
        newline = c == '\n';
        line_ += c == '\n';
        ++pos_;
      }
    } else if (sign == 0 && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
      newline = true;
    }
    return newline;
  }

  bool comment() {
    const int start = line_;
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) throw Error("missing end of comment tag", start);
    const char sign =
        end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    line_ += count_lines(src_.substr(pos_, end - pos_));
    pos_ = end + 2;
    return after_close(sign);
  }

  // `{% raw %}`: position is after `{%` and its sign.
  bool raw_begin() {
    size_t k = pos_;
    while (k < src_.size() && std::isspace(static_cast<unsigned char>(src_[k]))) ++k;
    if (src_.compare(k, 3, "raw") != 0) return false;
    k += 3;
    while (k < src_.size() && std::isspace(static_cast<unsigned char>(src_[k]))) ++k;
    if (src_.compare(k, 3, "-%}") == 0) {
      pos_ = k + 3;
      after_close('-');
      return true;
    }
    if (src_.compare(k, 2, "%}") == 0) {
      line_ += count_lines(src_.substr(pos_, k - pos_));
      pos_ = k + 2;
      return true;
    }
    return false;
  }

  bool raw() {
    const int start = line_;
    for (size_t k = src_.find("{%", pos_); k != std::string::npos; k = src_.find("{%", k + 1)) {
      size_t m = k + 2;
      const char sign = m < src_.size() && (src_[m] == '-' || src_[m] == '+') ? src_[m] : 0;
      if (sign) ++m;
      while (m < src_.size() && std::isspace(static_cast<unsigned char>(src_[m]))) ++m;
      if (src_.compare(m, 6, "endraw") != 0) continue;
      m += 6;
      while (m < src_.size() && std::isspace(static_cast<unsigned char>(src_[m]))) ++m;
      char close = 0;
      if (m < src_.size() && (src_[m] == '-' || src_[m] == '+')) close = src_[m++];
      if (src_.compare(m, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, k - pos_);
      const int text_lines = count_lines(text);
      text = strip_before_tag(std::move(text), sign, true, false);
      data(text);
      line_ += text_lines - count_lines(text) + count_lines(src_.substr(k, m - k));
      pos_ = m + 2;
      return after_close(close);
    }
    throw Error("missing {% endraw %} for this {% raw %}", start);
  }

  bool tag(bool block) {
    toks_.push_back(Token{block ? Token::BlockBegin : Token::VarBegin, "", line_});
    int depth = 0;
    const int start = line_;
    while (true) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_]))) {
        line_ += src_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= src_.size())
        throw Error(std::string("missing end of ") + (block ? "block tag '%}'" : "expression '}}'"),
                    start);
      if (depth == 0) {
        const char* close = block ? "%}" : "}}";
        for (char sign : {'-', '+', '\0'}) {
          if (sign == '+' && !block) continue;
          const std::string end = sign ? std::string(1, sign) + close : std::string(close);
          if (src_.compare(pos_, end.size(), end) == 0) {
            toks_.push_back(Token{block ? Token::BlockEnd : Token::VarEnd, "", line_});
            pos_ += end.size();
            if (!block && sign == 0) return false;
            return after_close(sign);
          }
        }
      }
      token(depth);
    }
  }

  void token(int& depth) {
    const char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t k = pos_;
      while (k < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[k])) || src_[k] == '_'))
        ++k;
      toks_.push_back(Token{Token::Name, src_.substr(pos_, k - pos_), line_});
      pos_ = k;
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      number();
      return;
    }
    if (c == '\'' || c == '"') {
      size_t k = pos_ + 1;
      while (k < src_.size() && src_[k] != c) k += src_[k] == '\\' ? 2 : 1;
      if (k >= src_.size()) throw Error("unterminated string literal", line_);
      const std::string body = src_.substr(pos_ + 1, k - pos_ - 1);
      toks_.push_back(Token{Token::String, unescape(body, line_), line_});
      line_ += count_lines(body);
      pos_ = k + 1;
      return;
    }
    static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                "/",  "%",  "~",  "<",  ">",  "=",  ".", ":", "|",
                                ",",  ";",  "(",  ")",  "[",  "]",  "{", "}"};
    for (const char* op : ops) {
      const size_t n = std::strlen(op);
      if (src_.compare(pos_, n, op) == 0) {
        if (n == 1 && std::strchr("([{", op[0])) ++depth;
        if (n == 1 && std::strchr(")]}", op[0])) --depth;
        toks_.push_back(Token{Token::Op, op, line_});
        pos_ += n;
        return;
      }
    }
    throw Error(std::string("unexpected character '") + c + "' in a tag", line_);
  }

  void number() {
    auto digits = [&](size_t k) {
      while (k < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[k])) || src_[k] == '_'))
        ++k;
      return k;
    };
    size_t k = digits(pos_);
    bool is_float = false;
    // `x.0` is an attribute lookup by index, not a float (jinja2's (?<!\.) lookbehind).
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
    if (!after_dot && k + 1 < src_.size() && src_[k] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[k + 1]))) {
      k = digits(k + 1);
      is_float = true;
    }
    if (!after_dot && k < src_.size() && (src_[k] == 'e' || src_[k] == 'E')) {
      size_t m = k + 1;
      if (m < src_.size() && (src_[m] == '+' || src_[m] == '-')) ++m;
      if (m < src_.size() && std::isdigit(static_cast<unsigned char>(src_[m]))) {
        k = digits(m);
        is_float = true;
      }
    }
    std::string text = src_.substr(pos_, k - pos_);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    Token t{is_float ? Token::Float : Token::Int, text, line_};
    try {
      if (is_float)
        t.fval = std::stod(text);
      else
        t.ival = std::stoll(text);
    } catch (const std::exception&) {
      throw Error("number literal out of range: " + text, line_);
    }
    toks_.push_back(t);
    pos_ = k;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> toks_;
};

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(source).run(); }

}  // namespace trainrun::text::jinja
