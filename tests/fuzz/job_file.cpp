// Fuzz target `job_file`: job-file TOML text -> JobFile::load + validate, the path of
// `trainrun check` up to the point where it builds components (check_memory_lines creates the
// dataset and model the job names, which is running the job, not reading it). Validation uses
// every plugin of the gcc build (TRAINRUN_FUZZ_PLUGIN_DIR, default the build's plugin folder):
// their option schemas are what a job file is checked against.
#include <cstdlib>

#include "fuzz_input.hpp"
#include "trainrun/core/config.hpp"
#include "trainrun/core/registry.hpp"

using namespace trainrun;

namespace {

const core::Registry& registry() {
  static core::Registry reg = [] {
    core::Registry r;
    const char* dir = std::getenv("TRAINRUN_FUZZ_PLUGIN_DIR");
    r.load_search_path({dir ? dir : TRAINRUN_FUZZ_PLUGIN_DIR});
    if (r.plugins().empty()) {
      std::fprintf(stderr, "job_file fuzz target: no plugins in %s (build `runtime` first)\n",
                   dir ? dir : TRAINRUN_FUZZ_PLUGIN_DIR);
      std::abort();
    }
    return r;
  }();
  return reg;
}

}  // namespace

// Loading every plugin takes seconds: before the first input, outside the per-input -timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  registry();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const core::Registry& reg = registry();
  fuzz::MemFile file(data, size);
  fuzz::expect_clean([&] {
    core::JobFile job = core::JobFile::load(file.path(), {});
    job.plugin_paths();
    core::JobConfig config = job.validate(reg);
    (void)core::launcher_of(config);
  });
  return 0;
}
