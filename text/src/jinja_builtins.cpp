// Builtin filters, tests, methods and operators of the chat-template engine (jinja_builtins.hpp).
#include "jinja_builtins.hpp"

#include <unicode/uchar.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>

namespace trainrun::text::jinja {
namespace {

using Args = CallArgs;

// Python's floor division of integers.
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

std::string str_arg(const Value& v, const char* fn, const char* what, int line) {
  if (!v.is_string())
    throw Error(std::string(fn) + "() " + what + " must be str, not " + type_name(v), line);
  return v.s;
}

int64_t int_arg(const Value& v, const char* fn, int line) {
  if (v.kind == Value::Kind::Int) return v.i;
  if (v.kind == Value::Kind::Bool) return v.b;
  throw Error(std::string(fn) + "(): '" + type_name(v) + "' object cannot be interpreted as an integer", line);
}

// ---- strings ----

std::u32string strip_set(const Value& chars, int line, const char* fn) {
  if (chars.is_none() || chars.is_undefined()) return U"";
  return utf8_decode(str_arg(chars, fn, "arg", line));
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right, int line,
                     const char* fn = "strip") {
  const std::u32string set = strip_set(chars, line, fn);
  const bool ws = chars.is_none() || chars.is_undefined();
  auto drop = [&](char32_t c) { return ws ? is_py_space(c) : set.find(c) != std::u32string::npos; };
  const std::u32string u = utf8_decode(s);
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && drop(u[b])) ++b;
  if (right)
    while (e > b && drop(u[e - 1])) --e;
  return utf8_encode(u.substr(b, e - b));
}

std::vector<std::string> py_split(const std::string& s, const Value& sep, int64_t maxsplit, int line) {
  std::vector<std::string> out;
  if (sep.is_none() || sep.is_undefined()) {
    const std::u32string u = utf8_decode(s);
    size_t k = 0;
    while (k < u.size() && is_py_space(u[k])) ++k;
    while (k < u.size()) {
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
        out.push_back(utf8_encode(u.substr(k)));  // the rest, trailing whitespace kept
        return out;
      }
      size_t e = k;
      while (e < u.size() && !is_py_space(u[e])) ++e;
      out.push_back(utf8_encode(u.substr(k, e - k)));
      k = e;
      while (k < u.size() && is_py_space(u[k])) ++k;
    }
    return out;
  }
  const std::string d = str_arg(sep, "split", "separator", line);
  if (d.empty()) throw Error("split(): empty separator", line);
  size_t k = 0;
  while (true) {
    const size_t f = (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) ? std::string::npos : s.find(d, k);
    if (f == std::string::npos) {
      out.push_back(s.substr(k));
      return out;
    }
    out.push_back(s.substr(k, f - k));
    k = f + d.size();
  }
}

std::vector<std::string> py_rsplit(const std::string& s, const Value& sep, int64_t maxsplit, int line) {
  if (maxsplit < 0) return py_split(s, sep, -1, line);
  std::vector<std::string> out;
  if (sep.is_none() || sep.is_undefined()) {
    const std::u32string u = utf8_decode(s);
    size_t e = u.size();
    while (e > 0 && is_py_space(u[e - 1])) --e;
    while (e > 0) {
      if (static_cast<int64_t>(out.size()) >= maxsplit) {
        out.push_back(utf8_encode(u.substr(0, e)));
        break;
      }
      size_t b = e;
      while (b > 0 && !is_py_space(u[b - 1])) --b;
      out.push_back(utf8_encode(u.substr(b, e - b)));
      e = b;
      while (e > 0 && is_py_space(u[e - 1])) --e;
    }
    std::reverse(out.begin(), out.end());
    return out;
  }
  const std::string d = str_arg(sep, "rsplit", "separator", line);
  if (d.empty()) throw Error("rsplit(): empty separator", line);
  size_t end = s.size();
  while (static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < d.size()) break;
    const size_t f = s.rfind(d, end - d.size());
    if (f == std::string::npos) break;
    out.push_back(s.substr(f + d.size(), end - f - d.size()));
    end = f;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> out;
  const std::u32string u = utf8_decode(s);
  size_t b = 0;
  for (size_t k = 0; k < u.size(); ++k) {
    const char32_t c = u[k];
    const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    size_t e = k + 1;
    if (c == '\r' && k + 1 < u.size() && u[k + 1] == '\n') e = k + 2;
    out.push_back(utf8_encode(u.substr(b, (keepends ? e : k) - b)));
    b = e;
    k = e - 1;
  }
  if (b < u.size()) out.push_back(utf8_encode(u.substr(b)));
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character
    const std::u32string u = utf8_decode(s);
    int64_t n = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k < u.size()) out += utf8_encode(u[k]);
    }
    return out;
  }
  size_t k = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(from, k);
    if (f == std::string::npos) break;
    out += s.substr(k, f - k) + to;
    k = f + from.size();
    ++n;
  }
  return out + s.substr(k);
}

Value str_list(const std::vector<std::string>& parts) {
  List items;
  for (const auto& p : parts) items.push_back(Value::string(p));
  return Value::make_list(std::move(items));
}

