// The counting CPU allocator. It wraps whatever c10::GetAllocator(kCPU) returned at install
// time and keeps the requested size in a 64-byte header in front of the data it hands out, so
// a free needs no lookup: data = base + 64 keeps c10's 64-byte alignment, and the header also
// holds the wrapped allocator's context and deleter, so any allocator can be wrapped. The
// DataPtr's context is the data pointer itself, which keeps raw_allocate/raw_deallocate (used by
// oneDNN through ideep) working. Counting is two relaxed atomics per allocation and one per
// free. Storage allocated before install keeps its original deleter and is never counted, so
// the counters cannot drift negative.
#include "trainrun/core/memory.hpp"

#include <c10/core/Allocator.h>
#include <torch/version.h>

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

// LibTorch 2.3 made Allocator::allocate non-const and copy_data pure virtual.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define TRAINRUN_ALLOCATE_CONST
#define TRAINRUN_ALLOCATOR_COPY_DATA 1
#else
#define TRAINRUN_ALLOCATE_CONST const
#define TRAINRUN_ALLOCATOR_COPY_DATA 0
#endif

namespace {

constexpr size_t kHeader = 64;

struct Header {
  size_t bytes;
  void* context;
  c10::DeleterFnPtr deleter;
};
static_assert(sizeof(Header) <= kHeader, "the header must fit in front of 64-byte aligned data");

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};
c10::Allocator* g_wrapped = nullptr;

void tracked_delete(void* data) {
  if (data == nullptr) return;
  Header h;
  std::memcpy(&h, static_cast<char*>(data) - kHeader, sizeof h);
  g_current.fetch_sub(static_cast<int64_t>(h.bytes), std::memory_order_relaxed);
  h.deleter(h.context);
}

class TrackingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) TRAINRUN_ALLOCATE_CONST override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &tracked_delete, cpu};
    c10::DataPtr inner = g_wrapped->allocate(n + kHeader);
    char* base = static_cast<char*>(inner.get());
    const Header h{n, inner.get_context(), inner.get_deleter()};
    std::memcpy(base, &h, sizeof h);
    (void)inner.release_context();  // freed through h.deleter(h.context) from now on
    const int64_t now =
        g_current.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) + static_cast<int64_t>(n);
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return {base + kHeader, base + kHeader, &tracked_delete, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tracked_delete; }
#if TRAINRUN_ALLOCATOR_COPY_DATA
  // Plain host memory on both sides: c10's memcpy.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
};

TrackingAllocator g_tracker;

}  // namespace

// The exported C interface that trainrun/runtime/memory.hpp finds with dlsym. Default visibility
// (the project builds with hidden), and listed in core/memory.dynlist, which executables linking
// the core get as a link option, so exactly these four enter the executable's dynamic symbol table.
extern "C" {
__attribute__((visibility("default"))) int trainrun_memory_tracking(void) {
  return g_installed.load(std::memory_order_acquire) ? 1 : 0;
}
__attribute__((visibility("default"))) int64_t trainrun_memory_current_bytes(void) {
  return g_current.load(std::memory_order_relaxed);
}
__attribute__((visibility("default"))) int64_t trainrun_memory_peak_bytes(void) {
  return g_peak.load(std::memory_order_relaxed);
}
__attribute__((visibility("default"))) void trainrun_memory_reset_peak(void) {
  g_peak.store(g_current.load(std::memory_order_relaxed), std::memory_order_relaxed);
}
}

namespace trainrun::core {

void install_memory_tracker() {
  static const bool once = [] {
    g_wrapped = c10::GetAllocator(c10::DeviceType::CPU);
    // c10 replaces an allocator only with one of equal or higher priority (0 = the default
    // CPU allocator's). The highest keeps any later registration from silently bypassing the
    // counts; what was there before is what we forward to.
    c10::SetAllocator(c10::DeviceType::CPU, &g_tracker, std::numeric_limits<uint8_t>::max());
    const bool ok = c10::GetAllocator(c10::DeviceType::CPU) == &g_tracker;
    g_installed.store(ok, std::memory_order_release);
    return ok;
  }();
  (void)once;
}

bool keep_freed_memory() {
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                        "MALLOC_ARENA_MAX", "GLIBC_TUNABLES"})
    if (std::getenv(v) != nullptr) return false;
  if (const char* m = std::getenv("TRAINRUN_MALLOC"); m != nullptr && std::string(m) == "system")
    return false;
  // Setting the thresholds turns off glibc's dynamic threshold, whose ceiling is this same
  // 32 MiB (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit): blocks start there instead of growing to it.
  bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1 && ok;
  ok = mallopt(M_TOP_PAD, 1 << 30) == 1 && ok;
  return ok;
}

int64_t tracked_current_bytes() { return trainrun_memory_tracking() ? trainrun_memory_current_bytes() : -1; }
int64_t tracked_peak_bytes() { return trainrun_memory_tracking() ? trainrun_memory_peak_bytes() : -1; }
void reset_tracked_peak() { trainrun_memory_reset_peak(); }

}  // namespace trainrun::core
