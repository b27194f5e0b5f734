#pragma once
// What comm-common's sources share and do not export: the store's values as text, and the
// status record's fields (rendezvous.cpp, monitor.cpp, comm_common.cpp).
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace trainrun::comm::internal {

using Clock = std::chrono::steady_clock;

inline std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string string_of(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

inline std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// Fields of a status record are separated by the ASCII unit separator: op texts contain spaces,
// commas and parentheses, never this.
constexpr char kSep = '\x1f';

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep)
      out.push_back(cur), cur.clear();
    else
      cur.push_back(c);
  }
  out.push_back(cur);
  return out;
}

inline int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace trainrun::comm::internal
