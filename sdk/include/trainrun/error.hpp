#pragma once
// Error types and the check macro family used by the core and by plugins.
#include <sstream>
#include <stdexcept>
#include <string>

namespace trainrun::v1 {

/// Base of every error trainrun raises. what() is a complete, user-facing sentence;
/// where() is "file:line" of the check that failed (empty when raised by hand).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg, std::string where = {})
      : std::runtime_error(msg), where_(std::move(where)) {}
  const std::string& where() const noexcept { return where_; }

 private:
  std::string where_;
};

/// Invalid user input: a job file key, an option value, a command-line flag.
/// The message names the file, line, column and key at fault. The CLI exits with code 2.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A plugin could not be loaded, failed an ABI check, or raised an error from inside one of its
/// components; the message names the plugin file or plugin name. The CLI exits with code 2.
class PluginError : public Error {
 public:
  using Error::Error;
};

/// An operation the component does not implement (e.g. "strategy 'single' does not support
/// reduce_scatter"). Raised by the defaults of optional interface methods.
class NotSupportedError : public Error {
 public:
  using Error::Error;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... R>
void append(std::ostringstream& os, const T& v, const R&... rest) {
  os << v;
  append(os, rest...);
}
template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  append(os, a...);
  return os.str();
}
}  // namespace detail

/// A parser's error message made fit to print: nlohmann::json quotes what it read last
/// ("...; last read: '<excerpt>'"), which for a damaged file can be kilobytes of base64 or
/// binary. The excerpt is cut to its last `max_chars` bytes (marked "...") and every byte that
/// is not printable ASCII is shown as '?'. Messages without an excerpt are returned unchanged.
inline std::string parse_error_text(const std::string& what, size_t max_chars = 40) {
  const std::string marker = "last read: '";
  const size_t at = what.find(marker);
  if (at == std::string::npos) return what;
  const size_t begin = at + marker.size();
  size_t end = what.size();
  if (end > begin && what[end - 1] == '\'') --end;
  std::string excerpt = what.substr(begin, end - begin);
  const bool cut = excerpt.size() > max_chars;
  if (cut) excerpt = excerpt.substr(excerpt.size() - max_chars);
  for (char& c : excerpt)
    if (c < 0x20 || c > 0x7e) c = '?';
  return what.substr(0, begin) + (cut ? "..." : "") + excerpt + "'";
}

}  // namespace trainrun::v1

/// TR_CHECK(cond, msg...): throws trainrun::v1::Error(msg) carrying file:line when cond is false.
/// The message parts are streamed together, as TORCH_CHECK does.
#define TR_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw ::trainrun::v1::Error(::trainrun::v1::detail::cat(__VA_ARGS__),                  \
                                  ::trainrun::v1::detail::cat(__FILE__, ":", __LINE__));     \
  } while (0)

/// TR_CHECK_TYPED(ErrorType, cond, msg...): as TR_CHECK with a specific error class.
#define TR_CHECK_TYPED(Type, cond, ...)                                                      \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw Type(::trainrun::v1::detail::cat(__VA_ARGS__),                                   \
                 ::trainrun::v1::detail::cat(__FILE__, ":", __LINE__));                      \
  } while (0)

/// TR_FAIL(msg...): unconditional TR_CHECK failure.
#define TR_FAIL(...) TR_CHECK(false, __VA_ARGS__)
