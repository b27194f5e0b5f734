#include "trainrun/core/log.hpp"

#include <iostream>

namespace trainrun::core {
void log_info(const std::string& msg) { std::cerr << "[trainrun] " << msg << std::endl; }
void log_warn(const std::string& msg) { std::cerr << "[trainrun] warning: " << msg << std::endl; }
}  // namespace trainrun::core
