#pragma once
// The recursive-descent parser of the chat-template engine: tokens (jinja_lexer.hpp) to the syntax
// tree of jinja_syntax.hpp. One class, defined in two files: statements (jinja_statements.cpp)
// and expressions (jinja_parser.cpp), whose grammar and precedence follow jinja2 3.1's parser.py.
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "jinja_lexer.hpp"
#include "jinja_syntax.hpp"

namespace trainrun::text::jinja {

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : toks_(std::move(toks)) {}

  Body parse_template();

 private:
  // ---- the token cursor and its helpers (jinja_parser.cpp) ----
  const Token& cur() const { return toks_[p_]; }
  const Token& look() const { return toks_[std::min(p_ + 1, toks_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Token::Op && cur().value == op; }
  bool is_name(const char* name) const { return cur().type == Token::Name && cur().value == name; }
  bool skip_op(const char* op);
  bool skip_name(const char* name);
  static std::string describe(const Token& t);
  [[noreturn]] void fail(const std::string& what) const;
  void expect_op(const char* op);
  std::string expect_name();
  void expect_block_end();
  void parse_comma_list(const char* close, const std::function<void()>& item);
  static ExprPtr make(Expr::Kind kind, int line);

  // ---- statements (jinja_statements.cpp) ----
  Body parse_body(const std::vector<std::string>& ends, std::string& which);
  Body parse_block(const char* end);
  StmtPtr parse_statement();
  void parse_if(Stmt& s);
  void parse_for(Stmt& s);
  void parse_set(Stmt& s);
  void parse_macro(Stmt& s);
  void parse_with(Stmt& s);
  void parse_filter_chain(std::vector<ExprPtr>& out, bool first_without_bar = false);
  Target parse_target(bool with_namespace);

  // ---- expressions, lowest precedence first (jinja_parser.cpp) ----
  bool is_tuple_end(const std::vector<std::string>& extra_end) const;
  ExprPtr parse_tuple(bool simplified, bool with_condexpr, bool explicit_parens,
                      const std::vector<std::string>& extra_end);
  ExprPtr parse_expression(bool with_condexpr);
  ExprPtr parse_condexpr();
  ExprPtr parse_logical(Expr::Kind kind, const char* keyword, ExprPtr (Parser::*operand)());
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_binary(std::initializer_list<const char*> ops, ExprPtr (Parser::*operand)());
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary_filtered() { return parse_unary(true); }  // `**`'s operand
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  void parse_call_args(std::vector<Arg>& args);
  ExprPtr parse_call(ExprPtr node);
  std::string parse_dotted_name();
  ExprPtr parse_filter_tail(ExprPtr node);
  ExprPtr parse_test(ExprPtr node);

  std::vector<Token> toks_;
  size_t p_ = 0;
};

}  // namespace trainrun::text::jinja