int64_t cp_index(const std::string& s, size_t byte_offset) {
  return static_cast<int64_t>(utf8_decode(s.substr(0, byte_offset)).size());
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, int line) {
  auto one = [&](const Value& a) {
    const std::string x = str_arg(a, prefix ? "startswith" : "endswith", "first arg", line);
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.kind == Value::Kind::Tuple) {
    for (const auto& a : *affix.list)
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

template <typename Pred>
bool all_chars(const std::string& s, Pred pred) {
  const std::u32string u = utf8_decode(s);
  if (u.empty()) return false;
  for (char32_t c : u)
    if (!pred(static_cast<UChar32>(c))) return false;
  return true;
}

// Python's islower()/isupper(): at least one cased character and none of the other case.
bool case_check(const std::string& s, bool lower) {
  bool cased = false;
  for (char32_t c : utf8_decode(s)) {
    const auto uc = static_cast<UChar32>(c);
    if (u_isupper(uc) || u_istitle(uc)) {
      if (lower) return false;
      cased = true;
    } else if (u_islower(uc)) {
      if (!lower) return false;
      cased = true;
    }
  }
  return cased;
}

std::string pad(const std::string& s, int64_t width, char align, const std::string& fill = " ") {
  const int64_t len = static_cast<int64_t>(utf8_decode(s).size());
  if (width <= len) return s;
  const int64_t total = width - len;
  int64_t left = 0;
  if (align == '>') left = total;
  else if (align == '^') left = total / 2 + (total & width & 1);  // CPython's centre rounding
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < total - left; ++k) out += fill;
  return out;
}

// printf-style `fmt % args` (Python's %-formatting, as `format` filter and `%` operator use it).
std::string percent_format(const std::string& fmt, const Value& args, int line) {
  std::vector<Value> pos;
  const Dict* mapping = nullptr;
  if (args.kind == Value::Kind::Tuple) pos = *args.list;
  else if (args.kind == Value::Kind::Dict) mapping = args.dict.get(), pos.push_back(args);
  else pos.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    if (++k >= fmt.size()) throw Error("incomplete format", line);
    const Value* arg = nullptr;
    if (fmt[k] == '(') {
      const size_t close = fmt.find(')', k);
      if (close == std::string::npos || !mapping) throw Error("format requires a mapping", line);
      arg = mapping->find(fmt.substr(k + 1, close - k - 1));
      if (!arg) throw Error("KeyError: '" + fmt.substr(k + 1, close - k - 1) + "'", line);
      k = close + 1;
    }
    std::string flags;
    while (k < fmt.size() && std::string("-+ 0#").find(fmt[k]) != std::string::npos) flags += fmt[k++];
    std::string width, prec;
    while (k < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[k]))) width += fmt[k++];
    if (k < fmt.size() && fmt[k] == '.') {
      prec = ".";
      ++k;
      while (k < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[k]))) prec += fmt[k++];
    }
    while (k < fmt.size() && (fmt[k] == 'h' || fmt[k] == 'l' || fmt[k] == 'L')) ++k;
    if (k >= fmt.size()) throw Error("incomplete format", line);
    const char type = fmt[k];
    if (type == '%') {
      out += '%';
      continue;
    }
    if (!arg) {
      if (mapping) arg = &pos[0];
      else if (next < pos.size()) arg = &pos[next++];
      else throw Error("not enough arguments for format string", line);
    }
    char buf[512];
    const std::string spec = "%" + flags + width + prec;
    if (type == 's' || type == 'r' || type == 'a') {
      std::string text = type == 's' ? to_str(*arg) : repr(*arg);
      if (prec.size() > 1) text = utf8_encode(utf8_decode(text).substr(0, std::stoul(prec.substr(1))));
      out += width.empty() ? text : pad(text, std::stoll(width), flags.find('-') != std::string::npos ? '<' : '>');
    } else if (std::string("diuxXoc").find(type) != std::string::npos) {
      if (!arg->is_number()) throw Error(std::string("%") + type + " format: a number is required, not " + type_name(*arg), line);
      const long long x = arg->kind == Value::Kind::Float ? static_cast<long long>(arg->f)
                                                          : (arg->kind == Value::Kind::Bool ? arg->b : arg->i);
      if (type == 'c') {
        out += utf8_encode(static_cast<char32_t>(x));
        continue;
      }
      std::snprintf(buf, sizeof buf, (spec + "ll" + (type == 'i' || type == 'u' ? 'd' : type)).c_str(), x);
      out += buf;
    } else if (std::string("eEfFgG").find(type) != std::string::npos) {
      if (!arg->is_number()) throw Error(std::string("%") + type + " format: a real number is required, not " + type_name(*arg), line);
      std::snprintf(buf, sizeof buf, (spec + type).c_str(), arg->as_double());
      out += buf;
    } else {
      throw Error(std::string("unsupported format character '") + type + "'", line);
    }
  }
  if (!mapping && next < pos.size()) throw Error("not all arguments converted during string formatting", line);
  return out;
}

// str.format with automatic or explicit fields, keyword fields, !r/!s and no format specs.
std::string brace_format(const std::string& fmt, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    const char c = fmt[k];
    if (c == '}' ) {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}') ++k;
      else throw Error("Single '}' encountered in format string", a.line);
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out += '{';
      ++k;
      continue;
    }
    const size_t close = fmt.find('}', k);
    if (close == std::string::npos) throw Error("Single '{' encountered in format string", a.line);
    std::string field = fmt.substr(k + 1, close - k - 1);
    k = close;
    char conv = 's';
    if (field.find(':') != std::string::npos)
      throw Error("unsupported construct: format specs in str.format ('" + field + "')", a.line);
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conv = bang + 1 < field.size() ? field[bang + 1] : 's';
      field = field.substr(0, bang);
    }
    Value v;
    if (field.empty()) {
      if (auto_index >= a.pos.size()) throw Error("Replacement index " + std::to_string(auto_index) + " out of range", a.line);
      v = a.pos[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); })) {
      const size_t idx = std::stoul(field);
      if (idx >= a.pos.size()) throw Error("Replacement index " + field + " out of range", a.line);
      v = a.pos[idx];
    } else {
      bool found = false;
      for (const auto& kw : a.kw)
        if (kw.first == field) v = kw.second, found = true;
      if (!found) throw Error("KeyError: '" + field + "'", a.line);
    }
    out += conv == 'r' ? repr(v) : to_str(v);
  }
  return out;
}

// ---- collections ----

Value attr_path(const Value& item, const Value& attribute, int line) {
  if (attribute.kind == Value::Kind::Int) return Builtins::getitem(item, attribute, line);
  Value v = item;
  const std::string path = to_str(attribute);
  size_t b = 0;
  while (true) {
    const size_t dot = path.find('.', b);
    const std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    v = Builtins::getitem(v, digits ? Value::integer(std::stoll(part)) : Value::string(part), line);
    if (dot == std::string::npos) return v;
    b = dot + 1;
  }
}

// markupsafe.Markup: jinja2's |safe and |escape return it; `+` escapes a plain str joined to it.
Value markup(std::string s) {
  Value v = Value::string(std::move(s));
  v.markup = true;
  return v;
}

// A str method or filter applied to a Markup returns a Markup.
Value same_kind(const Value& original, std::string s) {
  Value v = Value::string(std::move(s));
  v.markup = original.is_string() && original.markup;
  return v;
}

Value lower_if_str(const Value& v) { return v.is_string() ? Value::string(to_lower(v.s)) : v; }

std::function<Value(const Value&)> key_getter(const Value& attribute, bool case_sensitive, int line) {
  return [attribute, case_sensitive, line](const Value& item) {
    Value k = attribute.is_none() || attribute.is_undefined() ? item : attr_path(item, attribute, line);
    return case_sensitive ? k : lower_if_str(k);
  };
}

Value min_max(const Value& v, const Args& a, bool want_max) {
  const auto items = Builtins::iterate(v, a.line);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const auto key = key_getter(a.get(1, "attribute", Value::none()), a.get(0, "case_sensitive", Value::boolean(false)).truthy(), a.line);
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t k = 1; k < items.size(); ++k) {
    Value kk = key(items[k]);
    if (want_max ? less(best_key, kk, a.line) : less(kk, best_key, a.line)) {
      best = k;
      best_key = std::move(kk);
    }
  }
  return items[best];
}

Value sum_values(const Value& a, const Value& b, int line) { return Builtins::arithmetic("+", a, b, line); }

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// jinja2's title filter: each word (split at runs of -, whitespace, (, {, [, <) gets its first
// character upper-cased and the rest lower-cased.
std::string jinja_title(const std::string& s) {
  const std::u32string u = utf8_decode(s);
  auto sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_py_space(c); };
  std::string out;
  size_t k = 0;
  while (k < u.size()) {
    size_t e = k;
    const bool is_sep = sep(u[k]);
    while (e < u.size() && sep(u[e]) == is_sep) ++e;
    const std::string chunk = utf8_encode(u.substr(k, e - k));
    if (is_sep) out += chunk;
    else out += to_upper(utf8_encode(u[k])) + to_lower(utf8_encode(u.substr(k + 1, e - k - 1)));
    k = e;
  }
  return out;
}

