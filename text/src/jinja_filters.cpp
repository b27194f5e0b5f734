// Jinja2's builtin filters (`x|trim`, `xs|map(attribute='a')|join(', ')`), as jinja2 3.1's
// filters.py has them, over the engine's values; registered by kind of value they work on.
#include <unicode/uchar.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>

#include "jinja_budget.hpp"
#include "jinja_builtins.hpp"
#include "jinja_str.hpp"

namespace trainrun::text::jinja {
namespace {

using Args = CallArgs;
using FilterFn = std::function<Value(Builtins::Host&, const Value&, Args&)>;
using FilterTable = std::map<std::string, FilterFn>;

Value attr_path(const Value& item, const Value& attribute, int line) {
  if (attribute.kind == Value::Kind::Int) return Builtins::getitem(item, attribute, line);
  Value v = item;
  const std::string path = to_str(attribute);
  size_t b = 0;
  while (true) {
    const size_t dot = path.find('.', b);
    const std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    v = Builtins::getitem(v, digits ? Value::integer(std::stoll(part)) : Value::string(part), line);
    if (dot == std::string::npos) return v;
    b = dot + 1;
  }
}

// A str method or filter applied to a Markup returns a Markup.
Value same_kind(const Value& original, std::string s) {
  Value v = Value::string(std::move(s));
  v.markup = original.is_string() && original.markup;
  return v;
}

Value lower_if_str(const Value& v) { return v.is_string() ? Value::string(to_lower(v.s)) : v; }

std::function<Value(const Value&)> key_getter(const Value& attribute, bool case_sensitive,
                                              int line) {
  return [attribute, case_sensitive, line](const Value& item) {
    Value k =
        attribute.is_none() || attribute.is_undefined() ? item : attr_path(item, attribute, line);
    return case_sensitive ? k : lower_if_str(k);
  };
}

Value min_max(const Value& v, const Args& a, bool want_max) {
  const auto items = Builtins::iterate(v, a.line);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const auto key = key_getter(a.get(1, "attribute", Value::none()),
                              a.get(0, "case_sensitive", Value::boolean(false)).truthy(), a.line);
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

Value sum_values(const Value& a, const Value& b, int line) {
  return Builtins::arithmetic("+", a, b, line);
}

// jinja2's title filter: each word (split at runs of -, whitespace, (, {, [, <) gets its first
// character upper-cased and the rest lower-cased.
std::string jinja_title(const std::string& s) {
  const std::u32string u = utf8_decode(s);
  auto sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_py_space(c);
  };
  std::string out;
  size_t k = 0;
  while (k < u.size()) {
    size_t e = k;
    const bool is_sep = sep(u[k]);
    while (e < u.size() && sep(u[e]) == is_sep) ++e;
    const std::string chunk = utf8_encode(u.substr(k, e - k));
    if (is_sep)
      out += chunk;
    else
      out += to_upper(utf8_encode(u[k])) + to_lower(utf8_encode(u.substr(k + 1, e - k - 1)));
    k = e;
  }
  return out;
}

Value to_int(const Value& v, const Value& fallback, int64_t base, int line) {
  switch (v.kind) {
    case Value::Kind::Int:
      return v;
    case Value::Kind::Bool:
      return Value::integer(v.b);
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
    default:
      return fallback;
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
  return Value::number(
      (method == "ceil" ? std::ceil(v.as_double() * p) : std::floor(v.as_double() * p)) / p);
}

std::string indent_filter(std::string s, const Value& width, bool first, bool blank) {
  if (!width.is_string()) check_fits(static_cast<uint64_t>(std::max<int64_t>(width.i, 0)), 0);
  const std::string ind =
      width.is_string() ? width.s
                        : std::string(static_cast<size_t>(std::max<int64_t>(width.i, 0)), ' ');
  s += "\n";  // jinja2's quirk for splitlines
  const auto lines = py_splitlines(s, false);
  check_fits(saturating_mul(ind.size(), lines.size() + 1) + s.size(), 0);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + ind : "") + lines[k];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
  }
  return first ? ind + rv : rv;
}

// The arguments after the first `k` positionals: what map() and select() pass on to the filter or
// test they apply.
Args args_after(const Args& a, size_t k) {
  Args rest;
  rest.line = a.line;
  rest.pos.assign(a.pos.begin() + static_cast<long>(std::min(k, a.pos.size())), a.pos.end());
  rest.kw = a.kw;
  return rest;
}

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
  Args test_args = args_after(a, k);
  if (!test_name.empty() && !Builtins::has_test(test_name))
    throw Error("unsupported construct: the test '" + test_name + "'", a.line);
  List out;
  if (!v.truthy())
    return Value::make_view({}, Value::View::Generator);  // jinja2: `if value:` first
  for (const auto& item : Builtins::iterate(v, a.line)) {
    const Value probe = by_attr ? attr_path(item, attribute, a.line) : item;
    const bool ok =
        test_name.empty() ? probe.truthy() : Builtins::test(host, test_name, probe, test_args);
    if (ok == keep_if) out.push_back(item);
  }
  return Value::make_view(std::move(out), Value::View::Generator);
}

