// Python semantics of the chat-template engine's values: str(), repr(), ==, <, json.dumps.
#include "jinja_value.hpp"

#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "jinja_budget.hpp"

namespace trainrun::text::jinja {

namespace {

// Encoded non-string keys that Python treats as the same key (True == 1 == 1.0) compare equal;
// the dict keeps the key it was first given, as Python does.
std::string canonical_key(const std::string& key) {
  if (key.size() < 2 || key[0] != '\0') return key;
  if (key[1] == 'b') return std::string("\0i", 2) + key.substr(2);
  if (key[1] == 'f') {
    const double f = std::stod(key.substr(2));
    if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 9.2e18)
      return std::string("\0i", 2) + std::to_string(static_cast<int64_t>(f));
  }
  return key;
}

bool same_key(const std::string& a, const std::string& b) {
  if (a == b) return true;
  if (a.empty() || b.empty() || a[0] != '\0' || b[0] != '\0') return false;
  return canonical_key(a) == canonical_key(b);
}

}  // namespace

const Value* Dict::find(const std::string& key) const {
  for (const auto& kv : items)
    if (same_key(kv.first, key)) return &kv.second;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& kv : items)
    if (same_key(kv.first, key)) {
      kv.second = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Value::make_list(List items, bool tuple) {
  Value v;
  v.kind = tuple ? Kind::Tuple : Kind::List;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::make_view(List items, View view) {
  Value v = make_list(std::move(items));
  v.view = view;
  return v;
}

Value Value::make_dict(Dict d, Kind kind) {
  Value v;
  v.kind = kind;
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::callable(std::string name, std::function<Value(CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return number(static_cast<double>(u));
      return integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), from_json(it.value()));
      return make_dict(std::move(d));
    }
    default: throw Error("unsupported JSON value (binary) in the template's variables", 0);
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0;
    case Kind::String: return !s.empty();
    case Kind::List:
    case Kind::Tuple: return is_iterator() || !list->empty();
    case Kind::Dict: return !dict->items.empty();
    default: return true;
  }
}

double Value::as_double() const {
  if (kind == Kind::Float) return f;
  if (kind == Kind::Bool) return b ? 1 : 0;
  return static_cast<double>(i);
}

Value CallArgs::get(size_t index, const std::string& name, Value fallback) const {
  if (index < pos.size()) return pos[index];
  for (const auto& kv : kw)
    if (kv.first == name) return kv.second;
  return fallback;
}

bool CallArgs::has(size_t index, const std::string& name) const {
  if (index < pos.size()) return true;
  for (const auto& kv : kw)
    if (kv.first == name) return true;
  return false;
}

void CallArgs::expect(const std::string& fn, size_t n, std::initializer_list<const char*> names) const {
  if (pos.size() > n)
    throw Error(fn + "() takes at most " + std::to_string(n) + " positional arguments (" +
                    std::to_string(pos.size()) + " given)", line);
  for (const auto& kv : kw) {
    bool ok = false;
    for (const char* name : names) ok = ok || kv.first == name;
    if (!ok) throw Error(fn + "() got an unexpected keyword argument '" + kv.first + "'", line);
  }
}

std::string dict_key(const Value& key, int line) {
  switch (key.kind) {
    case Value::Kind::String: return key.s;
    case Value::Kind::None: return std::string("\0n", 2);
    case Value::Kind::Bool: return std::string("\0b", 2) + (key.b ? "1" : "0");
    case Value::Kind::Int: return std::string("\0i", 2) + std::to_string(key.i);
    case Value::Kind::Float: return std::string("\0f", 2) + float_repr(key.f);
    default: throw Error("unsupported construct: a dict key of type '" + type_name(key) + "'", line);
  }
}