Value to_int(const Value& v, const Value& fallback, int64_t base, int line) {
  switch (v.kind) {
    case Value::Kind::Int: return v;
    case Value::Kind::Bool: return Value::integer(v.b);
    case Value::Kind::Float:
      if (!std::isfinite(v.f)) return fallback;
      return Value::integer(static_cast<int64_t>(v.f));
    case Value::Kind::String: {
      std::string t = py_strip(v.s, Value::none(), true, true, line);
      t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
      if (!t.empty()) {
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(t.c_str(), &end, static_cast<int>(base));
        if (errno == 0 && end && *end == '\0') return Value::integer(x);
        const double d = std::strtod(t.c_str(), &end);  // jinja2: "42.23"|int is 42
        if (end && *end == '\0' && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
      }
      return fallback;
    }
    default: return fallback;
  }
}

Value to_float(const Value& v, const Value& fallback, int line) {
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    const std::string t = py_strip(v.s, Value::none(), true, true, line);
    char* end = nullptr;
    const double d = std::strtod(t.c_str(), &end);
    if (!t.empty() && end && *end == '\0') return Value::number(d);
  }
  return fallback;
}

Value py_round(const Value& v, int64_t precision, const std::string& method, int line) {
  if (method != "common" && method != "ceil" && method != "floor")
    throw Error("round(): method must be common, ceil or floor", line);
  if (!v.is_number()) throw Error("round(): a number is required, not " + type_name(v), line);
  if (method == "common") {
    if (v.kind != Value::Kind::Float) return v.kind == Value::Kind::Bool ? Value::integer(v.b) : v;
    // Python rounds the exact binary value half-to-even; glibc's printf does the same.
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::max<int64_t>(precision, 0)), v.f);
    double r = std::strtod(buf, nullptr);
    if (precision < 0) {
      const double p = std::pow(10.0, static_cast<double>(-precision));
      r = std::nearbyint(v.f / p) * p;
    }
    return Value::number(r);
  }
  const double p = std::pow(10.0, static_cast<double>(precision));
  return Value::number((method == "ceil" ? std::ceil(v.as_double() * p) : std::floor(v.as_double() * p)) / p);
}

std::string indent_filter(std::string s, const Value& width, bool first, bool blank) {
  const std::string ind = width.is_string() ? width.s : std::string(static_cast<size_t>(std::max<int64_t>(width.i, 0)), ' ');
  s += "\n";  // jinja2's quirk for splitlines
  const auto lines = py_splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + ind : "") + lines[k];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
  }
  return first ? ind + rv : rv;
}

// ---- filter and test tables ----

using FilterFn = std::function<Value(Builtins::Host&, const Value&, Args&)>;
using TestFn = std::function<bool(Builtins::Host&, const Value&, Args&)>;

const std::map<std::string, TestFn>& tests();

Value select_like(Builtins::Host& host, const Value& v, Args& a, bool by_attr, bool keep_if) {
  // select(test, *args) / selectattr(attr, test, *args): the remaining positionals go to the test.
  size_t k = 0;
  Value attribute;
  if (by_attr) {
    if (a.pos.empty()) throw Error("selectattr/rejectattr need an attribute name", a.line);
    attribute = a.pos[k++];
  }
  std::string test_name;
  if (k < a.pos.size()) test_name = str_arg(a.pos[k++], "select", "test name", a.line);
  Args test_args;
  test_args.line = a.line;
  test_args.pos.assign(a.pos.begin() + static_cast<long>(std::min(k, a.pos.size())), a.pos.end());
  test_args.kw = a.kw;
  if (!test_name.empty() && !Builtins::has_test(test_name))
    throw Error("unsupported construct: the test '" + test_name + "'", a.line);
  List out;
  if (!v.truthy()) return Value::make_view({}, Value::View::Generator);  // jinja2: `if value:` first
  for (const auto& item : Builtins::iterate(v, a.line)) {
    const Value probe = by_attr ? attr_path(item, attribute, a.line) : item;
    const bool ok = test_name.empty() ? probe.truthy() : Builtins::test(host, test_name, probe, test_args);
    if (ok == keep_if) out.push_back(item);
  }
  return Value::make_view(std::move(out), Value::View::Generator);
}

