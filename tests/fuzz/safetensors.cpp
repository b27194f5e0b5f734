// Fuzz target `safetensors`: a file's bytes -> hf::SafetensorsFile (header length, header JSON,
// dtypes, shapes, data_offsets against the file size), then every tensor read whole and by
// range, and read_safetensors. A header may claim any shape; only what the file holds may be
// allocated.
#include <algorithm>

#include <ATen/ATen.h>

#include "fuzz_input.hpp"
#include "trainrun/hf/safetensors.hpp"

using namespace trainrun;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile file(data, size);
  fuzz::expect_clean([&] {
    hf::SafetensorsFile f(file.path());
    // Each read on its own: one that refuses must not hide what the next would do.
    for (const auto& e : f.entries()) {
      const int64_t n = e.numel();
      fuzz::expect_clean([&] { f.read(e.name); });
      fuzz::expect_clean([&] { f.read_range(e.name, 0, std::min<int64_t>(n, 4)); });
      if (n > 1) fuzz::expect_clean([&] { f.read_range(e.name, n / 2, n - n / 2); });
    }
    f.find("no such tensor");
    hf::read_safetensors(file.path());
  });
  return 0;
}
