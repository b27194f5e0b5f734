// The chat-template interpreter: statements, expressions and Python's operator semantics.
// Filters, tests and methods of builtin types are behind jinja_builtins.hpp.
#include "jinja_render.hpp"

#include <cmath>
#include <ctime>

#include "jinja_budget.hpp"
#include "jinja_builtins.hpp"

namespace trainrun::text::jinja {
namespace {

// A scope holds a handful of names (a loop iteration: the target and `loop`), so a vector
// searched linearly beats a hash map that allocates its buckets on every iteration.
class Vars {
 public:
  Value& operator[](const std::string& name) {
    for (auto& kv : items_)
      if (kv.first == name) return kv.second;
    items_.emplace_back(name, Value());
    return items_.back().second;
  }
  const Value* find(const std::string& name) const {
    for (const auto& kv : items_)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }

 private:
  std::vector<std::pair<std::string, Value>> items_;
};

struct Scope {
  Vars vars;
  std::shared_ptr<Scope> parent;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get())
      if (const Value* v = s->vars.find(name)) return v;
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr make_globals();

// transformers' globals, shared read-only by every render (they hold no state).
const ScopePtr& globals() {
  static const ScopePtr g = make_globals();
  return g;
}

enum class Flow { Normal, Break, Continue };

class Renderer : public Builtins::Host {
 public:
  Renderer(const Dict& variables, const Limits& limits)
      : root_(std::make_shared<Scope>()), budget_(limits.max_bytes, limits.max_operations) {
    root_->parent = globals();
    for (const auto& kv : variables.items) root_->vars[kv.first] = kv.second;
  }

  RenderResult run(const Template& t) {
    RenderResult result;
    main_ = &result.text;
    spans_ = &result.generation_spans;
    const Budget::Install install(budget_);
    exec_body(t.body, root_, result.text);
    result.bytes_built = budget_.bytes_used();
    result.operations = budget_.operations_used();
    return result;
  }

  Value call(const Value& callee, CallArgs& args) override {
    if (callee.kind == Value::Kind::Callable) return callee.fn->fn(args);
    if (callee.is_undefined()) undefined_error(callee, args.line);
    throw Error("'" + type_name(callee) + "' object is not callable", args.line);
  }

 private:
  // ---- statements ----

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
    budget_.line = s.line;
    switch (s.kind) {
      case Stmt::Kind::Text:
        append(out, s.text, s.line);
        return Flow::Normal;
      case Stmt::Kind::Output:
        append(out, to_str(eval(*s.expr, scope)), s.line);
        return Flow::Normal;
      case Stmt::Kind::If:
        for (const auto& branch : s.branches)
          if (eval(*branch.first, scope).truthy()) return exec_body(branch.second, scope, out);
        return exec_body(s.else_body, scope, out);
      case Stmt::Kind::For: return exec_for(s, scope, out);
      case Stmt::Kind::Set: assign(s.target, eval(*s.expr, scope), scope, s.line); return Flow::Normal;
      case Stmt::Kind::SetBlock: {
        std::string text;
        exec_body(s.body, scope, text);
        assign(s.target, apply_filters(s.filters, Value::string(std::move(text)), scope), scope, s.line);
        return Flow::Normal;
      }
      case Stmt::Kind::FilterBlock: {
        std::string text;
        exec_body(s.body, scope, text);
        append(out, to_str(apply_filters(s.filters, Value::string(std::move(text)), scope)),
               s.line);
        return Flow::Normal;
      }
      case Stmt::Kind::With: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        for (const auto& p : s.params) inner->vars[p.first] = eval(*p.second, scope);
        return exec_body(s.body, inner, out);
      }
      case Stmt::Kind::Macro: define_macro(s, scope); return Flow::Normal;
      case Stmt::Kind::Break:
      case Stmt::Kind::Continue:
        if (loop_depth_ == 0) throw Error("{% break %}/{% continue %} outside a for loop", s.line);
        return s.kind == Stmt::Kind::Break ? Flow::Break : Flow::Continue;
      case Stmt::Kind::Generation: {
        const size_t begin = out.size();
        const Flow f = exec_body(s.body, scope, out);
        if (&out == main_) spans_->emplace_back(begin, out.size());
        return f;
      }
    }
    return Flow::Normal;
  }

