// Jinja2 lexer and parser for chat templates. Facts from jinja2 3.1 (lexer.py, parser.py):
// newlines are normalised to "\n" and one trailing newline dropped; `{%-`/`-%}` strip all
// whitespace on that side; trim_blocks drops the newline right after `%}`/`#}`; lstrip_blocks
// drops spaces and tabs between the start of a line and `{%`/`{#` (not `{{`), unless `+` asks to
// keep them; `%}` and `}}` end a tag only outside brackets; string literals take Python escapes.
#include "jinja_syntax.hpp"

#include <algorithm>
#include <cstring>

#include "jinja_builtins.hpp"

namespace trainrun::text::jinja {
namespace {

struct Token {
  enum Type { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };
  Type type;
  std::string value;
  int line;
  int64_t ival = 0;
  double fval = 0;
};

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
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        char32_t cp = 0;
        for (size_t m = 0; m < n; ++m) {
          const int h = k + 1 + m < body.size() ? hexval(body[k + 1 + m]) : -1;
          if (h < 0) throw Error("truncated \\" + std::string(1, e) + " escape in a string literal", line);
          cp = cp * 16 + static_cast<char32_t>(h);
        }
        k += n;
        out += utf8_encode(cp);
        break;
      }
      case 'N': throw Error("\\N{...} escapes in string literals are not supported", line);
      default:
        if (e >= '0' && e <= '7') {
          char32_t cp = static_cast<char32_t>(e - '0');
          for (int m = 0; m < 2 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7'; ++m)
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
      for (size_t k = src_.find('{', pos_); k != std::string::npos && k + 1 < src_.size(); k = src_.find('{', k + 1)) {
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
      const char sign = found + 2 < src_.size() && (src_[found + 2] == '-' || src_[found + 2] == '+') ? src_[found + 2] : 0;
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

  static std::string strip_before_tag(std::string text, char sign, bool is_block, bool line_starting) {
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
    const char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
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
        throw Error(std::string("missing end of ") + (block ? "block tag '%}'" : "expression '}}'"), start);
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
      while (k < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[k])) || src_[k] == '_')) ++k;
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
    static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                "=", ".", ":", "|", ",", ";", "(", ")", "[", "]", "{", "}"};
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
      while (k < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[k])) || src_[k] == '_')) ++k;
      return k;
    };
    size_t k = digits(pos_);
    bool is_float = false;
    // `x.0` is an attribute lookup by index, not a float (jinja2's (?<!\.) lookbehind).
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
    if (!after_dot && k + 1 < src_.size() && src_[k] == '.' && std::isdigit(static_cast<unsigned char>(src_[k + 1]))) {
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
      if (is_float) t.fval = std::stod(text);
      else t.ival = std::stoll(text);
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

ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : toks_(std::move(toks)) {}

  Body parse_template() {
    std::string end;
    return parse_body({}, end);
  }

 private:
  const Token& cur() const { return toks_[p_]; }
  const Token& look() const { return toks_[std::min(p_ + 1, toks_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Token::Op && cur().value == op; }
  bool is_name(const char* name) const { return cur().type == Token::Name && cur().value == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++p_;
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    ++p_;
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Token::Data: return "template data";
      case Token::VarBegin: return "'{{'";
      case Token::VarEnd: return "end of print statement '}}'";
      case Token::BlockBegin: return "'{%'";
      case Token::BlockEnd: return "end of statement block '%}'";
      case Token::String: return "string literal";
      case Token::Int:
      case Token::Float: return "number " + t.value;
      case Token::Eof: return "end of template";
      default: return "'" + t.value + "'";
    }
  }

  [[noreturn]] void fail(const std::string& what) const { throw Error(what, cur().line); }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Token::Name) fail("expected a name, got " + describe(cur()));
    return toks_[p_++].value;
  }
  void expect_block_end() {
    if (cur().type != Token::BlockEnd) fail("expected end of statement block '%}', got " + describe(cur()));
    ++p_;
  }

  // Statements until one of `ends` (the end tag is consumed; its name is returned in `which`).
  Body parse_body(const std::vector<std::string>& ends, std::string& which) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Token::Eof) {
        if (!ends.empty()) fail("unexpected end of template, expected '{% " + ends.back() + " %}'");
        return body;
      }
      if (t.type == Token::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->line = t.line;
        s->text = t.value;
        body.push_back(std::move(s));
        ++p_;
      } else if (t.type == Token::VarBegin) {
        ++p_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->line = t.line;
        s->expr = parse_tuple(false, true, false, {});
        if (cur().type != Token::VarEnd) fail("expected end of print statement '}}', got " + describe(cur()));
        ++p_;
        body.push_back(std::move(s));
      } else if (t.type == Token::BlockBegin) {
        ++p_;
        if (cur().type != Token::Name) fail("expected a tag name after '{%', got " + describe(cur()));
        const std::string name = cur().value;
        for (const auto& end : ends)
          if (name == end) {
            ++p_;
            which = name;
            return body;
          }
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    const int line = cur().line;
    const std::string tag = cur().value;
    ++p_;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    std::string which;
    if (tag == "if") {
      s->kind = Stmt::Kind::If;
      ExprPtr cond = parse_tuple(false, false, false, {});
      expect_block_end();
      while (true) {
        Body body = parse_body({"elif", "else", "endif"}, which);
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (which == "elif") {
          cond = parse_tuple(false, false, false, {});
          expect_block_end();
          continue;
        }
        expect_block_end();
        if (which == "else") {
          s->else_body = parse_body({"endif"}, which);
          expect_block_end();
        }
        break;
      }
    } else if (tag == "for") {
      s->kind = Stmt::Kind::For;
      s->target = parse_target(false);
      if (!skip_name("in")) fail("expected 'in' in the for loop, got " + describe(cur()));
      s->expr = parse_tuple(false, false, false, {"recursive"});
      if (skip_name("if")) s->cond = parse_expression(true);
      if (is_name("recursive")) fail("unsupported construct: recursive for loops");
      expect_block_end();
      s->body = parse_body({"endfor", "else"}, which);
      expect_block_end();
      if (which == "else") {
        s->else_body = parse_body({"endfor"}, which);
        expect_block_end();
      }
    } else if (tag == "set") {
      s->target = parse_target(true);
      if (skip_op("=")) {
        s->kind = Stmt::Kind::Set;
        s->expr = parse_tuple(false, true, false, {});
        expect_block_end();
      } else {
        s->kind = Stmt::Kind::SetBlock;
        if (s->target.tuple || !s->target.attr.empty()) fail("a block {% set %} assigns to a single name");
        parse_filter_chain(s->filters);
        expect_block_end();
        s->body = parse_body({"endset"}, which);
        expect_block_end();
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!s->params.empty()) expect_op(",");
        if (is_op(")")) break;
        if (is_op("*") || is_op("**")) fail("unsupported construct: *args/**kwargs in a macro signature");
        std::string param = expect_name();
        ExprPtr def;
        if (skip_op("=")) def = parse_expression(true);
        else if (!s->params.empty() && s->params.back().second)
          fail("non-default argument follows default argument in macro '" + s->text + "'");
        s->params.emplace_back(std::move(param), std::move(def));
      }
      expect_op(")");
      expect_block_end();
      s->body = parse_body({"endmacro"}, which);
      if (cur().type == Token::Name) ++p_;  // {% endmacro name %}
      expect_block_end();
    } else if (tag == "filter") {
      s->kind = Stmt::Kind::FilterBlock;
      parse_filter_chain(s->filters, true);
      expect_block_end();
      s->body = parse_body({"endfilter"}, which);
      expect_block_end();
    } else if (tag == "with") {
      s->kind = Stmt::Kind::With;
      while (cur().type != Token::BlockEnd) {
        if (!s->params.empty()) expect_op(",");
        std::string name = expect_name();
        expect_op("=");
        s->params.emplace_back(std::move(name), parse_expression(true));
      }
      expect_block_end();
      s->body = parse_body({"endwith"}, which);
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      expect_block_end();
    } else if (tag == "generation") {
      // transformers' AssistantTracker extension: marks assistant text; renders its body as is.
      s->kind = Stmt::Kind::Generation;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, which);
      expect_block_end();
    } else {
      throw Error("unsupported construct: the tag {% " + tag + " %}", line);
    }
    return s;
  }

  // `|f(args)|g` chains of {% filter %} and {% set x | f %}.
  void parse_filter_chain(std::vector<ExprPtr>& out, bool first_without_bar = false) {
    bool first = first_without_bar;
    while (first || is_op("|")) {
      if (!first) ++p_;
      first = false;
      out.push_back(parse_filter_tail(nullptr));
    }
  }

  Target parse_target(bool with_namespace) {
    Target t;
    if (with_namespace && cur().type == Token::Name && look().type == Token::Op && look().value == ".") {
      t.names.push_back(expect_name());
      ++p_;
      t.attr = expect_name();
      return t;
    }
    bool parens = skip_op("(");
    t.names.push_back(expect_name());
    while (skip_op(",")) {
      t.tuple = true;
      if (cur().type != Token::Name) break;
      t.names.push_back(expect_name());
    }
    if (parens) {
      expect_op(")");
      t.tuple = true;
    }
    return t;
  }

  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    if (cur().type == Token::VarEnd || cur().type == Token::BlockEnd || is_op(")")) return true;
    for (const auto& n : extra_end)
      if (is_name(n.c_str())) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, bool explicit_parens,
                      const std::vector<std::string>& extra_end) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail("expected an expression, got " + describe(cur()));
    }
    auto e = make(Expr::Kind::TupleLit, line);
    for (auto& item : items) e->args.push_back(Arg{"", std::move(item)});
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      ++p_;
      auto e = make(Expr::Kind::CondExpr, line);
      e->a = parse_or();  // condition
      e->b = std::move(expr);
      if (skip_name("else")) e->c = parse_condexpr();
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto e = make(Expr::Kind::Or, cur().line);
      ++p_;
      e->a = std::move(left);
      e->b = parse_and();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto e = make(Expr::Kind::And, cur().line);
      ++p_;
      e->a = std::move(left);
      e->b = parse_not();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto e = make(Expr::Kind::Not, cur().line);
      ++p_;
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr expr = parse_math1();
    auto e = make(Expr::Kind::Compare, line);
    while (true) {
      static const std::pair<const char*, const char*> ops[] = {
          {"==", "eq"}, {"!=", "ne"}, {"<", "lt"}, {"<=", "lteq"}, {">", "gt"}, {">=", "gteq"}};
      bool matched = false;
      for (const auto& op : ops)
        if (is_op(op.first)) {
          ++p_;
          e->ops.push_back(op.second);
          matched = true;
          break;
        }
      if (!matched) {
        if (skip_name("in")) e->ops.push_back("in");
        else if (is_name("not") && look().type == Token::Name && look().value == "in") {
          p_ += 2;
          e->ops.push_back("notin");
        } else {
          break;
        }
      }
      e->operands.push_back(parse_math1());
    }
    if (e->ops.empty()) return expr;
    e->a = std::move(expr);
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = make(Expr::Kind::Binary, line);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().value;
      const int line = cur().line;
      ++p_;
      left = binary(op, std::move(left), parse_concat(), line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      ++p_;
      left = binary("~", std::move(left), parse_math2(), line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().value;
      const int line = cur().line;
      ++p_;
      left = binary(op, std::move(left), parse_pow(), line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      ++p_;
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make(is_op("-") ? Expr::Kind::Neg : Expr::Kind::Pos, cur().line);
      ++p_;
      node->a = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    auto e = make(Expr::Kind::Const, t.line);
    switch (t.type) {
      case Token::Name:
        if (t.value == "true" || t.value == "True") e->constant = Value::boolean(true);
        else if (t.value == "false" || t.value == "False") e->constant = Value::boolean(false);
        else if (t.value == "none" || t.value == "None") e->constant = Value::none();
        else {
          e->kind = Expr::Kind::Name;
          e->name = t.value;
        }
        ++p_;
        return e;
      case Token::String: {
        std::string s;
        while (cur().type == Token::String) s += toks_[p_++].value;  // adjacent literals join
        e->constant = Value::string(std::move(s));
        return e;
      }
      case Token::Int: e->constant = Value::integer(t.ival); ++p_; return e;
      case Token::Float: e->constant = Value::number(t.fval); ++p_; return e;
      default: break;
    }
    if (skip_op("(")) {
      ExprPtr inner = parse_tuple(false, true, true, {});
      expect_op(")");
      return inner;
    }
    if (is_op("[")) {
      e->kind = Expr::Kind::ListLit;
      ++p_;
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(Arg{"", parse_expression(true)});
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      e->kind = Expr::Kind::DictLit;
      ++p_;
      while (!is_op("}")) {
        if (!e->pairs.empty()) expect_op(",");
        if (is_op("}")) break;
        ExprPtr key = parse_expression(true);
        expect_op(":");
        e->pairs.emplace_back(std::move(key), parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) node = parse_subscript(std::move(node));
      else if (is_op("(")) node = parse_call(std::move(node));
      else return node;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        ++p_;
        node = parse_filter_tail(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const int line = cur().line;
    if (skip_op(".")) {
      if (cur().type == Token::Name) {
        auto e = make(Expr::Kind::GetAttr, line);
        e->a = std::move(node);
        e->name = toks_[p_++].value;
        return e;
      }
      if (cur().type != Token::Int) fail("expected a name or number after '.', got " + describe(cur()));
      auto e = make(Expr::Kind::GetItem, line);
      e->a = std::move(node);
      e->b = make(Expr::Kind::Const, line);
      e->b->constant = Value::integer(toks_[p_++].ival);
      return e;
    }
    expect_op("[");
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    if (args.size() != 1) fail("unsupported construct: a subscript with several indices");
    ExprPtr arg = std::move(args[0]);
    if (arg->kind == Expr::Kind::Slice) {
      arg->a = std::move(node);
      return arg;
    }
    auto e = make(Expr::Kind::GetItem, line);
    e->a = std::move(node);
    e->b = std::move(arg);
    return e;
  }

  // An index or a slice `start:stop:step` (each part optional); the slice's object is set later.
  ExprPtr parse_subscribed() {
    const int line = cur().line;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    ++p_;  // ':'
    auto e = make(Expr::Kind::Slice, line);
    e->b = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) e->d = parse_expression(true);
    if (skip_op(":"))
      if (!is_op("]") && !is_op(",")) e->c = parse_expression(true);
    return e;
  }

  void parse_call_args(std::vector<Arg>& args) {
    expect_op("(");
    bool need_comma = false;
    while (!is_op(")")) {
      if (need_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail("unsupported construct: *args/**kwargs in a call");
      if (cur().type == Token::Name && look().type == Token::Op && look().value == "=") {
        std::string key = toks_[p_].value;
        p_ += 2;
        args.push_back(Arg{key, parse_expression(true)});
      } else {
        if (!args.empty() && !args.back().name.empty()) fail("positional argument follows keyword argument");
        args.push_back(Arg{"", parse_expression(true)});
      }
      need_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(Expr::Kind::Call, cur().line);
    e->a = std::move(node);
    parse_call_args(e->args);
    return e;
  }

  ExprPtr parse_filter_tail(ExprPtr node) {
    auto e = make(Expr::Kind::Filter, cur().line);
    e->name = expect_name();
    while (is_op(".")) {
      ++p_;
      e->name += "." + expect_name();
    }
    e->a = std::move(node);
    if (is_op("(")) parse_call_args(e->args);
    return e;
  }

  ExprPtr parse_test(ExprPtr node) {
    auto e = make(Expr::Kind::Test, cur().line);
    ++p_;  // 'is'
    e->negated = skip_name("not");
    e->name = expect_name();
    while (is_op(".")) {
      ++p_;
      e->name += "." + expect_name();
    }
    e->a = std::move(node);
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(e->args);
    } else if ((t.type == Token::Name || t.type == Token::String || t.type == Token::Int || t.type == Token::Float ||
                is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("you cannot chain multiple tests with 'is'");
      e->args.push_back(Arg{"", parse_postfix(parse_primary())});
    }
    return e;
  }

  std::vector<Token> toks_;
  size_t p_ = 0;
};

// An unknown filter or test is refused when the template is compiled, except inside an `if` or an
// inline if-expression, where jinja2 ("soft frames") refuses it only when it is reached; `for`,
// macro, {% set %}/{% filter %} and {% with %} bodies start a fresh frame that is not soft.
void check_names(const Expr* e, bool soft);

void check_names(const Body& body, bool soft) {
  for (const auto& s : body) {
    check_names(s->expr.get(), soft);
    switch (s->kind) {
      case Stmt::Kind::If:
        for (const auto& branch : s->branches) {
          check_names(branch.first.get(), true);
          check_names(branch.second, true);
        }
        check_names(s->else_body, true);
        break;
      case Stmt::Kind::For:
        check_names(s->cond.get(), false);
        check_names(s->body, false);
        check_names(s->else_body, false);
        break;
      case Stmt::Kind::Macro:
      case Stmt::Kind::With:
        for (const auto& p : s->params) check_names(p.second.get(), soft);
        check_names(s->body, false);
        break;
      case Stmt::Kind::SetBlock:
      case Stmt::Kind::FilterBlock:
        for (const auto& f : s->filters) check_names(f.get(), soft);
        check_names(s->body, false);
        break;
      case Stmt::Kind::Generation: check_names(s->body, soft); break;
      default: break;
    }
  }
}

void check_names(const Expr* e, bool soft) {
  if (!e) return;
  if (e->kind == Expr::Kind::CondExpr) soft = true;
  if (!soft && e->kind == Expr::Kind::Filter && !Builtins::has_filter(e->name))
    throw Error("unsupported construct: the filter '" + e->name + "'", e->line);
  if (!soft && e->kind == Expr::Kind::Test && !Builtins::has_test(e->name))
    throw Error("unsupported construct: the test '" + e->name + "'", e->line);
  for (const Expr* child : {e->a.get(), e->b.get(), e->c.get(), e->d.get()}) check_names(child, soft);
  for (const auto& a : e->args) check_names(a.value.get(), soft);
  for (const auto& kv : e->pairs) {
    check_names(kv.first.get(), soft);
    check_names(kv.second.get(), soft);
  }
  for (const auto& o : e->operands) check_names(o.get(), soft);
}

}  // namespace

std::shared_ptr<const Template> parse(const std::string& source) {
  auto t = std::make_shared<Template>();
  t->body = Parser(Lexer(source).run()).parse_template();
  check_names(t->body, false);
  return t;
}

}  // namespace trainrun::text::jinja
