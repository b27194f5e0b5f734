// Python's str methods in chat templates (`s.strip()`, `s.split(',')`, ...), as CPython 3 has
// them; each takes the method's name for its error messages, as CPython words them.
#include <unicode/uchar.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "jinja_budget.hpp"
#include "jinja_builtins.hpp"
#include "jinja_str.hpp"

namespace trainrun::text::jinja {
namespace {

using Args = CallArgs;

std::vector<std::string> py_split(const std::string& s, const Value& sep, int64_t maxsplit,
                                  int line) {
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
    const size_t f = (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit)
                         ? std::string::npos
                         : s.find(d, k);
    if (f == std::string::npos) {
      out.push_back(s.substr(k));
      return out;
    }
    out.push_back(s.substr(k, f - k));
    k = f + d.size();
  }
}

std::vector<std::string> py_rsplit(const std::string& s, const Value& sep, int64_t maxsplit,
                                   int line) {
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
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
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

// str.format with automatic or explicit fields, keyword fields, !r/!s and no format specs.
std::string brace_format(const std::string& fmt, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    const char c = fmt[k];
    if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}')
        ++k;
      else
        throw Error("Single '}' encountered in format string", a.line);
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
      if (auto_index >= a.pos.size())
        throw Error("Replacement index " + std::to_string(auto_index) + " out of range", a.line);
      v = a.pos[auto_index++];
    } else if (std::all_of(field.begin(), field.end(),
                           [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); })) {
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

// ---- the methods ----

Value strip_method(const std::string& s, const std::string& m, Args& a) {
  a.expect(m, 1, {});
  return Value::string(py_strip(s, a.get(0, "chars", Value::none()), m != "rstrip", m != "lstrip",
                                a.line, m.c_str()));
}

Value split_method(const std::string& s, const std::string& m, Args& a) {
  const int line = a.line;
  a.expect(m, 2, {"sep", "maxsplit"});
  const Value maxsplit = a.get(1, "maxsplit", Value::integer(-1));
  const int64_t n = int_arg(maxsplit, m.c_str(), line);
  return str_list(m == "split" ? py_split(s, a.get(0, "sep", Value::none()), n, line)
                               : py_rsplit(s, a.get(0, "sep", Value::none()), n, line));
}

Value splitlines_method(const std::string& s, const std::string&, Args& a) {
  return str_list(py_splitlines(s, a.get(0, "keepends", Value::boolean(false)).truthy()));
}

Value affix_method(const std::string& s, const std::string& m, Args& a) {
  a.expect(m, 1, {});
  return Value::boolean(affix_match(s, a.get(0, "prefix"), m == "startswith", a.line));
}

Value replace_method(const std::string& s, const std::string& m, Args& a) {
  const int line = a.line;
  a.expect(m, 3, {"count"});
  const Value count = a.get(2, "count", Value::integer(-1));
  return Value::string(py_replace(s, str_arg(a.get(0, "old"), "replace", "arg 1", line),
                                  str_arg(a.get(1, "new"), "replace", "arg 2", line),
                                  int_arg(count, "replace", line)));
}

Value swapcase_method(const std::string& s, const std::string&, Args&) {
  std::string out;
  for (char32_t c : utf8_decode(s)) {
    const auto uc = static_cast<UChar32>(c);
    out += utf8_encode(static_cast<char32_t>(u_isupper(uc)   ? u_tolower(uc)
                                             : u_islower(uc) ? u_toupper(uc)
                                                             : uc));
  }
  return Value::string(out);
}

Value find_method(const std::string& s, const std::string& m, Args& a) {
  const int line = a.line;
  a.expect(m, 1, {});
  const std::string sub = str_arg(a.get(0, "sub"), m.c_str(), "arg", line);
  const size_t f = (m == "find" || m == "index") ? s.find(sub) : s.rfind(sub);
  if (f == std::string::npos) {
    if (m == "index" || m == "rindex") throw Error("ValueError: substring not found", line);
    return Value::integer(-1);
  }
  return Value::integer(cp_index(s, f));
}

Value count_method(const std::string& s, const std::string& m, Args& a) {
  a.expect(m, 1, {});
  const std::string sub = str_arg(a.get(0, "sub"), "count", "arg", a.line);
  if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_decode(s).size()) + 1);
  int64_t n = 0;
  for (size_t k = s.find(sub); k != std::string::npos; k = s.find(sub, k + sub.size())) ++n;
  return Value::integer(n);
}

Value join_method(const std::string& s, const std::string&, Args& a) {
  const int line = a.line;
  std::string out;
  bool first = true;
  int idx = 0;
  for (const auto& item : Builtins::iterate(a.get(0, "iterable"), line)) {
    if (!item.is_string())
      throw Error("sequence item " + std::to_string(idx) + ": expected str instance, " +
                      type_name(item) + " found",
                  line);
    if (!first) out += s;
    first = false;
    out += item.s;
    check_fits(out.size(), line);  // a long separator repeats once per item
    ++idx;
  }
  return Value::string(out);
}

Value isdigit_method(const std::string& s, const std::string& m, Args&) {
  return Value::boolean(all_chars(s, [&](UChar32 c) {
    return m == "isnumeric" ? u_getNumericValue(c) != U_NO_NUMERIC_VALUE : u_isdigit(c) != 0;
  }));
}

