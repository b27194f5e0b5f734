#pragma once
// One line of a JSONL input (generate's --prompts-file, score's --input, tokenize's .jsonl
// files), read the same way by each command: blank lines are skipped, a line that is not JSON is
// an error naming the file and line.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "trainrun/error.hpp"

namespace trainrun::app {

/// Parses line `line_no` (1-based) of the JSONL file `path` into `out` (an nlohmann::json or
/// ordered_json). Returns false, leaving `out` as it was, for a blank line (only spaces, tabs and
/// a CR). Throws ConfigError "PATH:LINE_NO: not valid JSON: WHAT" when the line does not parse.
template <class Json>
bool parse_jsonl_line(const std::string& line, const std::string& path, int64_t line_no,
                      Json& out) {
  if (line.find_first_not_of(" \t\r") == std::string::npos) return false;
  try {
    out = Json::parse(line);
  } catch (const typename Json::exception& e) {
    throw v1::ConfigError(path + ":" + std::to_string(line_no) + ": not valid JSON: " + e.what());
  }
  return true;
}

}  // namespace trainrun::app