Value key_value(const std::string& key) {
  if (key.empty() || key[0] != '\0') return Value::string(key);
  if (key[1] == 'n') return Value::none();
  if (key[1] == 'b') return Value::boolean(key[2] == '1');
  if (key[1] == 'i') return Value::integer(std::stoll(key.substr(2)));
  return Value::number(std::stod(key.substr(2)));
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List:
      switch (v.view) {
        case Value::View::Generator: return "generator";
        case Value::View::ReverseIterator: return "list_reverseiterator";
        case Value::View::DictKeys: return "dict_keys";
        case Value::View::DictValues: return "dict_values";
        case Value::View::DictItems: return "dict_items";
        default: return "list";
      }
    case Value::Kind::Tuple: return "tuple";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Object: return "LoopContext";
    case Value::Kind::Callable: return "function";
  }
  return "object";
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out as Python's repr does:
  // positional for decimal exponents -4 <= e < 16, scientific otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const auto epos = sci.find('e');
  std::string digits = sci.substr(0, epos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp10 = std::stoi(sci.substr(epos + 1));
  std::string out;
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    } else if (static_cast<size_t>(exp10) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp10) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp10) + 1) + "." + digits.substr(static_cast<size_t>(exp10) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += e;
  }
  return negative ? "-" + out : out;
}

namespace {

bool py_printable(char32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || c == 0x7f) return false;
  if (c < 0x7f) return true;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR: return false;
    default: return true;
  }
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(s)) {
    char buf[16];
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (py_printable(c)) {
      out += utf8_encode(c);
    } else {
      if (c < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::String: return v.s;
    default: return repr(v);
  }
}

namespace {

// repr() written into one buffer: a list or dict that holds the same container many times over
// prints exponentially, and building each level's text apart would copy every byte once per level.
void repr_into(std::string& out, const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
      out += "Undefined";
      return;
    case Value::Kind::None:
      out += "None";
      return;
    case Value::Kind::Bool:
      out += v.b ? "True" : "False";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.i);
      return;
    case Value::Kind::Float:
      out += float_repr(v.f);
      return;
    case Value::Kind::String:
      out += string_repr(v.s);
      return;
    case Value::Kind::List:
    case Value::Kind::Tuple: {
      if (v.is_iterator()) {
        out += "<" + type_name(v) + " object>";
        return;
      }
      const bool tuple = v.kind == Value::Kind::Tuple;
      out += v.view != Value::View::None ? type_name(v) + "([" : tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        repr_into(out, (*v.list)[k]);
        check_fits(out.size(), 0);
      }
      if (tuple && v.list->size() == 1) out += ",";
      out += tuple ? ")" : v.view != Value::View::None ? "])" : "]";
      return;
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      out += v.kind == Value::Kind::Namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, key_value(kv.first));
        out += ": ";
        repr_into(out, kv.second);
        check_fits(out.size(), 0);
      }
      out += v.kind == Value::Kind::Namespace ? "}>" : "}";
      return;
    }
    case Value::Kind::Object:
      out += "<LoopContext>";
      return;
    case Value::Kind::Callable:
      out += "<function " + v.fn->name + ">";
      return;
  }
}

}  // namespace

std::string repr(const Value& v) {
  std::string out;
  repr_into(out, v);
  return out;
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind != K::Float && b.kind != K::Float) {
      const int64_t x = a.kind == K::Bool ? a.b : a.i, y = b.kind == K::Bool ? b.b : b.i;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.s == b.s;
    case K::List:
    case K::Tuple: {
      if (a.is_iterator() || b.is_iterator()) return a.list == b.list;
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case K::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* other = b.dict->find(kv.first);
        if (!other || !equal(kv.second, *other)) return false;
      }
      return true;
    }
    case K::Namespace:
    case K::Object: return a.dict == b.dict;
    case K::Callable: return a.fn == b.fn;
    default: return false;
  }
}

