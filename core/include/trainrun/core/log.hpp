#pragma once
// Minimal process logging: warnings and information to stderr, prefixed so they can be told
// apart from a worker's own output.
#include <string>

namespace trainrun::core {
void log_info(const std::string& msg);
void log_warn(const std::string& msg);
}  // namespace trainrun::core