Value map_filter(Builtins::Host& host, const Value& v, Args& a) {
  List out;
  const auto items =
      v.truthy() ? Builtins::iterate(v, a.line) : std::vector<Value>{};  // jinja2: `if value:`
  if (a.pos.empty()) {
    Value attribute;
    Value fallback = Value::none();
    for (const auto& kw : a.kw) {
      if (kw.first == "attribute")
        attribute = kw.second;
      else if (kw.first == "default")
        fallback = kw.second;
      else
        throw Error("map(): unexpected keyword argument '" + kw.first + "'", a.line);
    }
    if (attribute.is_undefined()) throw Error("map(): needs a filter name or attribute=", a.line);
    for (const auto& item : items) {
      Value x = attr_path(item, attribute, a.line);
      out.push_back(x.is_undefined() && !fallback.is_none() ? fallback : x);
    }
    return Value::make_view(std::move(out), Value::View::Generator);
  }
  const std::string name = str_arg(a.pos[0], "map", "filter name", a.line);
  if (!Builtins::has_filter(name))
    throw Error("unsupported construct: the filter '" + name + "'", a.line);
  Args rest = args_after(a, 1);
  for (const auto& item : items) out.push_back(Builtins::filter(host, name, item, rest));
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

// Filters of any value: conversions, defaults, attribute access.
void add_value_filters(FilterTable& f) {
  f["abs"] = [](auto&, const Value& v, Args& a) {
    if (v.kind == Value::Kind::Float) return Value::number(std::fabs(v.f));
    if (v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool)
      return Value::integer(std::llabs(v.kind == Value::Kind::Bool ? v.b : v.i));
    throw Error("bad operand type for abs(): '" + type_name(v) + "'", a.line);
  };
  f["attr"] = [](auto&, const Value& v, Args& a) {
    return Builtins::getattr(v, to_str(a.get(0, "name")), a.line);
  };
  f["default"] = [](auto&, const Value& v, Args& a) {
    const bool boolean = a.get(1, "boolean", Value::boolean(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy()))
      return a.get(0, "default_value", Value::string(""));
    return v;
  };
  f["d"] = f["default"];
  f["float"] = [](auto&, const Value& v, Args& a) {
    return to_float(v, a.get(0, "default", Value::number(0.0)), a.line);
  };
  f["int"] = [](auto&, const Value& v, Args& a) {
    return to_int(v, a.get(0, "default", Value::integer(0)),
                  int_arg(a.get(1, "base", Value::integer(10)), "int", a.line), a.line);
  };
  f["round"] = [](auto&, const Value& v, Args& a) {
    return py_round(v, int_arg(a.get(0, "precision", Value::integer(0)), "round", a.line),
                    to_str(a.get(1, "method", Value::string("common"))), a.line);
  };
  f["string"] = [](auto&, const Value& v, Args&) { return Value::string(to_str(v)); };
  f["tojson"] = [](auto&, const Value& v, Args& a) { return tojson_filter(v, a); };
}

// Filters of str: case, layout, escaping, formatting.
void add_text_filters(FilterTable& f) {
  f["capitalize"] = [](auto&, const Value& v, Args&) {
    return same_kind(v, to_capitalize(to_str(v)));
  };
  f["center"] = [](auto&, const Value& v, Args& a) {
    return Value::string(
        pad(to_str(v), int_arg(a.get(0, "width", Value::integer(80)), "center", a.line), '^'));
  };
  f["escape"] = [](auto&, const Value& v, Args&) {
    if (v.is_string() && v.markup) return v;
    return markup(html_escape(to_str(v)));
  };
  f["e"] = f["escape"];
  f["forceescape"] = [](auto&, const Value& v, Args&) { return markup(html_escape(to_str(v))); };
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
    return Value::string(indent_filter(to_str(v), width,
                                       a.get(1, "first", Value::boolean(false)).truthy(),
                                       a.get(2, "blank", Value::boolean(false)).truthy()));
  };
  f["lower"] = [](auto&, const Value& v, Args&) { return same_kind(v, to_lower(to_str(v))); };
  f["replace"] = [](auto&, const Value& v, Args& a) {
    const Value count = a.get(2, "count", Value::none());
    return Value::string(py_replace(to_str(v), to_str(a.get(0, "old")), to_str(a.get(1, "new")),
                                    count.is_none() ? -1 : int_arg(count, "replace", a.line)));
  };
  f["safe"] = [](auto&, const Value& v, Args&) { return markup(to_str(v)); };
  f["title"] = [](auto&, const Value& v, Args&) { return Value::string(jinja_title(to_str(v))); };
  f["trim"] = [](auto&, const Value& v, Args& a) {
    return same_kind(v, py_strip(to_str(v), a.get(0, "chars", Value::none()), true, true, a.line));
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
}

// Filters of an iterable as a whole: its items, length, ends, join, sum, extremes, reversal.
void add_sequence_filters(FilterTable& f) {
  f["first"] = [](auto&, const Value& v, Args& a) {
    const auto items = Builtins::iterate(v, a.line);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  };
  f["last"] = [](auto&, const Value& v, Args& a) {
    if (v.is_undefined()) undefined_error(v, a.line);
    if (v.is_iterator()) throw Error("'" + type_name(v) + "' object is not reversible", a.line);
    const auto items = Builtins::iterate(v, a.line);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  };
  f["items"] = [](auto&, const Value& v, Args& a) {
    if (v.is_undefined()) return Value::make_list();
    if (v.kind != Value::Kind::Dict)
      throw Error("items(): can only get item pairs from a mapping, not " + type_name(v), a.line);
    List items;
    for (const auto& kv : v.dict->items)
      items.push_back(Value::make_list({key_value(kv.first), kv.second}, true));
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
      check_fits(out.size(), a.line);  // a long separator repeats once per item
    }
    return Value::string(out);
  };
  f["length"] = [](auto&, const Value& v, Args& a) {
    switch (v.kind) {
      case Value::Kind::Undefined:
        return Value::integer(0);
      case Value::Kind::String:
        return Value::integer(static_cast<int64_t>(utf8_decode(v.s).size()));
      case Value::Kind::List:
      case Value::Kind::Tuple:
        if (v.is_iterator())
          throw Error("object of type '" + type_name(v) + "' has no len()", a.line);
        return Value::integer(static_cast<int64_t>(v.list->size()));
      case Value::Kind::Dict:
        return Value::integer(static_cast<int64_t>(v.dict->items.size()));
      default:
        throw Error("object of type '" + type_name(v) + "' has no len()", a.line);
    }
  };
  f["count"] = f["length"];
  f["list"] = [](auto&, const Value& v, Args& a) {
    return Value::make_list(Builtins::iterate(v, a.line));
  };
  f["max"] = [](auto&, const Value& v, Args& a) { return min_max(v, a, true); };
  f["min"] = [](auto&, const Value& v, Args& a) { return min_max(v, a, false); };
  f["reverse"] = [](auto&, const Value& v, Args& a) {
    if (v.is_string()) {
      std::u32string u = utf8_decode(v.s);
      std::reverse(u.begin(), u.end());
      return Value::string(utf8_encode(u));
    }
    auto items = Builtins::iterate(v, a.line);
    std::reverse(items.begin(), items.end());
    // reversed() of a list or dict is an iterator; a generator is listed and reversed
    return v.is_iterator() ? Value::make_list(std::move(items))
                           : Value::make_view(std::move(items), Value::View::ReverseIterator);
  };
  f["sum"] = [](auto&, const Value& v, Args& a) {
    const Value attribute = a.get(0, "attribute", Value::none());
    Value total = a.get(1, "start", Value::integer(0));
    for (const auto& item : Builtins::iterate(v, a.line))
      total = sum_values(total, attribute.is_none() ? item : attr_path(item, attribute, a.line),
                         a.line);
    return total;
  };
}

