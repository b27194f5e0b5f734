#pragma once
// CPU memory statistics of this process: bytes currently allocated by LibTorch's CPU allocator
// and the peak since the last reset_peak() (the CPU counterpart of torch.cuda.memory_allocated
// and torch.cuda.max_memory_allocated), and the machine's physical RAM.
//
// Why dlsym: the counting allocator must be one per process, installed before anything
// allocates, and plugins are loaded RTLD_LOCAL and export nothing but their entry symbol, so a
// copy of the tracker in this header would be a separate, never-installed one in every plugin.
// The trainrun executable (and test programs that link the core) installs it first thing in
// main() and exports exactly the four extern "C" functions below (a linker dynamic list; the
// core's memory.dynlist). The executable's dynamic symbols are in the global scope, which
// dlsym(RTLD_DEFAULT, ...) searches from any library, RTLD_LOCAL or not. A process without them
// (a third-party host, a test that does not install the tracker) gets -1 fields, never a crash.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>

#include "trainrun/interfaces.hpp"

extern "C" {
/// Exported by the trainrun executable (core/src/memory.cpp); looked up at run time, never
/// linked against. tracking: 1 once the counting allocator is installed, else 0.
typedef int (*trainrun_memory_tracking_fn)(void);
typedef int64_t (*trainrun_memory_bytes_fn)(void);
typedef void (*trainrun_memory_reset_peak_fn)(void);
}

namespace trainrun::v1::memory {

namespace detail {

struct TrackerApi {
  trainrun_memory_tracking_fn tracking = nullptr;
  trainrun_memory_bytes_fn current = nullptr;
  trainrun_memory_bytes_fn peak = nullptr;
  trainrun_memory_reset_peak_fn reset_peak = nullptr;
  bool complete() const { return tracking && current && peak && reset_peak; }
};

// Looked up once per library (the symbols exist from program start whether or not the tracker
// is installed yet; tracking() says whether it is).
inline const TrackerApi& tracker_api() {
  static const TrackerApi api = [] {
    TrackerApi a;
    a.tracking = reinterpret_cast<trainrun_memory_tracking_fn>(
        dlsym(RTLD_DEFAULT, "trainrun_memory_tracking"));
    a.current = reinterpret_cast<trainrun_memory_bytes_fn>(
        dlsym(RTLD_DEFAULT, "trainrun_memory_current_bytes"));
    a.peak = reinterpret_cast<trainrun_memory_bytes_fn>(
        dlsym(RTLD_DEFAULT, "trainrun_memory_peak_bytes"));
    a.reset_peak = reinterpret_cast<trainrun_memory_reset_peak_fn>(
        dlsym(RTLD_DEFAULT, "trainrun_memory_reset_peak"));
    return a;
  }();
  return api;
}

}  // namespace detail

/// Physical RAM of this machine in bytes (sysconf), -1 when unknown. Not a cgroup limit.
inline int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : -1;
}

/// Whether this process counts its CPU allocations (the trainrun executable does).
inline bool tracking() {
  const auto& api = detail::tracker_api();
  return api.complete() && api.tracking() != 0;
}

/// Bytes of LibTorch CPU storage allocated since the tracker was installed and not yet freed
/// (current_bytes), the most at any moment since the last reset_peak() (peak_bytes), and
/// physical RAM (total_bytes). current/peak are -1 when not tracking. Counts what tensors ask
/// for (nbytes of their storages), not allocator overhead or memory outside LibTorch.
inline MemoryStats cpu_stats() {
  MemoryStats s;
  s.total_bytes = physical_memory_bytes();
  if (tracking()) {
    const auto& api = detail::tracker_api();
    s.current_bytes = api.current();
    s.peak_bytes = api.peak();
  }
  return s;
}

/// Sets the peak to the current bytes (torch.cuda.reset_peak_memory_stats); no-op when not
/// tracking.
inline void reset_peak() {
  if (tracking()) detail::tracker_api().reset_peak();
}

}  // namespace trainrun::v1::memory
