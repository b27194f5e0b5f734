#pragma once
// The value model of the Jinja engine behind chat templates (chat_template.hpp). Values behave as
// the Python objects Jinja2 would hold: str() and repr() print as Python does, `==` and ordering
// follow Python's rules, strings are indexed by code point. Lists, dicts and namespaces are shared
// by reference as in Python; only namespaces are ever mutated (transformers renders in an
// ImmutableSandboxedEnvironment, so lists and dicts cannot be).
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace trainrun::text::jinja {

/// A template error: message plus the 1-based template line (0 when unknown).
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, int line) : std::runtime_error(message), line_(line) {}
  int line() const { return line_; }

 private:
  int line_;
};

/// Thrown by the template's own raise_exception(msg); what() is msg unchanged.
class Raised : public Error {
 public:
  Raised(const std::string& message, int line) : Error(message, line) {}
};

struct Value;
struct CallArgs;
using List = std::vector<Value>;

/// Python dict with string keys (JSON objects, dict literals, namespaces), insertion-ordered.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

/// Built-in function, filter-like global, macro or bound method.
struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> fn;
};

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Namespace, Object, Callable };
  /// What a List really is in Python when not a list: jinja2's map/select/... filters return
  /// generators (always true, no len(), not subscriptable, not JSON), `|reverse` a reverse
  /// iterator, dict.keys()/values()/items() views (len() but no indexing, not JSON).
  enum class View : uint8_t { None, Generator, ReverseIterator, DictKeys, DictValues, DictItems };
  Kind kind = Kind::Undefined;
  View view = View::None;
  bool markup = false;  // String: a markupsafe.Markup (|safe, |escape): `+` escapes plain operands
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; for Undefined: why it is undefined (for error messages)
  std::shared_ptr<List> list;        // List, Tuple
  std::shared_ptr<Dict> dict;        // Dict, Namespace, Object (loop)
  std::shared_ptr<Callable> fn;      // Callable

  static Value undefined(std::string hint = "") { Value v; v.s = std::move(hint); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::String; v.s = std::move(x); return v; }
  static Value make_list(List items = {}, bool tuple = false);
  static Value make_view(List items, View view);
  static Value make_dict(Dict d = {}, Kind kind = Kind::Dict);
  static Value callable(std::string name, std::function<Value(CallArgs&)> fn);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_sequence() const { return kind == Kind::List || kind == Kind::Tuple; }
  /// A real list or tuple (len() and indexing), not a generator or view.
  bool is_plain_sequence() const { return is_sequence() && view == View::None; }
  bool is_iterator() const { return view == View::Generator || view == View::ReverseIterator; }
  bool is_mapping() const { return kind == Kind::Dict; }
  bool truthy() const;
  double as_double() const;  // Int, Float, Bool
};

/// Positional and keyword arguments of a call, with the template line for errors.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  int line = 0;
  /// Argument `name` at position `index`, or `fallback` when absent (Python's binding rules).
  Value get(size_t index, const std::string& name, Value fallback = Value::undefined()) const;
  bool has(size_t index, const std::string& name) const;
  /// Throws unless at most `n` positional and only `names` as keyword arguments were given.
  void expect(const std::string& fn, size_t n, std::initializer_list<const char*> names) const;
};

/// Dict keys are strings; other hashable keys (int, float, bool, None, as in `{0: 'a'}`) are
/// stored encoded after a NUL byte, with Python's rule that 1, 1.0 and True are the same key.
std::string dict_key(const Value& key, int line);
/// The Python value of a stored dict key.
Value key_value(const std::string& key);

/// Python's type name ("str", "int", "list", "dict", "NoneType", ...), for error messages.
std::string type_name(const Value& v);
/// str(v) as Python prints it; Undefined prints as "".
std::string to_str(const Value& v);
/// repr(v) as Python prints it.
std::string repr(const Value& v);
/// Python float repr: shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf", "nan".
std::string float_repr(double x);
/// Python's `==`.
bool equal(const Value& a, const Value& b);
/// Python's `<` for numbers, strings and sequences; throws Error (TypeError) otherwise.
bool less(const Value& a, const Value& b, int line);

/// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson calls it.
struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;  // -1: None
  std::string indent_str;  // used when indent is given as a string
  bool indent_is_string = false;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool separators_given = false;
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& options, int line);

// ---- Unicode helpers (strings are UTF-8; Python indexes them by code point) ----
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
std::string utf8_encode(char32_t c);
/// Python's str.isspace() for one code point.
bool is_py_space(char32_t c);
/// Full Unicode case mappings as Python's str.upper()/lower() (ICU, root locale).
std::string to_upper(const std::string& s);
std::string to_lower(const std::string& s);
std::string to_title(const std::string& s);       // str.title()
std::string to_capitalize(const std::string& s);  // str.capitalize()

}  // namespace trainrun::text::jinja
