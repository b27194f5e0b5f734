#pragma once
// The shared-memory channel's layout, as both processes map it (shm.hpp describes the protocol):
// the segment's header with its counters, one header per slot, and the futex calls on the
// counters. Private to the transport (shm.cpp, shm_channel.cpp, shm_setup.cpp).
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>

namespace trainrun::plugins::shm {

// Single copy (Linux cross-memory attach, process_vm_readv), off unless TRAINRUN_SHM_CMA=1: a
// message of at least this many bytes is not copied through the slots; its slot carries the
// sender's address and the receiver reads the sender's memory directly, in pieces of
// kCmaPieceBytes (reduced from an L2-sized staging buffer when the recv reduces). One copy
// instead of two, as UCX's cma transport under MPICH does, but one core then does the whole
// copy while the sender waits, where with two copies each side copies on its own core. On an
// Intel VM (2026-12-03, 8 x 64 KiB slots) it helped the all-reduce from 1 to 8 MiB (2 MiB:
// 1.19-1.24x MPICH against 1.04-1.12x) and lost from 32 MiB on; on an AMD EPYC VM
// (2026-12-04) two copies through larger slots won at every size: the all-reduce 1.71-1.91x
// MPICH at 1-4 MiB and 2.44-3.80x at 16-32 MiB (8 x 128 KiB) against 1.12-1.47x and
// 1.33-1.87x (8 x 64 KiB, single copy from 1 MiB); with 8 x 256 KiB, single copy from 4 MiB
// gave 6.9-8.0 GB/s at 8 MiB against 12.5-13.4 without; the ping-pong 12-15 GB/s at 16 MiB
// against 4.8-5.0.
// TRAINRUN_SHM_CMA=1 turns it on; TRAINRUN_SHM_CMA_MIN / _PIECE set its threshold and piece
// (for measuring).
constexpr uint64_t kDefaultCmaMinBytes = 1 << 20;
constexpr uint64_t kDefaultCmaPieceBytes = 256 << 10;

constexpr uint64_t kMagic = 0x32686d736e727274ull;  // "trrnshm2"

// Shared futexes (no FUTEX_PRIVATE_FLAG): the word lives in memory mapped by two processes.
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, long ns) {
  timespec ts{ns / 1'000'000'000, ns % 1'000'000'000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
inline void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// One counter per cache line, so the sender's and the receiver's writes never share one.
struct alignas(64) Counter {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> sleepers{0};  // > 0 while the other side sleeps (or is about to) on value
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain words");

// Written by the sender before it publishes the slot (head), read by the receiver after.
struct alignas(64) SlotHeader {
  int64_t total_bytes;  // of the whole message
  int64_t offset;       // of this slot's chunk in the message
  int64_t len;          // of this chunk
  int32_t tag;
  int32_t dtype;    // c10::ScalarType
  uint32_t index;   // of this chunk in the message
  uint32_t count;   // chunks of the message (>= 1)
  uint64_t remote;  // single copy: the message's address in the sender (0: data in the slot)
  // Chunk 0 of a collective's message: a hash of the collective's description and its first
  // 95 characters (Op::order_text); 0 and empty for point-to-point messages.
  uint64_t order_hash;
  char order_text[96];
};

struct SegmentHeader {
  std::atomic<uint64_t> magic{0};  // set last by the creator
  uint32_t slots = 0;              // a power of two, so head % slots survives 2^32 wrap-around
  uint32_t cma = 0;                // 1: the receiver can read the sender's memory (single copy)
  uint64_t slot_bytes = 0;
  uint64_t data_offset = 0;  // of slot 0's payload, page-aligned
  uint64_t total_bytes = 0;  // of the segment
  int32_t sender = -1;       // global ranks, for checking
  int32_t receiver = -1;
  Counter head;     // slots published by the sender
  Counter tail;     // slots released by the receiver
  Counter aborted;  // value 1: one side's communicator failed
  // SlotHeader[slots] follows
};

// The tunables' overrides, for measuring: anything but a positive integer keeps the default.
inline uint64_t env_u64(const char* name, uint64_t def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  return end && *end == 0 && x > 0 ? x : def;
}

inline std::string read_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

}  // namespace trainrun::plugins::shm
