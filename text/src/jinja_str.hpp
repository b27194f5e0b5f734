#pragma once
// Python's str operations on the engine's UTF-8 strings (indexed by code point, as Python does),
// and the argument checks of builtin functions, with CPython's error messages. Shared by the
// builtin filters (jinja_filters.cpp), tests (jinja_tests.cpp), str methods (jinja_str_methods.cpp)
// and operators (jinja_builtins.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include "jinja_value.hpp"

namespace trainrun::text::jinja {

/// The str argument `what` of `fn`; anything else is CPython's TypeError.
std::string str_arg(const Value& v, const char* fn, const char* what, int line);
/// An int argument of `fn` (a bool is one, as in Python); anything else is CPython's TypeError.
int64_t int_arg(const Value& v, const char* fn, int line);

/// str.strip/lstrip/rstrip(chars) on the sides asked for; None or Undefined `chars`: whitespace.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right, int line,
                     const char* fn = "strip");
/// str.splitlines(keepends).
std::vector<std::string> py_splitlines(const std::string& s, bool keepends);
/// str.replace(from, to, count); a negative count replaces all.
std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count);
/// `s` padded with `fill` to `width` code points: align '<' (ljust), '>' (rjust), '^' (center).
std::string pad(const std::string& s, int64_t width, char align, const std::string& fill = " ");
/// str.islower() (`lower`) or str.isupper().
bool case_check(const std::string& s, bool lower);
/// `fmt % args`, printf-style formatting (the `%` operator and the `format` filter).
std::string percent_format(const std::string& fmt, const Value& args, int line);

/// markupsafe.escape's text: & < > " ' as HTML entities.
std::string html_escape(const std::string& s);
/// A markupsafe.Markup: what jinja2's |safe and |escape return; `+` escapes a plain str joined to
/// it.
Value markup(std::string s);

/// Whether str has the method `name` in chat templates (jinja_str_methods.cpp).
bool is_str_method(const std::string& name);
/// `s.name(*args)` for a method is_str_method() accepts.
Value str_method(const std::string& s, const std::string& name, CallArgs& args);

}  // namespace trainrun::text::jinja