// Filters that sort, group or pick items (jinja2 returns generators from most of them).
void add_selection_filters(FilterTable& f) {
  f["map"] = map_filter;
  f["batch"] = [](auto&, const Value& v, Args& a) {
    const int64_t n = int_arg(a.get(0, "linecount"), "batch", a.line);
    if (n <= 0) throw Error("batch(): linecount must be positive", a.line);
    const Value fill = a.get(1, "fill_with", Value::none());
    List out, cur;
    for (const auto& item : Builtins::iterate(v, a.line)) {
      cur.push_back(item);
      if (static_cast<int64_t>(cur.size()) == n)
        out.push_back(Value::make_list(std::move(cur))), cur = {};
    }
    if (!cur.empty()) {
      if (!fill.is_none())
        check_fits(saturating_mul(static_cast<uint64_t>(n), sizeof(Value)), a.line);
      if (!fill.is_none())
        while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
      out.push_back(Value::make_list(std::move(cur)));
    }
    return Value::make_view(std::move(out), Value::View::Generator);
  };
  f["dictsort"] = [](auto&, const Value& v, Args& a) {
    if (v.kind != Value::Kind::Dict)
      throw Error("dictsort(): a dict is required, not " + type_name(v), a.line);
    const bool cs = a.get(0, "case_sensitive", Value::boolean(false)).truthy();
    const std::string by = to_str(a.get(1, "by", Value::string("key")));
    const bool rev = a.get(2, "reverse", Value::boolean(false)).truthy();
    if (by != "key" && by != "value")
      throw Error("dictsort(): you can only sort by either 'key' or 'value'", a.line);
    List items;
    for (const auto& kv : v.dict->items)
      items.push_back(Value::make_list({key_value(kv.first), kv.second}, true));
    const int pos = by == "key" ? 0 : 1;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      Value kx = (*x.list)[pos], ky = (*y.list)[pos];
      if (!cs) kx = lower_if_str(kx), ky = lower_if_str(ky);
      return rev ? less(ky, kx, a.line) : less(kx, ky, a.line);
    });
    return Value::make_list(std::move(items));
  };
  f["sort"] = [](auto&, const Value& v, Args& a) {
    auto items = Builtins::iterate(v, a.line);
    const bool rev = a.get(0, "reverse", Value::boolean(false)).truthy();
    const auto key = key_getter(a.get(2, "attribute", Value::none()),
                                a.get(1, "case_sensitive", Value::boolean(false)).truthy(), a.line);
    std::vector<std::pair<Value, Value>> keyed;
    for (auto& item : items) keyed.emplace_back(key(item), item);
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
      return rev ? less(y.first, x.first, a.line) : less(x.first, y.first, a.line);
    });
    List out;
    for (auto& kv : keyed) out.push_back(kv.second);
    return Value::make_list(std::move(out));
  };
  f["unique"] = [](auto&, const Value& v, Args& a) {
    const auto key = key_getter(a.get(1, "attribute", Value::none()),
                                a.get(0, "case_sensitive", Value::boolean(false)).truthy(), a.line);
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
  f["reject"] = [](Builtins::Host& h, const Value& v, Args& a) {
    return select_like(h, v, a, false, false);
  };
  f["rejectattr"] = [](Builtins::Host& h, const Value& v, Args& a) {
    return select_like(h, v, a, true, false);
  };
  f["select"] = [](Builtins::Host& h, const Value& v, Args& a) {
    return select_like(h, v, a, false, true);
  };
  f["selectattr"] = [](Builtins::Host& h, const Value& v, Args& a) {
    return select_like(h, v, a, true, true);
  };
}

const FilterTable& filters() {
  static const FilterTable table = [] {
    FilterTable f;
    add_value_filters(f);
    add_text_filters(f);
    add_sequence_filters(f);
    add_selection_filters(f);
    return f;
  }();
  return table;
}

}  // namespace

bool Builtins::has_filter(const std::string& name) { return filters().count(name) != 0; }

Value Builtins::filter(Host& host, const std::string& name, const Value& v, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end())
    throw Error("unsupported construct: the filter '" + name + "'", args.line);
  return it->second(host, v, args);
}

}  // namespace trainrun::text::jinja
