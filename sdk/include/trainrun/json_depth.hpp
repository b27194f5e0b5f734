#pragma once
// A bound on how deeply JSON that trainrun reads from files may nest. nlohmann::json parses any
// depth, but copying, comparing and dump()ing a value recurse once per level, so a file of
// 30,000 '[' (60 KB) overflows the stack in code that merely copies what was parsed (found by
// the tokenizer fuzz target, tests/fuzz/). No real tokenizer.json, config.json, safetensors
// header, meta.json or chat record nests more than a dozen levels. No LibTorch header.
#include <cstddef>
#include <string_view>

namespace trainrun::v1 {

/// Deepest nesting of arrays and objects accepted in JSON read from files.
constexpr int kMaxJsonDepth = 256;

/// True when `text` (JSON, well-formed or not) opens more than `max_depth` arrays/objects
/// without closing them, brackets inside strings not counted. Linear, no allocation; callers
/// check before parsing and refuse the file with their own error type, naming it.
inline bool json_too_deep(std::string_view text, int max_depth = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

}  // namespace trainrun::v1