  Value apply_filters(const std::vector<ExprPtr>& filters, Value v, const ScopePtr& scope) {
    for (const auto& f : filters) {
      CallArgs args = eval_args(f->args, scope, f->line);
      charge_call(v, f->line);
      v = built(Builtins::filter(*this, f->name, v, args), f->line);
    }
    return v;
  }

  // ---- the budget (jinja_budget.hpp) ----

  void append(std::string& out, const std::string& text, int line) {
    budget_.bytes(text.size(), line);
    out += text;
  }

  // A call costs one operation plus one per item (list, dict) or KiB (string) of the operand it
  // scans, so a loop over calls on large values runs out of operations as fast as one over small.
  void charge_call(const Value& operand, int line) {
    uint64_t scanned = 0;
    if (operand.is_string())
      scanned = operand.s.size() / 1024;
    else if (operand.is_sequence())
      scanned = operand.list->size();
    else if (operand.kind == Value::Kind::Dict)
      scanned = operand.dict->items.size();
    budget_.operations(1 + scanned, line);
  }

  // A value a call made: its bytes count against the budget.
  Value built(Value v, int line) {
    budget_.bytes(value_bytes(v), line);
    return v;
  }

  // Reading a variable copies its value: a large string read in a loop costs as much as scanning
  // it.
  Value read(Value v, int line) {
    if (v.s.size() >= 1024) budget_.operations(v.s.size() / 1024, line);
    return v;
  }

  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    const std::vector<Value> all = Builtins::iterate(eval(*s.expr, scope), s.line);
    std::vector<Value> items;
    if (s.cond) {
      // `for x in xs if cond`: the condition sees the target but not `loop`; loop counts the kept items.
      for (const auto& item : all) {
        budget_.operations(1, s.line);
        auto probe = std::make_shared<Scope>();
        probe->parent = scope;
        bind_target(s.target, item, *probe, s.line);
        if (eval(*s.cond, probe).truthy()) items.push_back(item);
      }
    } else {
      items = all;
    }
    if (items.empty()) return exec_body(s.else_body, scope, out);
    const int64_t n = static_cast<int64_t>(items.size());
    ++loop_depth_;
    for (int64_t k = 0; k < n; ++k) {
      budget_.operations(1, s.line);
      auto iteration = std::make_shared<Scope>();  // jinja2: nothing set in one iteration survives it
      iteration->parent = scope;
      bind_target(s.target, items[static_cast<size_t>(k)], *iteration, s.line);
      iteration->vars["loop"] = loop_object(items, k);
      if (exec_body(s.body, iteration, out) == Flow::Break) break;
    }
    --loop_depth_;
    return Flow::Normal;
  }

  Value loop_object(const std::vector<Value>& items, int64_t k) {
    const int64_t n = static_cast<int64_t>(items.size());
    Dict d;
    d.items.reserve(12);
    d.items.emplace_back("index0", Value::integer(k));
    d.items.emplace_back("index", Value::integer(k + 1));
    d.items.emplace_back("revindex0", Value::integer(n - k - 1));
    d.items.emplace_back("revindex", Value::integer(n - k));
    d.items.emplace_back("first", Value::boolean(k == 0));
    d.items.emplace_back("last", Value::boolean(k == n - 1));
    d.items.emplace_back("length", Value::integer(n));
    d.items.emplace_back("depth0", Value::integer(0));
    d.items.emplace_back("depth", Value::integer(1));
    d.items.emplace_back("previtem", k > 0 ? items[static_cast<size_t>(k - 1)]
                                           : Value::undefined("there is no previous item"));
    d.items.emplace_back("nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)]
                                               : Value::undefined("there is no next item"));
    d.items.emplace_back("cycle", Value::callable("loop.cycle", [k](CallArgs& a) {
      if (a.pos.empty()) throw Error("no items for cycling given", a.line);
      return a.pos[static_cast<size_t>(k) % a.pos.size()];
    }));
    return Value::make_dict(std::move(d), Value::Kind::Object);
  }

  void bind_target(const Target& t, const Value& v, Scope& scope, int line) {
    if (!t.tuple) {
      scope.vars[t.names[0]] = v;
      return;
    }
    const std::vector<Value> parts = Builtins::iterate(v, line);
    if (parts.size() != t.names.size())
      throw Error("cannot unpack " + std::to_string(parts.size()) + " values into " +
                      std::to_string(t.names.size()) + " names", line);
    for (size_t k = 0; k < parts.size(); ++k) scope.vars[t.names[k]] = parts[k];
  }

  void assign(const Target& t, const Value& v, const ScopePtr& scope, int line) {
    if (t.attr.empty()) {
      bind_target(t, v, *scope, line);
      return;
    }
    const Value* ns = scope->find(t.names[0]);
    if (!ns || ns->kind != Value::Kind::Namespace)
      throw Error("cannot assign attribute '" + t.attr + "' on '" + t.names[0] + "', which is not a namespace()",
                  line);
    if (!t.attr.empty() && t.attr[0] == '_')
      throw Error("chat templates cannot store underscore-prefixed attributes on a namespace ('" + t.attr + "')",
                  line);
    ns->dict->set(t.attr, v);
  }

  void define_macro(const Stmt& s, const ScopePtr& scope) {
    const Stmt* macro = &s;
    scope->vars[s.text] = Value::callable(s.text, [this, macro](CallArgs& a) {
      // A macro sees its arguments and the template's top level (jinja2 resolves other names there).
      auto frame = std::make_shared<Scope>();
      frame->parent = root_;
      if (a.pos.size() > macro->params.size())
        throw Error("macro '" + macro->text + "' takes not more than " + std::to_string(macro->params.size()) +
                        " argument(s)", a.line);
      for (const auto& kw : a.kw) {
        bool known = false;
        for (const auto& p : macro->params) known = known || p.first == kw.first;
        if (!known) throw Error("macro '" + macro->text + "' takes no keyword argument '" + kw.first + "'", a.line);
      }
      for (size_t k = 0; k < macro->params.size(); ++k) {
        const auto& p = macro->params[k];
        if (a.has(k, p.first)) frame->vars[p.first] = a.get(k, p.first);
        else if (p.second) frame->vars[p.first] = eval(*p.second, frame);
        else frame->vars[p.first] = Value::undefined("parameter '" + p.first + "' was not provided");
      }
      std::string text;
      // Python stops runaway recursion near 1000 frames; a macro frame is several of ours.
      if (++call_depth_ > 200) throw Error("maximum recursion depth exceeded in macro '" + macro->text + "'", a.line);
      const int saved = loop_depth_;
      loop_depth_ = 0;
      try {
        exec_body(macro->body, frame, text);
      } catch (...) {
        --call_depth_;
        throw;
      }
      --call_depth_;
      loop_depth_ = saved;
      return Value::string(std::move(text));
    });
  }

  // ---- expressions ----

  CallArgs eval_args(const std::vector<Arg>& args, const ScopePtr& scope, int line) {
    CallArgs out;
    out.line = line;
    for (const auto& a : args) {
      if (a.name.empty()) out.pos.push_back(eval(*a.value, scope));
      else out.kw.emplace_back(a.name, eval(*a.value, scope));
    }
    return out;
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::Const: return e.constant;
      case Expr::Kind::Name: {
        const Value* v = scope->find(e.name);
        return v ? read(*v, e.line) : Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::GetAttr:
        return read(Builtins::getattr(eval(*e.a, scope), e.name, e.line), e.line);
      case Expr::Kind::GetItem:
        return read(Builtins::getitem(eval(*e.a, scope), eval(*e.b, scope), e.line), e.line);
      case Expr::Kind::Slice: {
        const Value obj = eval(*e.a, scope);
        auto part = [&](const ExprPtr& p) { return p ? eval(*p, scope) : Value::none(); };
        return Builtins::slice(obj, part(e.b), part(e.d), part(e.c), e.line);
      }
      case Expr::Kind::Call: {
        if (e.a->kind == Expr::Kind::GetAttr) {
          // obj.method(...): call the method of a builtin type without materialising a bound method
          const Value obj = eval(*e.a->a, scope);
          CallArgs args = eval_args(e.args, scope, e.line);
          charge_call(obj, e.line);
          Value result;
          if (Builtins::call_method(*this, obj, e.a->name, args, result))
            return built(std::move(result), e.line);
          return built(call(Builtins::getattr(obj, e.a->name, e.line), args), e.line);
        }
        const Value callee = eval(*e.a, scope);
        CallArgs args = eval_args(e.args, scope, e.line);
        charge_call(args.pos.empty() ? Value() : args.pos[0], e.line);
        return built(call(callee, args), e.line);
      }
      case Expr::Kind::Filter: {
        const Value v = eval(*e.a, scope);
        CallArgs args = eval_args(e.args, scope, e.line);
        charge_call(v, e.line);
        return built(Builtins::filter(*this, e.name, v, args), e.line);
      }
      case Expr::Kind::Test: {
        const Value v = eval(*e.a, scope);
        CallArgs args = eval_args(e.args, scope, e.line);
        charge_call(v, e.line);
        return Value::boolean(Builtins::test(*this, e.name, v, args) != e.negated);
      }
      case Expr::Kind::Neg:
      case Expr::Kind::Pos: {
        const Value v = eval(*e.a, scope);
        if (v.is_undefined()) undefined_error(v, e.line);
        const bool neg = e.kind == Expr::Kind::Neg;
        if (v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool) {
          const int64_t x = v.kind == Value::Kind::Bool ? v.b : v.i;
          return Value::integer(neg ? -x : x);
        }
        if (v.kind == Value::Kind::Float) return Value::number(neg ? -v.f : v.f);
        throw Error(std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" + type_name(v) + "'",
                    e.line);
      }
      case Expr::Kind::Not: return Value::boolean(!eval(*e.a, scope).truthy());
      case Expr::Kind::And: {
        Value a = eval(*e.a, scope);
        return a.truthy() ? eval(*e.b, scope) : a;
      }
      case Expr::Kind::Or: {
        Value a = eval(*e.a, scope);
        return a.truthy() ? a : eval(*e.b, scope);
      }
      case Expr::Kind::Binary: return binary(e.name, eval(*e.a, scope), eval(*e.b, scope), e.line);
      case Expr::Kind::Compare: {
        Value left = eval(*e.a, scope);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.operands[k], scope);
          if (!compare(e.ops[k], left, right, e.line)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::CondExpr:
        if (eval(*e.a, scope).truthy()) return eval(*e.b, scope);
        if (e.c) return eval(*e.c, scope);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined");
      case Expr::Kind::ListLit:
      case Expr::Kind::TupleLit: {
        List items;
        for (const auto& a : e.args) items.push_back(eval(*a.value, scope));
        return built(Value::make_list(std::move(items), e.kind == Expr::Kind::TupleLit), e.line);
      }
      case Expr::Kind::DictLit: {
        Dict d;
        for (const auto& kv : e.pairs) {
          const Value key = eval(*kv.first, scope);
          d.set(dict_key(key, e.line), eval(*kv.second, scope));
        }
        return built(Value::make_dict(std::move(d)), e.line);
      }
    }
    throw Error("internal error: unknown expression", e.line);
  }

  bool compare(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "eq") return equal(a, b);
    if (op == "ne") return !equal(a, b);
    if (op == "in" || op == "notin") charge_call(b, line);
    if (op == "in") return Builtins::contains(b, a, line);
    if (op == "notin") return !Builtins::contains(b, a, line);
    if (a.is_undefined()) undefined_error(a, line);
    if (b.is_undefined()) undefined_error(b, line);
    if (op == "lt") return less(a, b, line);
    if (op == "gt") return less(b, a, line);
    if (op == "lteq") return !less(b, a, line);
    return !less(a, b, line);  // gteq
  }

  Value binary(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") {
      std::string left = to_str(a), right = to_str(b);
      budget_.bytes(left.size() + right.size(), line);
      return Value::string(left + right);
    }
    if (a.is_undefined()) undefined_error(a, line);
    if (b.is_undefined()) undefined_error(b, line);
    return Builtins::arithmetic(op, a, b, line);
  }

  ScopePtr root_;
  std::string* main_ = nullptr;
  std::vector<std::pair<size_t, size_t>>* spans_ = nullptr;
  int loop_depth_ = 0;
  int call_depth_ = 0;
  Budget budget_;
};


