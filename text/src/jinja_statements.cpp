// The statements of the chat-template parser (jinja_parser.hpp): template data, `{{ }}` output and
// the tags chat templates use: if/elif/else, for (with else and an `if` filter), set (a value, a
// namespace attribute or a block), macro, filter, with, break/continue, and transformers'
// {% generation %}.
#include "jinja_parser.hpp"

namespace trainrun::text::jinja {

Body Parser::parse_template() {
  std::string end;
  return parse_body({}, end);
}

// Statements until one of `ends` (the end tag is consumed; its name is returned in `which`).
Body Parser::parse_body(const std::vector<std::string>& ends, std::string& which) {
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
      if (cur().type != Token::VarEnd)
        fail("expected end of print statement '}}', got " + describe(cur()));
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

// The rest of a block tag, from its opening `%}` to its `{% end... %}`, both consumed.
Body Parser::parse_block(const char* end) {
  expect_block_end();
  std::string which;
  Body body = parse_body({end}, which);
  expect_block_end();
  return body;
}

StmtPtr Parser::parse_statement() {
  const int line = cur().line;
  const std::string tag = cur().value;
  ++p_;
  auto s = std::make_unique<Stmt>();
  s->line = line;
  if (tag == "if") {
    parse_if(*s);
  } else if (tag == "for") {
    parse_for(*s);
  } else if (tag == "set") {
    parse_set(*s);
  } else if (tag == "macro") {
    parse_macro(*s);
  } else if (tag == "filter") {
    s->kind = Stmt::Kind::FilterBlock;
    parse_filter_chain(s->filters, true);
    s->body = parse_block("endfilter");
  } else if (tag == "with") {
    parse_with(*s);
  } else if (tag == "break" || tag == "continue") {
    s->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
    expect_block_end();
  } else if (tag == "generation") {
    // transformers' AssistantTracker extension: marks assistant text; renders its body as is.
    s->kind = Stmt::Kind::Generation;
    s->body = parse_block("endgeneration");
  } else {
    throw Error("unsupported construct: the tag {% " + tag + " %}", line);
  }
  return s;
}

void Parser::parse_if(Stmt& s) {
  s.kind = Stmt::Kind::If;
  std::string which;
  ExprPtr cond = parse_tuple(false, false, false, {});
  expect_block_end();
  while (true) {
    Body body = parse_body({"elif", "else", "endif"}, which);
    s.branches.emplace_back(std::move(cond), std::move(body));
    if (which == "elif") {
      cond = parse_tuple(false, false, false, {});
      expect_block_end();
      continue;
    }
    expect_block_end();
    if (which == "else") {
      s.else_body = parse_body({"endif"}, which);
      expect_block_end();
    }
    break;
  }
}

void Parser::parse_for(Stmt& s) {
  s.kind = Stmt::Kind::For;
  std::string which;
  s.target = parse_target(false);
  if (!skip_name("in")) fail("expected 'in' in the for loop, got " + describe(cur()));
  s.expr = parse_tuple(false, false, false, {"recursive"});
  if (skip_name("if")) s.cond = parse_expression(true);
  if (is_name("recursive")) fail("unsupported construct: recursive for loops");
  expect_block_end();
  s.body = parse_body({"endfor", "else"}, which);
  expect_block_end();
  if (which == "else") {
    s.else_body = parse_body({"endfor"}, which);
    expect_block_end();
  }
}

void Parser::parse_set(Stmt& s) {
  s.target = parse_target(true);
  if (skip_op("=")) {
    s.kind = Stmt::Kind::Set;
    s.expr = parse_tuple(false, true, false, {});
    expect_block_end();
    return;
  }
  s.kind = Stmt::Kind::SetBlock;
  if (s.target.tuple || !s.target.attr.empty()) fail("a block {% set %} assigns to a single name");
  parse_filter_chain(s.filters);
  s.body = parse_block("endset");
}

void Parser::parse_macro(Stmt& s) {
  s.kind = Stmt::Kind::Macro;
  s.text = expect_name();
  expect_op("(");
  parse_comma_list(")", [&] {
    if (is_op("*") || is_op("**"))
      fail("unsupported construct: *args/**kwargs in a macro signature");
    std::string param = expect_name();
    ExprPtr def;
    if (skip_op("="))
      def = parse_expression(true);
    else if (!s.params.empty() && s.params.back().second)
      fail("non-default argument follows default argument in macro '" + s.text + "'");
    s.params.emplace_back(std::move(param), std::move(def));
  });
  expect_block_end();
  std::string which;
  s.body = parse_body({"endmacro"}, which);
  if (cur().type == Token::Name) ++p_;  // {% endmacro name %}
  expect_block_end();
}

void Parser::parse_with(Stmt& s) {
  s.kind = Stmt::Kind::With;
  while (cur().type != Token::BlockEnd) {
    if (!s.params.empty()) expect_op(",");
    std::string name = expect_name();
    expect_op("=");
    s.params.emplace_back(std::move(name), parse_expression(true));
  }
  s.body = parse_block("endwith");
}

// `|f(args)|g` chains of {% filter %} and {% set x | f %}.
void Parser::parse_filter_chain(std::vector<ExprPtr>& out, bool first_without_bar) {
  bool first = first_without_bar;
  while (first || is_op("|")) {
    if (!first) ++p_;
    first = false;
    out.push_back(parse_filter_tail(nullptr));
  }
}

Target Parser::parse_target(bool with_namespace) {
  Target t;
  if (with_namespace && cur().type == Token::Name && look().type == Token::Op &&
      look().value == ".") {
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

}  // namespace trainrun::text::jinja
