#pragma once
// Lexer and parser of the Jinja2 subset that chat templates use, with the whitespace rules of
// transformers' environment (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False).
// The grammar and operator precedence follow jinja2's parser.py; every node carries its template
// line so that errors can name it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jinja_value.hpp"

namespace trainrun::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    Const, Name, GetAttr, GetItem, Slice, Call, Filter, Test, Neg, Pos, Not, Binary, And, Or,
    Compare, CondExpr, ListLit, TupleLit, DictLit
  };
  Kind kind;
  int line = 0;
  Value constant;                  // Const
  std::string name;                // Name, GetAttr attribute, Filter/Test name, Binary operator
  ExprPtr a, b, c;                 // operands: object/left/condition, right/index, else/step
  ExprPtr d;                       // Slice: stop (a: object, b: start, c: step)
  std::vector<Arg> args;           // Call/Filter/Test arguments; list/tuple items (unnamed)
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;  // DictLit
  std::vector<std::string> ops;    // Compare: operators ("eq", "lt", "in", "notin", ...)
  std::vector<ExprPtr> operands;   // Compare: right-hand sides
  bool negated = false;            // Test
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// Assignment target: a name, `ns.attr`, or a tuple of names.
struct Target {
  std::vector<std::string> names;  // one name, or several for tuple unpacking
  std::string attr;                // non-empty: `names[0].attr` (namespace attribute)
  bool tuple = false;
};

struct Stmt {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, FilterBlock, With, Break, Continue, Generation };
  Kind kind;
  int line = 0;
  std::string text;                      // Text; Macro name
  ExprPtr expr;                          // Output, Set value, For iterable
  ExprPtr cond;                          // For filter (`for x in y if cond`)
  std::vector<std::pair<ExprPtr, Body>> branches;  // If/elif: (condition, body)
  Body body, else_body;                  // For, SetBlock, Macro, FilterBlock, With, Generation; If else
  Target target;                         // For, Set, SetBlock
  std::vector<ExprPtr> filters;          // SetBlock/FilterBlock: Filter nodes applied to the body
                                         // (their operand `a` is empty)
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro parameters (default or null);
                                                        // With assignments
};

struct Template {
  Body body;
  /// The budget of each rendering (ChatTemplate's TemplateLimits, set once after parsing).
  uint64_t max_bytes = 0, max_operations = 0;
};

/// Parses `source`; throws Error naming the construct and line for anything outside the subset.
std::shared_ptr<Template> parse(const std::string& source);

}  // namespace trainrun::text::jinja
