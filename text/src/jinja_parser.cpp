// The expressions of the chat-template parser (jinja_parser.hpp), by jinja2's precedence, lowest
// first: conditional expression, or, and, not, comparisons (chained, with in/not in), + -, ~,
// * / // %, **, unary - +, then postfix subscripts, calls, `|filter` and `is test`.
#include "jinja_parser.hpp"

namespace trainrun::text::jinja {

bool Parser::skip_op(const char* op) {
  if (!is_op(op)) return false;
  ++p_;
  return true;
}

bool Parser::skip_name(const char* name) {
  if (!is_name(name)) return false;
  ++p_;
  return true;
}

std::string Parser::describe(const Token& t) {
  switch (t.type) {
    case Token::Data:
      return "template data";
    case Token::VarBegin:
      return "'{{'";
    case Token::VarEnd:
      return "end of print statement '}}'";
    case Token::BlockBegin:
      return "'{%'";
    case Token::BlockEnd:
      return "end of statement block '%}'";
    case Token::String:
      return "string literal";
    case Token::Int:
    case Token::Float:
      return "number " + t.value;
    case Token::Eof:
      return "end of template";
    default:
      return "'" + t.value + "'";
  }
}

void Parser::fail(const std::string& what) const { throw Error(what, cur().line); }

void Parser::expect_op(const char* op) {
  if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
}

std::string Parser::expect_name() {
  if (cur().type != Token::Name) fail("expected a name, got " + describe(cur()));
  return toks_[p_++].value;
}

void Parser::expect_block_end() {
  if (cur().type != Token::BlockEnd)
    fail("expected end of statement block '%}', got " + describe(cur()));
  ++p_;
}

// Items up to `close`, separated by commas, a trailing one allowed (as jinja2 takes them in list
// and dict literals, calls and macro signatures); `item` parses one item.
void Parser::parse_comma_list(const char* close, const std::function<void()>& item) {
  bool first = true;
  while (!is_op(close)) {
    if (!first) {
      expect_op(",");
      if (is_op(close)) break;
    }
    item();
    first = false;
  }
  expect_op(close);
}

ExprPtr Parser::make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

bool Parser::is_tuple_end(const std::vector<std::string>& extra_end) const {
  if (cur().type == Token::VarEnd || cur().type == Token::BlockEnd || is_op(")")) return true;
  for (const auto& n : extra_end)
    if (is_name(n.c_str())) return true;
  return false;
}

ExprPtr Parser::parse_tuple(bool simplified, bool with_condexpr, bool explicit_parens,
                            const std::vector<std::string>& extra_end) {
  const int line = cur().line;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
    if (is_op(","))
      is_tuple = true;
    else
      break;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) fail("expected an expression, got " + describe(cur()));
  }
  auto e = make(Expr::Kind::TupleLit, line);
  for (auto& item : items) e->args.push_back(Arg{"", std::move(item)});
  return e;
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr Parser::parse_condexpr() {
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

// `operand (keyword operand)*`, left-associative: the levels of `or` and `and`.
ExprPtr Parser::parse_logical(Expr::Kind kind, const char* keyword, ExprPtr (Parser::*operand)()) {
  ExprPtr left = (this->*operand)();
  while (is_name(keyword)) {
    auto e = make(kind, cur().line);
    ++p_;
    e->a = std::move(left);
    e->b = (this->*operand)();
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_or() { return parse_logical(Expr::Kind::Or, "or", &Parser::parse_and); }
ExprPtr Parser::parse_and() { return parse_logical(Expr::Kind::And, "and", &Parser::parse_not); }

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    auto e = make(Expr::Kind::Not, cur().line);
    ++p_;
    e->a = parse_not();
    return e;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
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
      if (skip_name("in"))
        e->ops.push_back("in");
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

// `operand (op operand)*` for the operators `ops`, left-associative: the arithmetic levels.
ExprPtr Parser::parse_binary(std::initializer_list<const char*> ops, ExprPtr (Parser::*operand)()) {
  ExprPtr left = (this->*operand)();
  while (std::any_of(ops.begin(), ops.end(), [this](const char* op) { return is_op(op); })) {
    auto e = make(Expr::Kind::Binary, cur().line);
    e->name = toks_[p_++].value;
    e->a = std::move(left);
    e->b = (this->*operand)();
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_math1() { return parse_binary({"+", "-"}, &Parser::parse_concat); }
ExprPtr Parser::parse_concat() { return parse_binary({"~"}, &Parser::parse_math2); }
ExprPtr Parser::parse_math2() { return parse_binary({"*", "/", "//", "%"}, &Parser::parse_pow); }
ExprPtr Parser::parse_pow() { return parse_binary({"**"}, &Parser::parse_unary_filtered); }

ExprPtr Parser::parse_unary(bool with_filter) {
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

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  auto e = make(Expr::Kind::Const, t.line);
  switch (t.type) {
    case Token::Name:
      if (t.value == "true" || t.value == "True")
        e->constant = Value::boolean(true);
      else if (t.value == "false" || t.value == "False")
        e->constant = Value::boolean(false);
      else if (t.value == "none" || t.value == "None")
        e->constant = Value::none();
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
    case Token::Int:
      e->constant = Value::integer(t.ival);
      ++p_;
      return e;
    case Token::Float:
      e->constant = Value::number(t.fval);
      ++p_;
      return e;
    default:
      break;
  }
  if (skip_op("(")) {
    ExprPtr inner = parse_tuple(false, true, true, {});
    expect_op(")");
    return inner;
  }
  if (is_op("[")) {
    e->kind = Expr::Kind::ListLit;
    ++p_;
    parse_comma_list("]", [&] { e->args.push_back(Arg{"", parse_expression(true)}); });
    return e;
  }
  if (is_op("{")) {
    e->kind = Expr::Kind::DictLit;
    ++p_;
    parse_comma_list("}", [&] {
      ExprPtr key = parse_expression(true);
      expect_op(":");
      e->pairs.emplace_back(std::move(key), parse_expression(true));
    });
    return e;
  }
  fail("unexpected " + describe(t));
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".") || is_op("["))
      node = parse_subscript(std::move(node));
    else if (is_op("("))
      node = parse_call(std::move(node));
    else
      return node;
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
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

ExprPtr Parser::parse_subscript(ExprPtr node) {
  const int line = cur().line;
  if (skip_op(".")) {
    if (cur().type == Token::Name) {
      auto e = make(Expr::Kind::GetAttr, line);
      e->a = std::move(node);
      e->name = toks_[p_++].value;
      return e;
    }
    if (cur().type != Token::Int)
      fail("expected a name or number after '.', got " + describe(cur()));
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
ExprPtr Parser::parse_subscribed() {
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

void Parser::parse_call_args(std::vector<Arg>& args) {
  expect_op("(");
  parse_comma_list(")", [&] {
    if (is_op("*") || is_op("**")) fail("unsupported construct: *args/**kwargs in a call");
    if (cur().type == Token::Name && look().type == Token::Op && look().value == "=") {
      std::string key = toks_[p_].value;
      p_ += 2;
      args.push_back(Arg{key, parse_expression(true)});
    } else {
      if (!args.empty() && !args.back().name.empty())
        fail("positional argument follows keyword argument");
      args.push_back(Arg{"", parse_expression(true)});
    }
  });
}

ExprPtr Parser::parse_call(ExprPtr node) {
  auto e = make(Expr::Kind::Call, cur().line);
  e->a = std::move(node);
  parse_call_args(e->args);
  return e;
}

// A filter or test name. jinja2 takes dotted ones (`x|a.b`); none of ours is, so such a name is
// then refused as unknown.
std::string Parser::parse_dotted_name() {
  std::string name = expect_name();
  while (is_op(".")) {
    ++p_;
    name += "." + expect_name();
  }
  return name;
}

ExprPtr Parser::parse_filter_tail(ExprPtr node) {
  auto e = make(Expr::Kind::Filter, cur().line);
  e->name = parse_dotted_name();
  e->a = std::move(node);
  if (is_op("(")) parse_call_args(e->args);
  return e;
}

ExprPtr Parser::parse_test(ExprPtr node) {
  auto e = make(Expr::Kind::Test, cur().line);
  ++p_;  // 'is'
  e->negated = skip_name("not");
  e->name = parse_dotted_name();
  e->a = std::move(node);
  const Token& t = cur();
  if (is_op("(")) {
    parse_call_args(e->args);
  } else if ((t.type == Token::Name || t.type == Token::String || t.type == Token::Int ||
              t.type == Token::Float || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail("you cannot chain multiple tests with 'is'");
    e->args.push_back(Arg{"", parse_postfix(parse_primary())});
  }
  return e;
}

}  // namespace trainrun::text::jinja
