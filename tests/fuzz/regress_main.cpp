// The regression run of a fuzz target without libFuzzer (CTest fuzz_regress.<target>, built
// by the ordinary compiler): feeds every file named on the command line, or found in the
// folders named, to the target's LLVMFuzzerTestOneInput, as libFuzzer would replay them.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Optional, as in libFuzzer: one-time set-up before the first input.
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (fs::is_directory(argv[i])) {
      for (const auto& e : fs::recursive_directory_iterator(argv[i]))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (fs::is_regular_file(argv[i])) {
      inputs.emplace_back(argv[i]);
    } else {
      std::fprintf(stderr, "fuzz regression: no file or folder %s\n", argv[i]);
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "fuzz regression: no inputs (an empty corpus tests nothing)\n");
    return 2;
  }
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  for (const auto& p : inputs) {
    // Named before it runs, so a crash's output ends with the input that caused it.
    std::fprintf(stderr, "input %s\n", p.c_str());
    std::ifstream f(p, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    try {
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "FAILED %s: an exception outside the contract escaped: %s\n", p.c_str(), e.what());
      return 1;
    }
  }
  std::printf("fuzz regression: %zu inputs, all handled\n", inputs.size());
  return 0;
}