ScopePtr make_globals() {
  auto scope = std::make_shared<Scope>();
  auto& g = scope->vars;
  g["raise_exception"] = Value::callable("raise_exception", [](CallArgs& a) -> Value {
    throw Raised(to_str(a.get(0, "message")), a.line);
  });
  g["strftime_now"] = Value::callable("strftime_now", [](CallArgs& a) {
    const Value fmt = a.get(0, "format");
    if (!fmt.is_string()) throw Error("strftime_now() expects a format string", a.line);
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, fmt.s.c_str(), &local);
    return Value::string(std::string(buf, n));
  });
  auto make_dict = [](CallArgs& a, const char* fn, bool check_names) {
    Dict d;
    if (a.pos.size() > 1) throw Error(std::string(fn) + "() expected at most 1 positional argument", a.line);
    if (!a.pos.empty()) {
      const Value& src = a.pos[0];
      if (src.kind == Value::Kind::Dict || src.kind == Value::Kind::Namespace) {
        d = *src.dict;
      } else {
        for (const auto& pair : Builtins::iterate(src, a.line)) {
          const auto kv = Builtins::iterate(pair, a.line);
          if (kv.size() != 2 || !kv[0].is_string())
            throw Error(std::string(fn) + "() needs (string key, value) pairs", a.line);
          d.set(kv[0].s, kv[1]);
        }
      }
    }
    for (const auto& kw : a.kw) d.set(kw.first, kw.second);
    if (check_names)
      for (const auto& kv : d.items)
        if (!kv.first.empty() && kv.first[0] == '_')
          throw Error("chat templates cannot store underscore-prefixed attributes on a namespace ('" + kv.first +
                          "')", a.line);
    return d;
  };
  g["namespace"] = Value::callable("namespace", [make_dict](CallArgs& a) {
    return Value::make_dict(make_dict(a, "namespace", true), Value::Kind::Namespace);
  });
  g["dict"] = Value::callable("dict", [make_dict](CallArgs& a) { return Value::make_dict(make_dict(a, "dict", false)); });
  g["range"] = Value::callable("range", [](CallArgs& a) {
    for (const auto& v : a.pos)
      if (v.kind != Value::Kind::Int && v.kind != Value::Kind::Bool)
        throw Error("range() takes integers, got '" + type_name(v) + "'", a.line);
    if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty()) throw Error("range() takes 1 to 3 integers", a.line);
    auto num = [](const Value& v) { return v.kind == Value::Kind::Bool ? int64_t{v.b} : v.i; };
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) stop = num(a.pos[0]);
    else {
      start = num(a.pos[0]);
      stop = num(a.pos[1]);
      if (a.pos.size() == 3) step = num(a.pos[2]);
    }
    if (step == 0) throw Error("range() arg 3 must not be zero", a.line);
    List items;
    for (int64_t x = start; step > 0 ? x < stop : x > stop; x += step) {
      if (items.size() >= 100000)  // the sandbox's MAX_RANGE
        throw Error("range too big: the sandbox blocks ranges larger than 100000", a.line);
      items.push_back(Value::integer(x));
    }
    return Value::make_list(std::move(items));
  });
  for (const char* name : {"lipsum", "cycler", "joiner"}) {
    const std::string n = name;
    g[n] = Value::callable(n, [n](CallArgs& a) -> Value {
      throw Error("unsupported construct: the global function " + n + "()", a.line);
    });
  }
  return scope;
}

}  // namespace

[[noreturn]] void undefined_error(const Value& v, int line) {
  throw Error(v.s.empty() ? std::string("a value is undefined") : v.s, line);
}

RenderResult render(const Template& t, const Dict& variables, const Limits& limits) {
  Renderer r(variables, limits);
  return r.run(t);
}

}  // namespace trainrun::text::jinja
