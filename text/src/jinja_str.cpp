// Python's str operations and builtin argument checks shared by the builtins (jinja_str.hpp).
#include "jinja_str.hpp"

#include <unicode/uchar.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "jinja_budget.hpp"

namespace trainrun::text::jinja {
namespace {

std::u32string strip_set(const Value& chars, int line, const char* fn) {
  if (chars.is_none() || chars.is_undefined()) return U"";
  return utf8_decode(str_arg(chars, fn, "arg", line));
}

// One %-conversion of `arg`, its type character, flags, width and precision parsed.
std::string format_conversion(char type, const std::string& flags, const std::string& width,
                              const std::string& prec, const Value& arg, int line) {
  char buf[512];
  const std::string spec = "%" + flags + width + prec;
  // A width or precision is a size the template chooses: bounded by the budget for strings, and
  // by the buffer for numbers (snprintf would cut longer ones, after formatting all of them).
  const uint64_t w = width.empty() ? 0 : std::strtoull(width.c_str(), nullptr, 10);
  const uint64_t p = prec.size() > 1 ? std::strtoull(prec.c_str() + 1, nullptr, 10) : 0;
  check_fits(std::max(w, p), line);
  if (type != 's' && type != 'r' && type != 'a' && std::max(w, p) > 400)
    throw Error("unsupported: a %-format width or precision over 400 for a number", line);
  if (type == 's' || type == 'r' || type == 'a') {
    std::string text = type == 's' ? to_str(arg) : repr(arg);
    if (prec.size() > 1)
      text = utf8_encode(utf8_decode(text).substr(0, std::stoul(prec.substr(1))));
    return width.empty()
               ? text
               : pad(text, std::stoll(width), flags.find('-') != std::string::npos ? '<' : '>');
  }
  if (std::string("diuxXoc").find(type) != std::string::npos) {
    if (!arg.is_number())
      throw Error(std::string("%") + type + " format: a number is required, not " + type_name(arg),
                  line);
    const long long x = arg.kind == Value::Kind::Float
                            ? static_cast<long long>(arg.f)
                            : (arg.kind == Value::Kind::Bool ? arg.b : arg.i);
    if (type == 'c') return utf8_encode(static_cast<char32_t>(x));
    std::snprintf(buf, sizeof buf,
                  (spec + "ll" + (type == 'i' || type == 'u' ? 'd' : type)).c_str(), x);
    return buf;
  }
  if (std::string("eEfFgG").find(type) != std::string::npos) {
    if (!arg.is_number())
      throw Error(
          std::string("%") + type + " format: a real number is required, not " + type_name(arg),
          line);
    std::snprintf(buf, sizeof buf, (spec + type).c_str(), arg.as_double());
    return buf;
  }
  throw Error(std::string("unsupported format character '") + type + "'", line);
}

}  // namespace

std::string str_arg(const Value& v, const char* fn, const char* what, int line) {
  if (!v.is_string())
    throw Error(std::string(fn) + "() " + what + " must be str, not " + type_name(v), line);
  return v.s;
}

int64_t int_arg(const Value& v, const char* fn, int line) {
  if (v.kind == Value::Kind::Int) return v.i;
  if (v.kind == Value::Kind::Bool) return v.b;
  throw Error(
      std::string(fn) + "(): '" + type_name(v) + "' object cannot be interpreted as an integer",
      line);
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right, int line,
                     const char* fn) {
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

std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> out;
  const std::u32string u = utf8_decode(s);
  size_t b = 0;
  for (size_t k = 0; k < u.size(); ++k) {
    const char32_t c = u[k];
    const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
                     c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
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

std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character
    const std::u32string u = utf8_decode(s);
    int64_t n = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
        check_fits(out.size(), 0);
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
    check_fits(out.size(), 0);
    k = f + from.size();
    ++n;
  }
  return out + s.substr(k);
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

std::string pad(const std::string& s, int64_t width, char align, const std::string& fill) {
  const int64_t len = static_cast<int64_t>(utf8_decode(s).size());
  if (width <= len) return s;
  const int64_t total = width - len;
  check_fits(saturating_mul(static_cast<uint64_t>(total), fill.size()) + s.size(), 0);
  int64_t left = 0;
  if (align == '>')
    left = total;
  else if (align == '^')
    left = total / 2 + (total & width & 1);  // CPython's centre rounding
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
  if (args.kind == Value::Kind::Tuple)
    pos = *args.list;
  else if (args.kind == Value::Kind::Dict)
    mapping = args.dict.get(), pos.push_back(args);
  else
    pos.push_back(args);
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
    while (k < fmt.size() && std::string("-+ 0#").find(fmt[k]) != std::string::npos)
      flags += fmt[k++];
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
      if (mapping)
        arg = &pos[0];
      else if (next < pos.size())
        arg = &pos[next++];
      else
        throw Error("not enough arguments for format string", line);
    }
    out += format_conversion(type, flags, width, prec, *arg, line);
  }
  if (!mapping && next < pos.size())
    throw Error("not all arguments converted during string formatting", line);
  return out;
}

std::string html_escape(const std::string& s) {
  // Each of the five characters becomes up to 5 bytes: check the result's size before building it.
  uint64_t size = s.size();
  for (char c : s) size += (c == '&' || c == '<' || c == '>' || c == '"' || c == '\'') ? 4 : 0;
  check_fits(size, 0);
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// markupsafe.Markup: jinja2's |safe and |escape return it; `+` escapes a plain str joined to it.
Value markup(std::string s) {
  Value v = Value::string(std::move(s));
  v.markup = true;
  return v;
}

}  // namespace trainrun::text::jinja
