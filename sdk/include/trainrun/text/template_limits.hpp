#pragma once
// The chat-template budget (TemplateLimits, chat_template.hpp) as job options and CLI flags: one
// definition of the names, ranges and help shared by the data plugins (chat, preference,
// unpaired: the [data] table's template_max_bytes and template_max_operations) and trainrun's
// commands that render a model directory's template (--template-max-bytes,
// --template-max-operations).
#include <cstdint>
#include <stdexcept>
#include <string>

#include "trainrun/options.hpp"
#include "trainrun/text/chat_template.hpp"

namespace trainrun::text {

/// Declares template_max_bytes (a size) and template_max_operations (an integer) with
/// TemplateLimits' defaults.
inline void declare_template_limits(v1::OptionSchema& s) {
  const TemplateLimits d;
  s.size("template_max_bytes", static_cast<int64_t>(d.max_bytes),
         "budget of one chat-template rendering: bytes of the strings, lists and dicts it builds "
         "and of its output, in all (a model directory's template is untrusted input)",
         1, 1e15);
  s.integer("template_max_operations", static_cast<int64_t>(d.max_operations),
            "budget of one chat-template rendering: loop iterations and calls, a call weighted by "
            "the items or KiB it scans",
            1, 1e15);
}

/// The limits a component's options give (declared by declare_template_limits).
inline TemplateLimits template_limits(const v1::Options& o) {
  TemplateLimits l;
  l.max_bytes = static_cast<std::uint64_t>(o.get_bytes("template_max_bytes"));
  l.max_operations = static_cast<std::uint64_t>(o.get_int("template_max_operations"));
  return l;
}

/// The help lines of the two CLI flags, for a command's usage text.
inline std::string template_limit_flags_help() {
  const TemplateLimits d;
  return "  --template-max-bytes N       budget of one chat-template rendering, bytes built "
         "(default " +
         std::to_string(d.max_bytes) +
         ")\n  --template-max-operations N  budget of one chat-template rendering, " +
         "operations (default " + std::to_string(d.max_operations) + ")\n";
}

/// Sets `limits` from the flag `name` ("--template-max-bytes" or "--template-max-operations",
/// with or without the leading dashes) and its value, a positive integer. Returns false for
/// another name; throws std::invalid_argument naming the flag for a bad value.
inline bool set_template_limit(const std::string& name, const std::string& value,
                               TemplateLimits& limits) {
  const std::string key = name.rfind("--", 0) == 0 ? name.substr(2) : name;
  std::uint64_t* target = key == "template-max-bytes"        ? &limits.max_bytes
                          : key == "template-max-operations" ? &limits.max_operations
                                                             : nullptr;
  if (!target) return false;
  std::size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || v == 0 || value[0] == '-')
    throw std::invalid_argument("--" + key + " takes a positive integer, got '" + value + "'");
  *target = v;
  return true;
}

}  // namespace trainrun::text
