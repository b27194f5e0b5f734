#pragma once
// Option schemas (declared by each component) and the validated option values the host hands
// to a component's factory. Plugins never see toml++ types.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "trainrun/error.hpp"

namespace trainrun::v1 {

/// The type of one option as written in the job file.
/// - Size: an integer number of bytes or a string with a unit ("25MiB", "2GB", "512KiB");
///   delivered as int64 bytes.
/// - Duration: a number of seconds or a string with a unit ("90s", "10min", "1h", "250ms");
///   delivered as double seconds.
/// - Choice: a string that must be one of OptionSpec::choices.
/// - IntOrAuto (ABI 1.2): an integer or the string "auto"; delivered as int64, with kAuto (-1)
///   for "auto". Values are appended, never renumbered.
enum class OptionType { Bool, Int, Float, String, Choice, Size, Duration, IntList, StringList, IntOrAuto };

/// The int64 an IntOrAuto option holds when the job file says "auto".
constexpr int64_t kAuto = -1;

/// Human-readable name of an option type ("integer", "size", ...), used in error messages.
inline const char* type_name(OptionType t) {
  switch (t) {
    case OptionType::Bool: return "boolean";
    case OptionType::Int: return "integer";
    case OptionType::Float: return "float";
    case OptionType::String: return "string";
    case OptionType::Choice: return "string (one of the choices)";
    case OptionType::Size: return "size (bytes, or a string such as \"25MiB\")";
    case OptionType::Duration: return "duration (seconds, or a string such as \"90s\")";
    case OptionType::IntList: return "array of integers";
    case OptionType::StringList: return "array of strings";
    case OptionType::IntOrAuto: return "integer or \"auto\"";
  }
  return "?";
}

/// One option value after validation. Int, Size -> int64_t (bytes for Size); Float, Duration ->
/// double (seconds for Duration); String, Choice -> std::string.
using OptionValue = std::variant<std::monostate, bool, int64_t, double, std::string,
                                 std::vector<int64_t>, std::vector<std::string>>;

/// Declaration of one option: name, type, default, inclusive range, allowed choices, help.
/// An option without a default (std::monostate) and with required = true must be given.
struct OptionSpec {
  std::string name;
  OptionType type = OptionType::String;
  OptionValue default_value;
  bool required = false;
  std::optional<double> min;  ///< inclusive lower bound for Int/Float/Size/Duration
  std::optional<double> max;  ///< inclusive upper bound for Int/Float/Size/Duration
  std::vector<std::string> choices;  ///< allowed values for Choice
  std::string help;
};

/// The list of options one component accepts. Built by the component's declare_options().
class OptionSchema {
 public:
  /// Adds a fully specified option. Throws Error if the name is already declared.
  OptionSchema& add(OptionSpec spec) {
    TR_CHECK(find(spec.name) == nullptr, "option '", spec.name, "' declared twice");
    specs_.push_back(std::move(spec));
    return *this;
  }
  OptionSchema& boolean(const std::string& name, bool def, const std::string& help) {
    return add({name, OptionType::Bool, def, false, {}, {}, {}, help});
  }
  OptionSchema& integer(const std::string& name, int64_t def, const std::string& help,
                        std::optional<double> min = {}, std::optional<double> max = {}) {
    return add({name, OptionType::Int, def, false, min, max, {}, help});
  }
  /// An integer or "auto" (ABI 1.2): `def` is kAuto or a number in [min, max]; the component
  /// reads kAuto (-1) for "auto" through Options::get_int. min must be >= 0 so -1 stays free.
  OptionSchema& integer_or_auto(const std::string& name, int64_t def, const std::string& help,
                                std::optional<double> min = 0.0,
                                std::optional<double> max = std::nullopt) {
    return add({name, OptionType::IntOrAuto, def, false, min, max, {}, help});
  }
  OptionSchema& real(const std::string& name, double def, const std::string& help,
                     std::optional<double> min = {}, std::optional<double> max = {}) {
    return add({name, OptionType::Float, def, false, min, max, {}, help});
  }
  OptionSchema& string(const std::string& name, const std::string& def, const std::string& help) {
    return add({name, OptionType::String, def, false, {}, {}, {}, help});
  }
  /// A required string option without default (e.g. a file path).
  OptionSchema& required_string(const std::string& name, const std::string& help) {
    return add({name, OptionType::String, std::monostate{}, true, {}, {}, {}, help});
  }
  OptionSchema& choice(const std::string& name, const std::string& def,
                       std::vector<std::string> choices, const std::string& help) {
    return add({name, OptionType::Choice, def, false, {}, {}, std::move(choices), help});
  }
  /// def in bytes.
  OptionSchema& size(const std::string& name, int64_t def, const std::string& help,
                     std::optional<double> min = {}, std::optional<double> max = {}) {
    return add({name, OptionType::Size, def, false, min, max, {}, help});
  }
  /// def in seconds.
  OptionSchema& duration(const std::string& name, double def, const std::string& help,
                         std::optional<double> min = {}, std::optional<double> max = {}) {
    return add({name, OptionType::Duration, def, false, min, max, {}, help});
  }
  OptionSchema& int_list(const std::string& name, std::vector<int64_t> def,
                         const std::string& help) {
    return add({name, OptionType::IntList, std::move(def), false, {}, {}, {}, help});
  }
  OptionSchema& string_list(const std::string& name, std::vector<std::string> def,
                            const std::string& help) {
    return add({name, OptionType::StringList, std::move(def), false, {}, {}, {}, help});
  }

  const std::vector<OptionSpec>& specs() const { return specs_; }
  const OptionSpec* find(const std::string& name) const {
    for (const auto& s : specs_)
      if (s.name == name) return &s;
    return nullptr;
  }

 private:
  std::vector<OptionSpec> specs_;
};

/// Validated option values of one component (every declared option present, defaults filled
/// in, types and ranges checked by the host). `context` names the job-file table, e.g.
/// "[model] (job.toml)", and is used in error messages.
class Options {
 public:
  Options() = default;
  Options(std::map<std::string, OptionValue> values, std::string context)
      : values_(std::move(values)), context_(std::move(context)) {}

  bool has(const std::string& key) const {
    auto it = values_.find(key);
    return it != values_.end() && !std::holds_alternative<std::monostate>(it->second);
  }
  bool get_bool(const std::string& key) const { return get<bool>(key); }
  int64_t get_int(const std::string& key) const { return get<int64_t>(key); }
  double get_double(const std::string& key) const { return get<double>(key); }
  const std::string& get_string(const std::string& key) const { return get<std::string>(key); }
  /// Size options, in bytes.
  int64_t get_bytes(const std::string& key) const { return get<int64_t>(key); }
  /// Duration options, in seconds.
  double get_seconds(const std::string& key) const { return get<double>(key); }
  const std::vector<int64_t>& get_int_list(const std::string& key) const {
    return get<std::vector<int64_t>>(key);
  }
  const std::vector<std::string>& get_string_list(const std::string& key) const {
    return get<std::vector<std::string>>(key);
  }
  const std::map<std::string, OptionValue>& values() const { return values_; }
  const std::string& context() const { return context_; }

 private:
  template <class T>
  const T& get(const std::string& key) const {
    auto it = values_.find(key);
    if (it == values_.end())
      throw Error(detail::cat(context_, ": option '", key, "' was not declared by the component"));
    const T* v = std::get_if<T>(&it->second);
    if (!v)
      throw Error(detail::cat(context_, ": option '", key, "' has no value of the requested type"));
    return *v;
  }
  std::map<std::string, OptionValue> values_;
  std::string context_;
};

}  // namespace trainrun::v1
