#pragma once
// Options as the host would deliver them to a component under test: every option its
// declare_options declares, defaults filled in, then the given overrides (which must be
// declared, or the test is wrong). Shared by the unit tests that build components directly.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <trainrun/options.hpp>
#include <utility>

namespace trainrun::test {

template <class Impl>
v1::Options make_options(const std::map<std::string, v1::OptionValue>& overrides = {}) {
  v1::OptionSchema schema;
  Impl::declare_options(schema);
  std::map<std::string, v1::OptionValue> values;
  for (const auto& spec : schema.specs()) values[spec.name] = spec.default_value;
  for (const auto& [key, value] : overrides) {
    REQUIRE_MESSAGE(schema.find(key) != nullptr, "undeclared option ", key);
    values[key] = value;
  }
  return v1::Options(std::move(values), "[test]");
}

}  // namespace trainrun::test