Value tojson_filter(const Value& v, Args& a) {
  a.expect("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = a.get(0, "ensure_ascii", Value::boolean(false)).truthy();
  const Value indent = a.get(1, "indent", Value::none());
  if (indent.is_string()) {
    o.indent_is_string = true;
    o.indent_str = indent.s;
  } else if (!indent.is_none()) {
    o.indent = static_cast<int>(int_arg(indent, "tojson", a.line));
  }
  const Value seps = a.get(2, "separators", Value::none());
  if (!seps.is_none()) {
    const auto parts = Builtins::iterate(seps, a.line);
    if (parts.size() != 2 || !parts[0].is_string() || !parts[1].is_string())
      throw Error("tojson(): separators must be an (item_separator, key_separator) pair", a.line);
    o.separators_given = true;
    o.item_sep = parts[0].s;
    o.key_sep = parts[1].s;
  }
  o.sort_keys = a.get(3, "sort_keys", Value::boolean(false)).truthy();
  return Value::string(to_json(v, o, a.line));
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> table = [] {
    std::map<std::string, FilterFn> f;
    f["abs"] = [](auto&, const Value& v, Args& a) {
      if (v.kind == Value::Kind::Float) return Value::number(std::fabs(v.f));
      if (v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool) return Value::integer(std::llabs(v.kind == Value::Kind::Bool ? v.b : v.i));
      throw Error("bad operand type for abs(): '" + type_name(v) + "'", a.line);
    };
    f["attr"] = [](auto&, const Value& v, Args& a) { return Builtins::getattr(v, to_str(a.get(0, "name")), a.line); };
    f["batch"] = [](auto&, const Value& v, Args& a) {
      const int64_t n = int_arg(a.get(0, "linecount"), "batch", a.line);
      if (n <= 0) throw Error("batch(): linecount must be positive", a.line);
      const Value fill = a.get(1, "fill_with", Value::none());
      List out, cur;
      for (const auto& item : Builtins::iterate(v, a.line)) {
        cur.push_back(item);
        if (static_cast<int64_t>(cur.size()) == n) out.push_back(Value::make_list(std::move(cur))), cur = {};
      }
      if (!cur.empty()) {
        if (!fill.is_none())
          while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
        out.push_back(Value::make_list(std::move(cur)));
      }
      return Value::make_view(std::move(out), Value::View::Generator);
    };
    f["capitalize"] = [](auto&, const Value& v, Args&) { return same_kind(v, to_capitalize(to_str(v))); };
    f["center"] = [](auto&, const Value& v, Args& a) {
      return Value::string(pad(to_str(v), int_arg(a.get(0, "width", Value::integer(80)), "center", a.line), '^'));
    };
    f["default"] = [](auto&, const Value& v, Args& a) {
      const bool boolean = a.get(1, "boolean", Value::boolean(false)).truthy();
      if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value::string(""));
      return v;
    };
    f["d"] = f["default"];
    f["dictsort"] = [](auto&, const Value& v, Args& a) {
      if (v.kind != Value::Kind::Dict) throw Error("dictsort(): a dict is required, not " + type_name(v), a.line);
      const bool cs = a.get(0, "case_sensitive", Value::boolean(false)).truthy();
      const std::string by = to_str(a.get(1, "by", Value::string("key")));
      const bool rev = a.get(2, "reverse", Value::boolean(false)).truthy();
      if (by != "key" && by != "value") throw Error("dictsort(): you can only sort by either 'key' or 'value'", a.line);
      List items;
      for (const auto& kv : v.dict->items) items.push_back(Value::make_list({key_value(kv.first), kv.second}, true));
      const int pos = by == "key" ? 0 : 1;
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        Value kx = (*x.list)[pos], ky = (*y.list)[pos];
        if (!cs) kx = lower_if_str(kx), ky = lower_if_str(ky);
        return rev ? less(ky, kx, a.line) : less(kx, ky, a.line);
      });
      return Value::make_list(std::move(items));
    };
    f["escape"] = [](auto&, const Value& v, Args&) {
      if (v.is_string() && v.markup) return v;
      return markup(html_escape(to_str(v)));
    };
    f["e"] = f["escape"];
    f["forceescape"] = [](auto&, const Value& v, Args&) { return markup(html_escape(to_str(v))); };
    f["first"] = [](auto&, const Value& v, Args& a) {
      const auto items = Builtins::iterate(v, a.line);
      return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
    };
    f["float"] = [](auto&, const Value& v, Args& a) { return to_float(v, a.get(0, "default", Value::number(0.0)), a.line); };
    f["format"] = [](auto&, const Value& v, Args& a) {
      if (!a.kw.empty()) {
        Dict d;
        for (const auto& kw : a.kw) d.set(kw.first, kw.second);
        return Value::string(percent_format(to_str(v), Value::make_dict(std::move(d)), a.line));
      }
      return Value::string(percent_format(to_str(v), Value::make_list(a.pos, true), a.line));
    };
    f["indent"] = [](auto&, const Value& v, Args& a) {
      const Value width = a.get(0, "width", Value::integer(4));
      return Value::string(indent_filter(to_str(v), width, a.get(1, "first", Value::boolean(false)).truthy(),
                                         a.get(2, "blank", Value::boolean(false)).truthy()));
    };
    f["int"] = [](auto&, const Value& v, Args& a) {
      return to_int(v, a.get(0, "default", Value::integer(0)), int_arg(a.get(1, "base", Value::integer(10)), "int", a.line), a.line);
    };
    f["items"] = [](auto&, const Value& v, Args& a) {
      if (v.is_undefined()) return Value::make_list();
      if (v.kind != Value::Kind::Dict) throw Error("items(): can only get item pairs from a mapping, not " + type_name(v), a.line);
      List items;
      for (const auto& kv : v.dict->items) items.push_back(Value::make_list({key_value(kv.first), kv.second}, true));
      return Value::make_view(std::move(items), Value::View::Generator);
    };
    f["join"] = [](auto&, const Value& v, Args& a) {
      const std::string sep = to_str(a.get(0, "d", Value::string("")));
      const Value attribute = a.get(1, "attribute", Value::none());
      std::string out;
      bool first = true;
      for (const auto& item : Builtins::iterate(v, a.line)) {
        if (!first) out += sep;
        first = false;
        out += to_str(attribute.is_none() ? item : attr_path(item, attribute, a.line));
      }
      return Value::string(out);
    };
    f["last"] = [](auto&, const Value& v, Args& a) {
      if (v.is_undefined()) undefined_error(v, a.line);
      if (v.is_iterator()) throw Error("'" + type_name(v) + "' object is not reversible", a.line);
      const auto items = Builtins::iterate(v, a.line);
      return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
    };
    f["length"] = [](auto&, const Value& v, Args& a) {
      switch (v.kind) {
        case Value::Kind::Undefined: return Value::integer(0);
        case Value::Kind::String: return Value::integer(static_cast<int64_t>(utf8_decode(v.s).size()));
        case Value::Kind::List:
        case Value::Kind::Tuple:
          if (v.is_iterator()) throw Error("object of type '" + type_name(v) + "' has no len()", a.line);
          return Value::integer(static_cast<int64_t>(v.list->size()));
        case Value::Kind::Dict: return Value::integer(static_cast<int64_t>(v.dict->items.size()));
        default: throw Error("object of type '" + type_name(v) + "' has no len()", a.line);
      }
    };
    f["count"] = f["length"];
    f["list"] = [](auto&, const Value& v, Args& a) { return Value::make_list(Builtins::iterate(v, a.line)); };
    f["lower"] = [](auto&, const Value& v, Args&) { return same_kind(v, to_lower(to_str(v))); };
    f["map"] = [](Builtins::Host& host, const Value& v, Args& a) {
      List out;
      const auto items = v.truthy() ? Builtins::iterate(v, a.line) : std::vector<Value>{};  // jinja2: `if value:`
      if (a.pos.empty()) {
        Value attribute;
        Value fallback = Value::none();
        for (const auto& kw : a.kw) {
          if (kw.first == "attribute") attribute = kw.second;
          else if (kw.first == "default") fallback = kw.second;
          else throw Error("map(): unexpected keyword argument '" + kw.first + "'", a.line);
        }
        if (attribute.is_undefined()) throw Error("map(): needs a filter name or attribute=", a.line);
        for (const auto& item : items) {
          Value x = attr_path(item, attribute, a.line);
          out.push_back(x.is_undefined() && !fallback.is_none() ? fallback : x);
        }
        return Value::make_view(std::move(out), Value::View::Generator);
      }
      const std::string name = str_arg(a.pos[0], "map", "filter name", a.line);
      if (!Builtins::has_filter(name)) throw Error("unsupported construct: the filter '" + name + "'", a.line);
      Args rest;
      rest.line = a.line;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      rest.kw = a.kw;
      for (const auto& item : items) out.push_back(Builtins::filter(host, name, item, rest));
      return Value::make_view(std::move(out), Value::View::Generator);
    };
    f["max"] = [](auto&, const Value& v, Args& a) { return min_max(v, a, true); };
    f["min"] = [](auto&, const Value& v, Args& a) { return min_max(v, a, false); };
    f["reject"] = [](Builtins::Host& h, const Value& v, Args& a) { return select_like(h, v, a, false, false); };
    f["rejectattr"] = [](Builtins::Host& h, const Value& v, Args& a) { return select_like(h, v, a, true, false); };
    f["select"] = [](Builtins::Host& h, const Value& v, Args& a) { return select_like(h, v, a, false, true); };
    f["selectattr"] = [](Builtins::Host& h, const Value& v, Args& a) { return select_like(h, v, a, true, true); };
    f["replace"] = [](auto&, const Value& v, Args& a) {
      const Value count = a.get(2, "count", Value::none());
      return Value::string(py_replace(to_str(v), to_str(a.get(0, "old")), to_str(a.get(1, "new")),
                                      count.is_none() ? -1 : int_arg(count, "replace", a.line)));
    };
    f["reverse"] = [](auto&, const Value& v, Args& a) {
      if (v.is_string()) {
        std::u32string u = utf8_decode(v.s);
        std::reverse(u.begin(), u.end());
        return Value::string(utf8_encode(u));
      }
      auto items = Builtins::iterate(v, a.line);
      std::reverse(items.begin(), items.end());
      // reversed() of a list or dict is an iterator; a generator is listed and reversed
      return v.is_iterator() ? Value::make_list(std::move(items)) : Value::make_view(std::move(items), Value::View::ReverseIterator);
    };
    f["round"] = [](auto&, const Value& v, Args& a) {
      return py_round(v, int_arg(a.get(0, "precision", Value::integer(0)), "round", a.line),
                      to_str(a.get(1, "method", Value::string("common"))), a.line);
    };
    f["safe"] = [](auto&, const Value& v, Args&) { return markup(to_str(v)); };
    f["sort"] = [](auto&, const Value& v, Args& a) {
      auto items = Builtins::iterate(v, a.line);
      const bool rev = a.get(0, "reverse", Value::boolean(false)).truthy();
      const auto key = key_getter(a.get(2, "attribute", Value::none()), a.get(1, "case_sensitive", Value::boolean(false)).truthy(), a.line);
      std::vector<std::pair<Value, Value>> keyed;
      for (auto& item : items) keyed.emplace_back(key(item), item);
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
        return rev ? less(y.first, x.first, a.line) : less(x.first, y.first, a.line);
      });
      List out;
      for (auto& kv : keyed) out.push_back(kv.second);
      return Value::make_list(std::move(out));
    };
    f["string"] = [](auto&, const Value& v, Args&) { return Value::string(to_str(v)); };
    f["sum"] = [](auto&, const Value& v, Args& a) {
      const Value attribute = a.get(0, "attribute", Value::none());
      Value total = a.get(1, "start", Value::integer(0));
      for (const auto& item : Builtins::iterate(v, a.line))
        total = sum_values(total, attribute.is_none() ? item : attr_path(item, attribute, a.line), a.line);
      return total;
    };
    f["title"] = [](auto&, const Value& v, Args&) { return Value::string(jinja_title(to_str(v))); };
    f["tojson"] = [](auto&, const Value& v, Args& a) { return tojson_filter(v, a); };
    f["trim"] = [](auto&, const Value& v, Args& a) {
      return same_kind(v, py_strip(to_str(v), a.get(0, "chars", Value::none()), true, true, a.line));
    };
    f["unique"] = [](auto&, const Value& v, Args& a) {
      const auto key = key_getter(a.get(1, "attribute", Value::none()), a.get(0, "case_sensitive", Value::boolean(false)).truthy(), a.line);
      List out, seen;
      for (const auto& item : Builtins::iterate(v, a.line)) {
        const Value k = key(item);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); })) {
          seen.push_back(k);
          out.push_back(item);
        }
      }
      return Value::make_view(std::move(out), Value::View::Generator);
    };
    f["upper"] = [](auto&, const Value& v, Args&) { return same_kind(v, to_upper(to_str(v))); };
    f["wordcount"] = [](auto&, const Value& v, Args&) {
      int64_t n = 0;
      bool in_word = false;
      for (char32_t c : utf8_decode(to_str(v))) {
        const bool w = c == '_' || u_isalnum(static_cast<UChar32>(c));
        if (w && !in_word) ++n;
        in_word = w;
      }
      return Value::integer(n);
    };
    return f;
  }();
  return table;
}

