// Python's object model for the chat-template engine (jinja_builtins.hpp): attribute and item
// access, slices, the methods of dict and list, iteration, `in` and the arithmetic operators. The
// filters, tests and str methods are in jinja_filters.cpp, jinja_tests.cpp, jinja_str_methods.cpp.
#include "jinja_builtins.hpp"

#include <algorithm>
#include <cmath>

#include "jinja_budget.hpp"
#include "jinja_str.hpp"

namespace trainrun::text::jinja {
namespace {

// Python's floor division of integers.
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
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

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) +
                          "' object is unsafe (chat templates render in an immutable sandbox)");
}

}  // namespace

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
      // A transient list (a loop's items), one item per code point: it must fit, not be paid for.
      check_fits(saturating_mul(v.s.size(), sizeof(Value)), line);
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
      charge_bytes(a.s.size() + b.s.size(), line);
      if (!a.markup && !b.markup) return Value::string(a.s + b.s);
      return markup((a.markup ? a.s : html_escape(a.s)) + (b.markup ? b.s : html_escape(b.s)));
    }
    if (a.is_plain_sequence() && b.is_plain_sequence() && a.kind == b.kind) {
      charge_bytes(value_bytes(a) + value_bytes(b), line);
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
      if (n > 0) charge_bytes(saturating_mul(static_cast<uint64_t>(n), value_bytes(*seq)), line);
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
