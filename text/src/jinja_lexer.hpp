#pragma once
// The lexer of the chat-template engine: template source to tokens, with jinja2's whitespace
// control and transformers' environment settings applied (jinja_lexer.cpp says which). The parser
// (jinja_parser.hpp) reads the tokens.
#include <cstdint>
#include <string>
#include <vector>

namespace trainrun::text::jinja {

struct Token {
  enum Type { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };
  Type type;
  std::string value;
  int line;
  int64_t ival = 0;
  double fval = 0;
};

/// The tokens of `source`, ending with Eof; throws Error for an unterminated tag, string or raw.
std::vector<Token> lex(const std::string& source);

}  // namespace trainrun::text::jinja
