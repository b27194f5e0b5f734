// Jinja2's builtin tests (`x is defined`, `n is divisibleby(3)`), as jinja2 3.1's tests.py has
// them, over the engine's values.
#include <functional>
#include <map>

#include "jinja_builtins.hpp"
#include "jinja_str.hpp"

namespace trainrun::text::jinja {
namespace {

using Args = CallArgs;
using TestFn = std::function<bool(Builtins::Host&, const Value&, Args&)>;

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
    t["filter"] = [](auto&, const Value& v, Args&) {
      return v.is_string() && Builtins::has_filter(v.s);
    };
    t["test"] = [](auto&, const Value& v, Args&) {
      return v.is_string() && Builtins::has_test(v.s);
    };
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
    t["in"] = [](auto&, const Value& v, Args& a) {
      return Builtins::contains(a.get(0, "seq"), v, a.line);
    };
    t["sameas"] = [](auto&, const Value& v, Args& a) {
      const Value o = a.get(0, "other");
      if (v.kind != o.kind) return false;
      switch (v.kind) {
        case K::List:
        case K::Tuple:
          return v.list == o.list;
        case K::Dict:
        case K::Namespace:
        case K::Object:
          return v.dict == o.dict;
        case K::Callable:
          return v.fn == o.fn;
        default:
          return equal(v, o);
      }
    };
    for (auto [names, op] : std::vector<std::pair<std::vector<const char*>, const char*>>{
             {{"eq", "==", "equalto"}, "=="},
             {{"ne", "!="}, "!="},
             {{"lt", "<", "lessthan"}, "<"},
             {{"le", "<="}, "<="},
             {{"gt", ">", "greaterthan"}, ">"},
             {{"ge", ">="}, ">="}}) {
      const char* o = op;
      for (const char* n : names)
        t[n] = [o](auto&, const Value& v, Args& a) { return number_compare(v, a, o); };
    }
    return t;
  }();
  return table;
}

}  // namespace

bool Builtins::has_test(const std::string& name) { return tests().count(name) != 0; }

bool Builtins::test(Host& host, const std::string& name, const Value& v, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) throw Error("unsupported construct: the test '" + name + "'", args.line);
  return it->second(host, v, args);
}

}  // namespace trainrun::text::jinja
