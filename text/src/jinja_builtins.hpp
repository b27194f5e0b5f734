#pragma once
// Jinja2's builtin filters and tests, Python's methods of str/dict/list and its operators, as the
// chat-template renderer (jinja_render.cpp) needs them. Each follows the behaviour of jinja2 3.1's
// filters.py/tests.py and CPython, checked against them in tests/e2e/chat_template_reference.py.
// Defined in jinja_filters.cpp, jinja_tests.cpp, jinja_str_methods.cpp (on jinja_str.hpp) and
// jinja_builtins.cpp (the rest).
#include <string>
#include <vector>

#include "jinja_value.hpp"

namespace trainrun::text::jinja {

/// Throws the UndefinedError of `v` (its hint says which name or attribute is missing).
[[noreturn]] void undefined_error(const Value& v, int line);

struct Builtins {
  /// What builtins need from the renderer: calling template callables (macros, globals).
  struct Host {
    virtual ~Host() = default;
    virtual Value call(const Value& callee, CallArgs& args) = 0;
  };

  static Value filter(Host& host, const std::string& name, const Value& v, CallArgs& args);
  static bool test(Host& host, const std::string& name, const Value& v, CallArgs& args);
  static bool has_filter(const std::string& name);
  static bool has_test(const std::string& name);

  /// obj.name (jinja2: attribute first, then item).
  static Value getattr(const Value& obj, const std::string& name, int line);
  /// obj[key] (jinja2: item first, then attribute); a missing item is Undefined.
  static Value getitem(const Value& obj, const Value& key, int line);
  /// obj[start:stop:step] with Python's rules; None parts are omitted ones.
  static Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line);
  /// Calls the method `name` of a str/dict/list; false when `obj` has no such method.
  static bool call_method(Host& host, const Value& obj, const std::string& name, CallArgs& args, Value& result);
  /// The items a `for` loop visits (list items, str characters, dict keys; Undefined: none).
  static std::vector<Value> iterate(const Value& v, int line);
  /// Python's `item in container`.
  static bool contains(const Value& container, const Value& item, int line);
  /// Python's + - * / // % ** on defined values.
  static Value arithmetic(const std::string& op, const Value& a, const Value& b, int line);
};

}  // namespace trainrun::text::jinja
