#pragma once
// Shared by the fuzz targets (tests/fuzz/*.cpp): the readers under test take paths, so each
// input is written to a file first, and the contract every target checks in one place.
//
// The contract (issue 27): any byte string gives a valid result or a trainrun::v1::Error (a
// ConfigError, PluginError or CheckpointError naming the file and what is wrong). Anything else
// escaping a target -- a std::out_of_range from a JSON accessor, a c10::Error from a tensor
// shape read from the input, std::bad_alloc -- reaches std::terminate, which libFuzzer reports
// as a crash and the regression runner (fuzz_regress_main.cpp) as a failure naming the file.
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include <trainrun/error.hpp>

namespace trainrun::fuzz {

/// A private directory for this process's files, made once (mkdtemp: /tmp may be shared).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "trainrun-fuzz-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
    return pattern;
  }();
  return dir;
}

/// Writes `size` bytes to `path` (truncating it).
inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) throw std::runtime_error("cannot write " + path);
}

/// The input as an anonymous in-memory file, opened by path as /proc/self/fd/N (no disk I/O,
/// nothing left behind).
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = ::memfd_create("fuzz-input", 0);
    if (fd_ < 0) throw std::runtime_error("memfd_create failed");
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) throw std::runtime_error("write to memfd failed");
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

/// Runs fn(); a trainrun::v1::Error is the clear error the contract allows, anything else
/// propagates (and fails the run).
template <class F>
void expect_clean(F&& fn) {
  try {
    fn();
  } catch (const trainrun::v1::Error&) {
  }
}

}  // namespace trainrun::fuzz
