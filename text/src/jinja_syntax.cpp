// The chat-template compiler: lexer (jinja_lexer.cpp), parser (jinja_parser.cpp,
// jinja_statements.cpp), then a check that every filter and test the template names exists.
#include "jinja_syntax.hpp"

#include "jinja_builtins.hpp"
#include "jinja_parser.hpp"

namespace trainrun::text::jinja {
namespace {

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

std::shared_ptr<Template> parse(const std::string& source) {
  auto t = std::make_shared<Template>();
  t->body = Parser(lex(source)).parse_template();
  check_names(t->body, false);
  return t;
}

}  // namespace trainrun::text::jinja
