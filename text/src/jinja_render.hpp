#pragma once
// Renders a parsed chat template (jinja_syntax.hpp) the way transformers' ImmutableSandboxedEnvironment
// does: Jinja2's scoping (a `for` body is a fresh scope per iteration, `if` is not a scope, macros
// see the template's top level), Python semantics for operators, the builtin filters and tests
// chat templates use, and transformers' globals (raise_exception, strftime_now, namespace, dict).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "jinja_syntax.hpp"

namespace trainrun::text::jinja {

struct RenderResult {
  std::string text;
  /// Byte ranges [begin, end) of `text` rendered inside {% generation %} blocks.
  std::vector<std::pair<size_t, size_t>> generation_spans;
  /// What the rendering cost against Limits (jinja_budget.hpp).
  uint64_t bytes_built = 0, operations = 0;
};

/// The budget of one rendering (ChatTemplate's TemplateLimits).
struct Limits {
  uint64_t max_bytes;
  uint64_t max_operations;
};

/// Renders `t` with `variables` as the template's context. Throws Error (or Raised) with the
/// line, LimitError when the rendering exceeds `limits`.
RenderResult render(const Template& t, const Dict& variables, const Limits& limits);

}  // namespace trainrun::text::jinja
