#pragma once
// Shared by the core's unit tests: the registry of the built plugins, and job files written to
// a private temporary directory.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "trainrun/core/registry.hpp"

namespace trainrun::test {

/// Every plugin of this build (TRAINRUN_TEST_PLUGIN_DIR), loaded once per test binary.
inline const core::Registry& registry() {
  static core::Registry reg = [] {
    core::Registry r;
    r.load_search_path({TRAINRUN_TEST_PLUGIN_DIR});
    return r;
  }();
  return reg;
}

/// This test binary's private temporary directory. It comes from mkdtemp, not the pid: /tmp
/// may be shared with processes of other pid namespaces.
inline std::string temp_dir() {
  static const std::string dir = [] {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "trainrun-unit-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
    return pattern;
  }();
  return dir;
}

/// Writes `text` to a new job file in temp_dir() and returns its path.
inline std::string write_job(const std::string& text) {
  static int n = 0;
  const std::filesystem::path p = std::filesystem::path(temp_dir()) / ("job" + std::to_string(++n) + ".toml");
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace trainrun::test