bool number_compare(const Value& v, Args& a, const char* op) {
  const Value other = a.get(0, "other");
  if (std::string(op) == "==") return equal(v, other);
  if (std::string(op) == "!=") return !equal(v, other);
  if (std::string(op) == "<") return less(v, other, a.line);
  if (std::string(op) == ">") return less(other, v, a.line);
  if (std::string(op) == "<=") return !less(other, v, a.line);
  return !less(v, other, a.line);
}

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> table = [] {
    std::map<std::string, TestFn> t;
    using K = Value::Kind;
    t["boolean"] = [](auto&, const Value& v, Args&) { return v.kind == K::Bool; };
    t["callable"] = [](auto&, const Value& v, Args&) { return v.kind == K::Callable; };
    t["defined"] = [](auto&, const Value& v, Args&) { return !v.is_undefined(); };
    t["undefined"] = [](auto&, const Value& v, Args&) { return v.is_undefined(); };
    t["divisibleby"] = [](auto&, const Value& v, Args& a) {
      const Value num = a.get(0, "num");
      const Value r = Builtins::arithmetic("%", v, num, a.line);
      return r.as_double() == 0;
    };
    t["escaped"] = [](auto&, const Value&, Args&) { return false; };
    t["even"] = [](auto&, const Value& v, Args& a) { return int_arg(v, "even", a.line) % 2 == 0; };
    t["odd"] = [](auto&, const Value& v, Args& a) { return int_arg(v, "odd", a.line) % 2 != 0; };
    t["false"] = [](auto&, const Value& v, Args&) { return v.kind == K::Bool && !v.b; };
    t["true"] = [](auto&, const Value& v, Args&) { return v.kind == K::Bool && v.b; };
    t["filter"] = [](auto&, const Value& v, Args&) { return v.is_string() && Builtins::has_filter(v.s); };
    t["test"] = [](auto&, const Value& v, Args&) { return v.is_string() && Builtins::has_test(v.s); };
    t["float"] = [](auto&, const Value& v, Args&) { return v.kind == K::Float; };
    t["integer"] = [](auto&, const Value& v, Args&) { return v.kind == K::Int; };
    t["number"] = [](auto&, const Value& v, Args&) { return v.is_number(); };
    t["string"] = [](auto&, const Value& v, Args&) { return v.is_string(); };
    t["mapping"] = [](auto&, const Value& v, Args&) { return v.kind == K::Dict; };
    t["iterable"] = [](auto&, const Value& v, Args&) {
      return v.is_string() || v.is_sequence() || v.kind == K::Dict || v.is_undefined();
    };
    // jinja2 asks for len() and __getitem__, which Undefined has too
    t["sequence"] = [](auto&, const Value& v, Args&) {
      return v.is_string() || v.is_plain_sequence() || v.kind == K::Dict || v.is_undefined();
    };
    t["none"] = [](auto&, const Value& v, Args&) { return v.is_none(); };
    t["lower"] = [](auto&, const Value& v, Args&) { return case_check(to_str(v), true); };
    t["upper"] = [](auto&, const Value& v, Args&) { return case_check(to_str(v), false); };
    t["in"] = [](auto&, const Value& v, Args& a) { return Builtins::contains(a.get(0, "seq"), v, a.line); };
    t["sameas"] = [](auto&, const Value& v, Args& a) {
      const Value o = a.get(0, "other");
      if (v.kind != o.kind) return false;
      switch (v.kind) {
        case K::List:
        case K::Tuple: return v.list == o.list;
        case K::Dict:
        case K::Namespace:
        case K::Object: return v.dict == o.dict;
        case K::Callable: return v.fn == o.fn;
        default: return equal(v, o);
      }
    };
    for (auto [names, op] : std::vector<std::pair<std::vector<const char*>, const char*>>{
             {{"eq", "==", "equalto"}, "=="}, {{"ne", "!="}, "!="}, {{"lt", "<", "lessthan"}, "<"},
             {{"le", "<="}, "<="}, {{"gt", ">", "greaterthan"}, ">"}, {{"ge", ">="}, ">="}}) {
      const char* o = op;
      for (const char* n : names) t[n] = [o](auto&, const Value& v, Args& a) { return number_compare(v, a, o); };
    }
    return t;
  }();
  return table;
}