// Python: upper/title-case characters only after uncased ones, lower-case only after cased ones.
Value istitle_method(const std::string& s, const std::string&, Args&) {
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

Value removeaffix_method(const std::string& s, const std::string& m, Args& a) {
  const std::string x = str_arg(a.get(0, "prefix"), m.c_str(), "arg", a.line);
  if (m == "removeprefix")
    return Value::string(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
  return Value::string(x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0
                           ? s.substr(0, s.size() - x.size())
                           : s);
}

Value zfill_method(const std::string& s, const std::string&, Args& a) {
  const int64_t width = int_arg(a.get(0, "width"), "zfill", a.line);
  const int64_t len = static_cast<int64_t>(utf8_decode(s).size());
  if (width <= len) return Value::string(s);
  const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
  return Value::string((sign ? s.substr(0, 1) : "") +
                       std::string(static_cast<size_t>(width - len), '0') + s.substr(sign ? 1 : 0));
}

Value justify_method(const std::string& s, const std::string& m, Args& a) {
  const Value fill = a.get(1, "fillchar", Value::string(" "));
  return Value::string(pad(s, int_arg(a.get(0, "width"), m.c_str(), a.line),
                           m == "center"  ? '^'
                           : m == "ljust" ? '<'
                                          : '>',
                           to_str(fill)));
}

Value partition_method(const std::string& s, const std::string& m, Args& a) {
  const std::string sep = str_arg(a.get(0, "sep"), m.c_str(), "arg", a.line);
  if (sep.empty()) throw Error("ValueError: empty separator", a.line);
  const size_t f = m == "partition" ? s.find(sep) : s.rfind(sep);
  if (f == std::string::npos)
    return m == "partition"
               ? Value::make_list({Value::string(s), Value::string(""), Value::string("")}, true)
               : Value::make_list({Value::string(""), Value::string(""), Value::string(s)}, true);
  return Value::make_list(
      {Value::string(s.substr(0, f)), Value::string(sep), Value::string(s.substr(f + sep.size()))},
      true);
}

// The methods that are one call each: case mappings, character classes, str.format.
Value upper_method(const std::string& s, const std::string&, Args&) {
  return Value::string(to_upper(s));
}
Value lower_method(const std::string& s, const std::string&, Args&) {
  return Value::string(to_lower(s));
}
Value title_method(const std::string& s, const std::string&, Args&) {
  return Value::string(to_title(s));
}
Value capitalize_method(const std::string& s, const std::string&, Args&) {
  return Value::string(to_capitalize(s));
}
Value isalpha_method(const std::string& s, const std::string&, Args&) {
  return Value::boolean(all_chars(s, [](UChar32 c) { return u_isalpha(c) != 0; }));
}
Value isalnum_method(const std::string& s, const std::string&, Args&) {
  return Value::boolean(all_chars(s, [](UChar32 c) { return u_isalnum(c) != 0; }));
}
Value isspace_method(const std::string& s, const std::string&, Args&) {
  return Value::boolean(
      all_chars(s, [](UChar32 c) { return is_py_space(static_cast<char32_t>(c)); }));
}
Value islower_method(const std::string& s, const std::string&, Args&) {
  return Value::boolean(case_check(s, true));
}
Value isupper_method(const std::string& s, const std::string&, Args&) {
  return Value::boolean(case_check(s, false));
}
Value format_method(const std::string& s, const std::string&, Args& a) {
  return Value::string(brace_format(s, a));
}

using StrMethod = Value (*)(const std::string& s, const std::string& name, Args& a);

const std::map<std::string, StrMethod>& str_methods() {
  static const std::map<std::string, StrMethod> table = {{"strip", strip_method},
                                                         {"lstrip", strip_method},
                                                         {"rstrip", strip_method},
                                                         {"split", split_method},
                                                         {"rsplit", split_method},
                                                         {"splitlines", splitlines_method},
                                                         {"startswith", affix_method},
                                                         {"endswith", affix_method},
                                                         {"replace", replace_method},
                                                         {"upper", upper_method},
                                                         {"lower", lower_method},
                                                         {"title", title_method},
                                                         {"capitalize", capitalize_method},
                                                         {"swapcase", swapcase_method},
                                                         {"find", find_method},
                                                         {"rfind", find_method},
                                                         {"index", find_method},
                                                         {"rindex", find_method},
                                                         {"count", count_method},
                                                         {"join", join_method},
                                                         {"format", format_method},
                                                         {"isdigit", isdigit_method},
                                                         {"isdecimal", isdigit_method},
                                                         {"isnumeric", isdigit_method},
                                                         {"isalpha", isalpha_method},
                                                         {"isalnum", isalnum_method},
                                                         {"isspace", isspace_method},
                                                         {"islower", islower_method},
                                                         {"isupper", isupper_method},
                                                         {"istitle", istitle_method},
                                                         {"removeprefix", removeaffix_method},
                                                         {"removesuffix", removeaffix_method},
                                                         {"zfill", zfill_method},
                                                         {"center", justify_method},
                                                         {"ljust", justify_method},
                                                         {"rjust", justify_method},
                                                         {"partition", partition_method},
                                                         {"rpartition", partition_method}};
  return table;
}

}  // namespace

bool is_str_method(const std::string& name) { return str_methods().count(name) != 0; }

Value str_method(const std::string& s, const std::string& name, CallArgs& args) {
  const auto it = str_methods().find(name);
  if (it == str_methods().end()) throw Error("internal error: str." + name, args.line);
  return it->second(s, name, args);
}

}  // namespace trainrun::text::jinja