bool less(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::Int && b.kind == Value::Kind::Int) return a.i < b.i;
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 byte order is code point order
  if (a.kind == b.kind && a.is_sequence()) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      const Value &x = (*a.list)[k], &y = (*b.list)[k];
      if (!equal(x, y)) return less(x, y, line);
    }
    return a.list->size() < b.list->size();
  }
  throw Error("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'", line);
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (v >> 10)),
                          static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          out += utf8_encode(c);
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonOptions& o, int level, int line) {
  const bool indented = o.indent >= 0 || o.indent_is_string;
  const std::string unit = o.indent_is_string ? o.indent_str : std::string(std::max(o.indent, 0), ' ');
  auto newline = [&](int lvl) {
    check_fits(out.size() + saturating_mul(unit.size(), static_cast<uint64_t>(lvl)), line);
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += unit;
  };
  // Python's json module: with an indent the default item separator loses its space.
  const std::string item_sep = o.separators_given ? o.item_sep : (indented ? "," : ", ");
  switch (v.kind) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(v.f);
      return;
    case Value::Kind::String: json_string(out, v.s, o.ensure_ascii); return;
    case Value::Kind::List:
    case Value::Kind::Tuple: {
      if (v.view != Value::View::None)
        throw Error("tojson: Object of type " + type_name(v) + " is not JSON serializable", line);
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      if (indented) newline(level + 1);
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) {
          out += item_sep;
          if (indented) newline(level + 1);
        }
        json_value(out, (*v.list)[k], o, level + 1, line);
        check_fits(out.size(), line);  // shared lists nest without costing bytes until printed
      }
      if (indented) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      if (indented) newline(level + 1);
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) {
          out += item_sep;
          if (indented) newline(level + 1);
        }
        // json.dumps writes int/float keys as their text, True/False/None as true/false/null
        const Value key = key_value(items[k]->first);
        json_string(out, key.is_string() ? key.s : key.is_none() ? "null" : to_json(key, o, line), o.ensure_ascii);
        out += o.separators_given ? o.key_sep : ": ";
        json_value(out, items[k]->second, o, level + 1, line);
        check_fits(out.size(), line);
      }
      if (indented) newline(level);
      out += '}';
      return;
    }
    default: throw Error("tojson: Object of type " + type_name(v) + " is not JSON serializable", line);
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options, int line) {
  std::string out;
  json_value(out, v, options, 0, line);
  return out;
}

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    const auto c = static_cast<unsigned char>(s[k]);
    char32_t cp;
    size_t n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c >> 5) == 0x6) { cp = c & 0x1f; n = 2; }
    else if ((c >> 4) == 0xe) { cp = c & 0x0f; n = 3; }
    else if ((c >> 3) == 0x1e) { cp = c & 0x07; n = 4; }
    else { out += 0xfffd; ++k; continue; }  // invalid lead byte
    if (k + n > s.size()) { out += 0xfffd; break; }
    bool ok = true;
    for (size_t m = 1; m < n; ++m) {
      const auto cc = static_cast<unsigned char>(s[k + m]);
      if ((cc >> 6) != 0x2) { ok = false; break; }
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) { out += 0xfffd; ++k; continue; }
    out += cp;
    k += n;
  }
  return out;
}

std::string utf8_encode(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
  return out;
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) out += utf8_encode(c);
  return out;
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

std::string to_upper(const std::string& s) {
  std::string out;
  icu::UnicodeString::fromUTF8(s).toUpper(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}

std::string to_lower(const std::string& s) {
  std::string out;
  icu::UnicodeString::fromUTF8(s).toLower(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}

std::string to_title(const std::string& s) {
  // Python: a cased character after a cased one is lowered, any other is title-cased.
  std::string out;
  bool previous_cased = false;
  for (char32_t c : utf8_decode(s)) {
    const auto uc = static_cast<UChar32>(c);
    out += utf8_encode(static_cast<char32_t>(previous_cased ? u_tolower(uc) : u_totitle(uc)));
    previous_cased = u_hasBinaryProperty(uc, UCHAR_CASED);
  }
  return out;
}

std::string to_capitalize(const std::string& s) {
  const std::u32string u = utf8_decode(s);
  if (u.empty()) return s;
  return utf8_encode(static_cast<char32_t>(u_totitle(static_cast<UChar32>(u[0])))) +
         to_lower(utf8_encode(u.substr(1)));
}

}  // namespace trainrun::text::jinja