bool is_dict_method(const std::string& n) {
  return n == "items" || n == "keys" || n == "values" || n == "get" || n == "copy";
}
bool is_unsafe_dict_method(const std::string& n) {
  return n == "pop" || n == "popitem" || n == "setdefault" || n == "update" || n == "clear";
}
bool is_list_method(const std::string& n) { return n == "index" || n == "count" || n == "copy"; }
bool is_unsafe_list_method(const std::string& n) {
  return n == "append" || n == "extend" || n == "insert" || n == "pop" || n == "remove" || n == "reverse" ||
         n == "sort" || n == "clear";
}
bool is_str_method(const std::string& n) {
  static const char* names[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith",
                                "endswith", "replace", "upper", "lower", "title", "capitalize", "swapcase", "find",
                                "rfind", "index", "rindex", "count", "join", "format", "isdigit", "isdecimal",
                                "isnumeric", "isalpha", "isalnum", "isspace", "islower", "isupper", "istitle",
                                "removeprefix", "removesuffix", "zfill", "center", "ljust", "rjust", "partition",
                                "rpartition"};
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) +
                          "' object is unsafe (chat templates render in an immutable sandbox)");
}

Value str_method(const std::string& s, const std::string& m, Args& a) {
  const int line = a.line;
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    a.expect(m, 1, {});
    return Value::string(py_strip(s, a.get(0, "chars", Value::none()), m != "rstrip", m != "lstrip", line, m.c_str()));
  }
  if (m == "split" || m == "rsplit") {
    a.expect(m, 2, {"sep", "maxsplit"});
    const Value maxsplit = a.get(1, "maxsplit", Value::integer(-1));
    const int64_t n = int_arg(maxsplit, m.c_str(), line);
    return str_list(m == "split" ? py_split(s, a.get(0, "sep", Value::none()), n, line)
                                 : py_rsplit(s, a.get(0, "sep", Value::none()), n, line));
  }
  if (m == "splitlines") return str_list(py_splitlines(s, a.get(0, "keepends", Value::boolean(false)).truthy()));
  if (m == "startswith" || m == "endswith") {
    a.expect(m, 1, {});
    return Value::boolean(affix_match(s, a.get(0, "prefix"), m == "startswith", line));
  }
  if (m == "replace") {
    a.expect(m, 3, {"count"});
    const Value count = a.get(2, "count", Value::integer(-1));
    return Value::string(py_replace(s, str_arg(a.get(0, "old"), "replace", "arg 1", line),
                                    str_arg(a.get(1, "new"), "replace", "arg 2", line), int_arg(count, "replace", line)));
  }
  if (m == "upper") return Value::string(to_upper(s));
  if (m == "lower") return Value::string(to_lower(s));
  if (m == "title") return Value::string(to_title(s));
  if (m == "capitalize") return Value::string(to_capitalize(s));
  if (m == "swapcase") {
    std::string out;
    for (char32_t c : utf8_decode(s)) {
      const auto uc = static_cast<UChar32>(c);
      out += utf8_encode(static_cast<char32_t>(u_isupper(uc) ? u_tolower(uc) : u_islower(uc) ? u_toupper(uc) : uc));
    }
    return Value::string(out);
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "rindex") {
    a.expect(m, 1, {});
    const std::string sub = str_arg(a.get(0, "sub"), m.c_str(), "arg", line);
    const size_t f = (m == "find" || m == "index") ? s.find(sub) : s.rfind(sub);
    if (f == std::string::npos) {
      if (m == "index" || m == "rindex") throw Error("ValueError: substring not found", line);
      return Value::integer(-1);
    }
    return Value::integer(cp_index(s, f));
  }
  if (m == "count") {
    a.expect(m, 1, {});
    const std::string sub = str_arg(a.get(0, "sub"), "count", "arg", line);
    if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_decode(s).size()) + 1);
    int64_t n = 0;
    for (size_t k = s.find(sub); k != std::string::npos; k = s.find(sub, k + sub.size())) ++n;
    return Value::integer(n);
  }
  if (m == "join") {
    std::string out;
    bool first = true;
    int idx = 0;
    for (const auto& item : Builtins::iterate(a.get(0, "iterable"), line)) {
      if (!item.is_string())
        throw Error("sequence item " + std::to_string(idx) + ": expected str instance, " + type_name(item) + " found", line);
      if (!first) out += s;
      first = false;
      out += item.s;
      ++idx;
    }
    return Value::string(out);
  }
  if (m == "format") return Value::string(brace_format(s, a));
  if (m == "isdigit" || m == "isdecimal" || m == "isnumeric")
    return Value::boolean(all_chars(s, [&](UChar32 c) { return m == "isnumeric" ? u_getNumericValue(c) != U_NO_NUMERIC_VALUE : u_isdigit(c) != 0; }));
  if (m == "isalpha") return Value::boolean(all_chars(s, [](UChar32 c) { return u_isalpha(c) != 0; }));
  if (m == "isalnum") return Value::boolean(all_chars(s, [](UChar32 c) { return u_isalnum(c) != 0; }));
  if (m == "isspace") return Value::boolean(all_chars(s, [](UChar32 c) { return is_py_space(static_cast<char32_t>(c)); }));
  if (m == "islower") return Value::boolean(case_check(s, true));
  if (m == "isupper") return Value::boolean(case_check(s, false));
  if (m == "istitle") {
    // Python: upper/title-case characters only after uncased ones, lower-case only after cased ones.
    bool cased = false, previous_cased = false;
    for (char32_t c : utf8_decode(s)) {
      const auto uc = static_cast<UChar32>(c);
      if (u_isupper(uc) || u_istitle(uc)) {
        if (previous_cased) return Value::boolean(false);
        previous_cased = cased = true;
      } else if (u_islower(uc)) {
        if (!previous_cased) return Value::boolean(false);
        previous_cased = cased = true;
      } else {
        previous_cased = false;
      }
    }
    return Value::boolean(cased);
  }
  if (m == "removeprefix" || m == "removesuffix") {
    const std::string x = str_arg(a.get(0, "prefix"), m.c_str(), "arg", line);
    if (m == "removeprefix") return Value::string(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
    return Value::string(x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0 ? s.substr(0, s.size() - x.size()) : s);
  }
  if (m == "zfill") {
    const int64_t width = int_arg(a.get(0, "width"), "zfill", line);
    const int64_t len = static_cast<int64_t>(utf8_decode(s).size());
    if (width <= len) return Value::string(s);
    const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
    return Value::string((sign ? s.substr(0, 1) : "") + std::string(static_cast<size_t>(width - len), '0') + s.substr(sign ? 1 : 0));
  }
  if (m == "center" || m == "ljust" || m == "rjust") {
    const Value fill = a.get(1, "fillchar", Value::string(" "));
    return Value::string(pad(s, int_arg(a.get(0, "width"), m.c_str(), line), m == "center" ? '^' : m == "ljust" ? '<' : '>', to_str(fill)));
  }
  if (m == "partition" || m == "rpartition") {
    const std::string sep = str_arg(a.get(0, "sep"), m.c_str(), "arg", line);
    if (sep.empty()) throw Error("ValueError: empty separator", line);
    const size_t f = m == "partition" ? s.find(sep) : s.rfind(sep);
    if (f == std::string::npos)
      return m == "partition" ? Value::make_list({Value::string(s), Value::string(""), Value::string("")}, true)
                              : Value::make_list({Value::string(""), Value::string(""), Value::string(s)}, true);
    return Value::make_list({Value::string(s.substr(0, f)), Value::string(sep), Value::string(s.substr(f + sep.size()))}, true);
  }
  throw Error("internal error: str." + m, line);
}

}  // namespace

