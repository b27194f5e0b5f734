// The per-rendering budget of chat templates (jinja_budget.hpp).
#include "jinja_budget.hpp"

#include <algorithm>

namespace trainrun::text::jinja {
namespace {

// One rendering runs on one thread, and ChatTemplate may render on several threads at once: the
// budget builtins charge is the one of the rendering on their own thread.
thread_local Budget* current_budget = nullptr;

}  // namespace

Budget* Budget::current() { return current_budget; }

Budget::Install::Install(Budget& b) : saved_(current_budget) { current_budget = &b; }
Budget::Install::~Install() { current_budget = saved_; }

namespace {

[[noreturn]] void exceeded(std::string key, uint64_t limit, const std::string& counted, int line) {
  std::string flag = "--" + key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  throw LimitError("the rendering exceeds " + key + " = " + std::to_string(limit) + " (" + counted +
                       "); a real chat template needs a small fraction of it, so this one is "
                       "hostile or broken: if you trust it, raise " +
                       key + " (the [data] table, or " + flag + ")",
                   line);
}

}  // namespace

void Budget::over_bytes(int at) const {
  exceeded("template_max_bytes", max_bytes_,
           "bytes of the strings, lists and dicts it builds and of its output, in all",
           at ? at : line);
}

void Budget::over_operations(int at) const {
  exceeded("template_max_operations", max_ops_,
           "loop iterations and calls, weighted by the size of what they scan", at ? at : line);
}

uint64_t value_bytes(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String:
      return v.s.size();
    case Value::Kind::List:
    case Value::Kind::Tuple: {
      uint64_t n = v.list->size() * sizeof(Value);
      for (const auto& item : *v.list) n += item.s.size();
      return n;
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace:
    case Value::Kind::Object: {
      uint64_t n = v.dict->items.size() * sizeof(std::pair<std::string, Value>);
      for (const auto& kv : v.dict->items) n += kv.first.size() + kv.second.s.size();
      return n;
    }
    default:
      return 0;
  }
}

void charge_bytes(uint64_t n, int line) {
  if (Budget* b = Budget::current()) b->bytes(n, line);
}

void check_fits(uint64_t size, int line) {
  if (const Budget* b = Budget::current()) b->fits(size, line);
}

void charge_operations(uint64_t n, int line) {
  if (Budget* b = Budget::current()) b->operations(n, line);
}

}  // namespace trainrun::text::jinja