bool Builtins::has_filter(const std::string& name) { return filters().count(name) != 0; }
bool Builtins::has_test(const std::string& name) { return tests().count(name) != 0; }

Value Builtins::filter(Host& host, const std::string& name, const Value& v, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) throw Error("unsupported construct: the filter '" + name + "'", args.line);
  return it->second(host, v, args);
}

bool Builtins::test(Host& host, const std::string& name, const Value& v, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) throw Error("unsupported construct: the test '" + name + "'", args.line);
  return it->second(host, v, args);
}

Value Builtins::getattr(const Value& obj, const std::string& name, int line) {
  using K = Value::Kind;
  auto missing = [&] { return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'"); };
  switch (obj.kind) {
    case K::Undefined: undefined_error(obj, line);
    case K::Dict:
      if (is_dict_method(name) || is_unsafe_dict_method(name)) break;
      if (const Value* v = obj.dict->find(name)) return *v;
      return missing();
    case K::Namespace:
    case K::Object:
      if (const Value* v = obj.dict->find(name)) return *v;
      return missing();
    case K::String:
      if (is_str_method(name)) break;
      return missing();
    case K::List:
    case K::Tuple:
      if (obj.is_plain_sequence() && (is_list_method(name) || is_unsafe_list_method(name))) break;
      return missing();
    default: return missing();
  }
  if ((obj.kind == K::Dict && is_unsafe_dict_method(name)) || (obj.is_sequence() && is_unsafe_list_method(name)))
    return unsafe(obj, name);
  // A bound method, for templates that store or pass it instead of calling it at once.
  return Value::callable(type_name(obj) + "." + name, [obj, name](CallArgs& a) {
    struct NoHost : Host {
      Value call(const Value&, CallArgs& args) override { throw Error("internal error: no host", args.line); }
    } host;
    Value result;
    call_method(host, obj, name, a, result);
    return result;
  });
}

Value Builtins::getitem(const Value& obj, const Value& key, int line) {
  using K = Value::Kind;
  if (obj.is_sequence() && !obj.is_plain_sequence())  // jinja2 turns the TypeError into Undefined
    return Value::undefined("'" + type_name(obj) + "' object is not subscriptable");
  switch (obj.kind) {
    case K::Undefined: undefined_error(obj, line);
    case K::List:
    case K::Tuple:
    case K::String:
      if (key.kind == K::Int || key.kind == K::Bool) {
        int64_t i = key.kind == K::Bool ? key.b : key.i;
        if (obj.kind == K::String) {
          const std::u32string u = utf8_decode(obj.s);
          const int64_t n = static_cast<int64_t>(u.size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return Value::undefined("string index out of range");
          return Value::string(utf8_encode(u[static_cast<size_t>(i)]));
        }
        const int64_t n = static_cast<int64_t>(obj.list->size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined(type_name(obj) + " object has no element " + std::to_string(key.i));
        return (*obj.list)[static_cast<size_t>(i)];
      }
      break;
    case K::Dict:
    case K::Namespace:
    case K::Object:
      if (key.is_string() || obj.kind == K::Dict)
        if (const Value* v = obj.dict->find(dict_key(key, line))) return *v;
      break;
    default: break;
  }
  if (key.is_string()) return getattr(obj, key.s, line);
  return Value::undefined("'" + type_name(obj) + " object' has no item " + repr(key));
}

Value Builtins::slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v, int line) {
  if (obj.is_undefined()) undefined_error(obj, line);
  auto idx = [&](const Value& v, int64_t fallback) {
    if (v.is_none()) return fallback;
    if (v.kind == Value::Kind::Int) return v.i;
    if (v.kind == Value::Kind::Bool) return static_cast<int64_t>(v.b);
    throw Error("slice indices must be integers or None", line);
  };
  const int64_t step = idx(step_v, 1);
  if (step == 0) throw Error("slice step cannot be zero", line);
  std::u32string u;
  int64_t n;
  if (obj.is_string()) {
    u = utf8_decode(obj.s);
    n = static_cast<int64_t>(u.size());
  } else if (obj.is_plain_sequence()) {
    n = static_cast<int64_t>(obj.list->size());
  } else {
    return Value::undefined("'" + type_name(obj) + "' object is not subscriptable");
  }
  auto adjust = [&](const Value& v, bool is_start) {
    if (v.is_none()) return step < 0 ? (is_start ? n - 1 : -1) : (is_start ? 0 : n);
    int64_t x = idx(v, 0);
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t start = adjust(start_v, true), stop = adjust(stop_v, false);
  std::vector<int64_t> picks;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(i);
  if (obj.is_string()) {
    std::u32string out;
    for (int64_t i : picks) out += u[static_cast<size_t>(i)];
    return Value::string(utf8_encode(out));
  }
  List out;
  for (int64_t i : picks) out.push_back((*obj.list)[static_cast<size_t>(i)]);
  return Value::make_list(std::move(out), obj.kind == Value::Kind::Tuple);
}

bool Builtins::call_method(Host&, const Value& obj, const std::string& name, CallArgs& a, Value& result) {
  using K = Value::Kind;
  if (obj.kind == K::String && is_str_method(name)) {
    result = str_method(obj.s, name, a);
    if (result.is_string()) result.markup = obj.markup;
    return true;
  }
  if (obj.kind == K::Dict && is_dict_method(name)) {
    if (name == "get") {
      a.expect("get", 2, {});
      const Value* v = obj.dict->find(dict_key(a.get(0, "key"), a.line));
      result = v ? *v : a.get(1, "default", Value::none());
    } else if (name == "copy") {
      result = Value::make_dict(*obj.dict);
    } else {
      List items;
      for (const auto& kv : obj.dict->items) {
        if (name == "items") items.push_back(Value::make_list({key_value(kv.first), kv.second}, true));
        else if (name == "keys") items.push_back(key_value(kv.first));
        else items.push_back(kv.second);
      }
      result = Value::make_view(std::move(items), name == "items"  ? Value::View::DictItems
                                                  : name == "keys" ? Value::View::DictKeys
                                                                   : Value::View::DictValues);
    }
    return true;
  }
  if (obj.is_plain_sequence() && is_list_method(name)) {
    if (name == "copy") {
      result = Value::make_list(*obj.list, obj.kind == K::Tuple);
      return true;
    }
    const Value x = a.get(0, "value");
    int64_t n = 0, first = -1;
    for (size_t k = 0; k < obj.list->size(); ++k)
      if (equal((*obj.list)[k], x)) {
        if (first < 0) first = static_cast<int64_t>(k);
        ++n;
      }
    if (name == "index" && first < 0) throw Error("ValueError: " + repr(x) + " is not in list", a.line);
    result = Value::integer(name == "index" ? first : n);
    return true;
  }
  if ((obj.kind == K::Dict && is_unsafe_dict_method(name)) || (obj.is_sequence() && is_unsafe_list_method(name)))
    undefined_error(unsafe(obj, name), a.line);
  return false;
}

std::vector<Value> Builtins::iterate(const Value& v, int line) {
  switch (v.kind) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List:
    case Value::Kind::Tuple: return *v.list;
    case Value::Kind::String: {
      std::vector<Value> out;
      for (char32_t c : utf8_decode(v.s)) out.push_back(Value::string(utf8_encode(c)));
      return out;
    }
    case Value::Kind::Dict: {
      std::vector<Value> out;
      for (const auto& kv : v.dict->items) out.push_back(key_value(kv.first));
      return out;
    }
    default: throw Error("'" + type_name(v) + "' object is not iterable", line);
  }
}

bool Builtins::contains(const Value& container, const Value& item, int line) {
  switch (container.kind) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (!item.is_string())
        throw Error("'in <string>' requires string as left operand, not " + type_name(item), line);
      return container.s.find(item.s) != std::string::npos;
    case Value::Kind::List:
    case Value::Kind::Tuple:
      return std::any_of(container.list->begin(), container.list->end(), [&](const Value& x) { return equal(x, item); });
    case Value::Kind::Dict: return container.dict->find(dict_key(item, line)) != nullptr;
    default: throw Error("argument of type '" + type_name(container) + "' is not iterable", line);
  }
}

Value Builtins::arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  using K = Value::Kind;
  auto type_error = [&]() -> Value {
    if (op == "+" && a.is_string())
      throw Error("can only concatenate str (not \"" + type_name(b) + "\") to str", line);
    if (op == "+" && a.kind == K::List)
      throw Error("can only concatenate list (not \"" + type_name(b) + "\") to list", line);
    throw Error("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'", line);
  };
  const bool ints = (a.kind == K::Int || a.kind == K::Bool) && (b.kind == K::Int || b.kind == K::Bool);
  const int64_t x = a.kind == K::Bool ? a.b : a.i, y = b.kind == K::Bool ? b.b : b.i;
  const bool nums = a.is_number() && b.is_number();
  // Python's integers are unbounded; ours are 64-bit, so an overflow is refused, not wrapped.
  int64_t r = 0;
  auto checked = [&](bool overflow) {  // r holds the result of the checked operation
    if (overflow) throw Error("unsupported: integer result of " + op + " beyond 64 bits", line);
    return Value::integer(r);
  };
  if (op == "+") {
    if (ints) return checked(__builtin_add_overflow(x, y, &r));
    if (nums) return Value::number(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      if (!a.markup && !b.markup) return Value::string(a.s + b.s);
      return markup((a.markup ? a.s : html_escape(a.s)) + (b.markup ? b.s : html_escape(b.s)));
    }
    if (a.is_plain_sequence() && b.is_plain_sequence() && a.kind == b.kind) {
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(items), a.kind == K::Tuple);
    }
    return type_error();
  }
  if (op == "-") {
    if (ints) return checked(__builtin_sub_overflow(x, y, &r));
    if (nums) return Value::number(a.as_double() - b.as_double());
    return type_error();
  }
  if (op == "*") {
    if (ints) return checked(__builtin_mul_overflow(x, y, &r));
    if (nums) return Value::number(a.as_double() * b.as_double());
    const Value* seq = (a.is_string() || a.is_plain_sequence()) ? &a : (b.is_string() || b.is_plain_sequence()) ? &b : nullptr;
    const Value* count = seq == &a ? &b : &a;
    if (seq && (count->kind == K::Int || count->kind == K::Bool)) {
      const int64_t n = count->kind == K::Bool ? count->b : count->i;
      const size_t unit = seq->is_string() ? seq->s.size() : seq->list->size();
      if (n > 0 && unit > 0 && static_cast<uint64_t>(n) > (uint64_t{1} << 30) / unit)
        throw Error("unsupported: a repetition of more than 2^30 items or bytes", line);
      if (seq->is_string()) {
        std::string out;
        for (int64_t k = 0; k < n; ++k) out += seq->s;
        return Value::string(out);
      }
      List items;
      for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
      return Value::make_list(std::move(items), seq->kind == K::Tuple);
    }
    return type_error();
  }
  if (op == "/") {
    if (!nums) return type_error();
    if (b.as_double() == 0) throw Error("ZeroDivisionError: division by zero", line);
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return Value::string(percent_format(a.s, b, line));
    if (!nums) return type_error();
    if (b.as_double() == 0) throw Error("ZeroDivisionError: integer division or modulo by zero", line);
    if (ints) return Value::integer(op == "//" ? floor_div(x, y) : x - floor_div(x, y) * y);
    const double p = a.as_double(), q = b.as_double();
    double mod = std::fmod(p, q);
    if (mod != 0 && ((q < 0) != (mod < 0))) mod += q;
    if (op == "%") return Value::number(mod);
    // CPython's float floor division: the exact quotient of (a - a mod b) by b, rounded to nearest.
    const double div = (p - mod) / q;
    double fl = std::floor(div);
    if (div - fl > 0.5) fl += 1.0;
    return Value::number(div == 0 ? std::copysign(0.0, p / q) : fl);
  }
  if (op == "**") {
    if (ints && y >= 0) {
      int64_t base = x, result = 1, e = y;
      while (e > 0) {  // square and multiply, refusing overflow
        if ((e & 1) && __builtin_mul_overflow(result, base, &result)) return checked(true);
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) return checked(true);
      }
      return Value::integer(result);
    }
    if (nums) return Value::number(std::pow(a.as_double(), b.as_double()));
    return type_error();
  }
  throw Error("internal error: operator " + op, line);
}

}  // namespace trainrun::text::jinja
