#include "shm.hpp"

#include "reduce.hpp"

#include <trainrun/error.hpp>
#include <trainrun/error_text.hpp>
#include <trainrun/interfaces.hpp>
#include <trainrun/types.hpp>

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <mutex>
#include <new>
#include <random>
#include <sstream>
#include <thread>

namespace trainrun::plugins::shm {

using v1::Error;
using v1::what_of;
using v1::detail::cat;

namespace {

// Ring geometry, chosen by the receiver (it creates the segment; the sender reads both from
// the header). 8 x 128 KiB, 1 MiB per channel: a message of up to 1 MiB (the halves of a 2 MiB
// all-reduce at 2 ranks) fits the ring whole, so the sender never waits for the receiver to
// empty a slot before it has posted the whole message, and each slot hand-off (a cache line
// of the counters crossing cores) carries twice the 64 KiB it used to. Measured on 2 ranks of
// a 2-core AMD EPYC VM (2026-12-04, 3 alternated rounds, median of 40 iterations): the
// all-reduce 13.4-15.4 GB/s from 1 to 4 MiB against 8.5-12.6 with 8 x 64 KiB (and single copy
// from 1 MiB, the default then), 256 KiB slots as fast as 128 KiB; the ping-pong 25-27 GB/s at
// 1 MiB against 10.5-11.5. Earlier, on an Intel VM, 16 x 256 KiB (4 MiB) had been 5-10%
// slower at 2 MiB than 8 x 64 KiB. TRAINRUN_SHM_SLOT_BYTES / TRAINRUN_SHM_SLOTS override them
// (for measuring).
constexpr uint64_t kDefaultSlotBytes = 128 << 10;
constexpr uint32_t kDefaultSlots = 8;
// A waiting thread polls with pause instructions for this long, then with sched_yield() between
// polls (which lets another rank on the same core run when ranks outnumber cores, and costs
// nothing when they do not) until kYieldNs, and only then sleeps on the futex. A sleep costs a
// wake-up of 50-100 us on this VM: a single-copy send waits for its receiver for as long as the
// copy takes (300 us for 4 MiB), and sleeping through that made the all-reduce bimodal (3.4 to
// 6.8 GB/s from run to run at 16 MiB, 2 ranks); polling for 2 ms made it 7.0-7.5.
// TRAINRUN_SHM_SPIN_US / TRAINRUN_SHM_YIELD_US override them (for measuring).
constexpr int64_t kDefaultSpinNs = 50'000;
constexpr int64_t kDefaultYieldNs = 2'000'000;
// Each sleep on the futex is this long at most, so that timeouts, a peer's death and this
// rank's own abort are noticed within a few milliseconds even without a wake.
constexpr long kSleepNs = 5'000'000;

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
// Read by the peers with process_vm_readv at set-up: if they can, single copy works.
volatile uint64_t cma_probe = kMagic;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Shared futexes (no FUTEX_PRIVATE_FLAG): the word lives in memory mapped by two processes.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, long ns) {
  timespec ts{ns / 1'000'000'000, ns % 1'000'000'000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>* word) {
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
  int32_t dtype;        // c10::ScalarType
  uint32_t index;       // of this chunk in the message
  uint32_t count;       // chunks of the message (>= 1)
  uint64_t remote;      // single copy: the message's address in the sender (0: data in the slot)
  // Chunk 0 of a collective's message: a hash of the collective's description and its first
  // 95 characters (Op::order_text); 0 and empty for point-to-point messages.
  uint64_t order_hash;
  char order_text[96];
};

// FNV-1a, 64 bit: cheap, and two different descriptions colliding needs ~2^32 collectives.
uint64_t order_hash_of(const std::string& text) {
  if (text.empty()) return 0;
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  return h ? h : 1;
}

struct SegmentHeader {
  std::atomic<uint64_t> magic{0};  // set last by the creator
  uint32_t slots = 0;              // a power of two, so head % slots survives 2^32 wrap-around
  uint32_t cma = 0;  // 1: the receiver can read the sender's memory (single copy)
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

uint64_t env_u64(const char* name, uint64_t def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  return end && *end == 0 && x > 0 ? x : def;
}

std::string read_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::string errno_text(const char* call, const std::string& what) {
  return cat(call, "(", what, "): ", std::strerror(errno));
}

// kill(pid, 0) still succeeds on a zombie (a killed rank its launcher has not reaped yet), so
// the process state is read too, every tenth check.
bool process_alive(int64_t pid, bool thorough) {
  if (pid <= 0) return true;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  if (!thorough) return true;
  const std::string stat = read_line(cat("/proc/", pid, "/stat").c_str());
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return true;
  const char state = stat[close + 2];
  return state != 'Z' && state != 'X';
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(cur);
  return out;
}

std::string get_string(c10d::Store& store, const std::string& key) {
  const auto v = store.get(key);
  return std::string(v.begin(), v.end());
}
void set_string(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

}  // namespace

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Channel: one direction between this rank and a peer, and its queue of ops

struct Transport::Channel {
  bool is_send = false;
  int peer = -1;          // group rank
  std::string peer_name;  // "rank 1"
  std::string self_name;  // "rank 0"
  int64_t peer_pid = 0;
  std::string segment;  // shm_open name
  void* base = nullptr;
  size_t length = 0;
  SegmentHeader* header = nullptr;
  SlotHeader* slot_headers = nullptr;
  char* data = nullptr;
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;
  // This side's copy of head (sender) or tail (receiver); only the thread holding the
  // transport's progress_mu_ touches it.
  uint32_t position = 0;

  bool cma = false;           // single copy for messages of at least cma_min bytes
  uint64_t cma_min = 0;
  uint64_t cma_piece = 0;
  std::vector<char> staging;  // a recv's piece to reduce from (single copy)

  std::mutex mu;          // guards queue (posting threads push, the progressing thread pops)
  std::deque<Op> queue;   // front: the op in progress; deque keeps its address across pushes
  std::atomic<int> queued{0};
  Op* current = nullptr;  // the progressing thread's cache of &queue.front()
  // Single-copy sends whose slot is published, until the receiver has read them (released the
  // slot). Only the progressing thread touches it.
  std::deque<Op> inflight;
  std::string waiting_text;  // for messages

  ~Channel() {
    if (base) munmap(base, length);
  }

  void attach(void* b, size_t len) {
    base = b;
    length = len;
    header = static_cast<SegmentHeader*>(b);
    slot_headers = reinterpret_cast<SlotHeader*>(header + 1);
    data = static_cast<char*>(b) + header->data_offset;
    slots = header->slots;
    slot_bytes = header->slot_bytes;
    cma = header->cma != 0;
    cma_min = env_u64("TRAINRUN_SHM_CMA_MIN", kDefaultCmaMinBytes);
    cma_piece = env_u64("TRAINRUN_SHM_CMA_PIECE", kDefaultCmaPieceBytes);
    waiting_text = (is_send ? "for " + peer_name + " to receive" : "for " + peer_name + " to send");
  }

  // The op in progress. Only the progressing thread pops, and a push never moves the elements
  // of a deque, so the front is cached until popped and the lock is taken only to find it.
  Op* front() {
    if (current) return current;
    if (queued.load(std::memory_order_acquire) == 0) return nullptr;
    std::lock_guard<std::mutex> g(mu);
    current = queue.empty() ? nullptr : &queue.front();
    return current;
  }
  Op pop() {
    std::lock_guard<std::mutex> g(mu);
    Op op = std::move(queue.front());
    queue.pop_front();
    current = nullptr;
    queued.fetch_sub(1, std::memory_order_acq_rel);
    return op;
  }
  void push(Op op) {
    std::lock_guard<std::mutex> g(mu);
    queue.push_back(std::move(op));
    queued.fetch_add(1, std::memory_order_acq_rel);
  }

  // Throws when waiting cannot go on: the peer aborted or died, or the op's deadline passed.
  // `thorough` also reads the peer's process state (a zombie passes kill(pid, 0)).
  void check(const Op& op, bool thorough) const {
    if (header->aborted.value.load(std::memory_order_acquire))
      throw Error(cat(op.text, " failed: ", peer_name,
                      " aborted its end of the shared-memory channel (its communicator failed)"));
    if (!process_alive(peer_pid, thorough))
      throw Error(cat(op.text, " failed: ", peer_name, " (pid ", peer_pid,
                      ") has exited while this rank waited ", waiting_text));
    if (std::chrono::steady_clock::now() >= op.deadline)
      throw Error(cat(op.text, " timed out after ", op.timeout_s, " s waiting ", waiting_text,
                      " (shared memory)"));
  }

  // The counter this side waits on when blocked (a send: for a free slot, or for the receiver
  // to have read a single-copy message), and the value it waits to change from.
  Counter& blocking_counter() { return is_send ? header->tail : header->head; }
  uint32_t blocking_value() const {
    return is_send ? header->tail.value.load(std::memory_order_acquire) : position;
  }
  // A single-copy send is complete once the receiver has released its slot.
  bool acked(const Op& op) const {
    return static_cast<int32_t>(header->tail.value.load(std::memory_order_acquire) - op.next) >= 0;
  }

  static void publish(Counter& c, uint32_t v) {
    c.value.store(v, std::memory_order_seq_cst);
    if (c.sleepers.load(std::memory_order_seq_cst)) futex_wake(&c.value);
  }

  // Moves at most one chunk of `op`. Returns -1: blocked (nothing to do now), 0: moved a chunk,
  // 1: the op is complete, 2: a single-copy send is published and waits for the receiver.
  // Throws on a mismatched message.
  int step(Op& op) { return is_send ? step_send(op) : step_recv(op); }
  void read_remote(const Op& op, char* dst, uint64_t src, int64_t len) const;

  static void write_order(SlotHeader& h, const Op& op) {
    if (op.order_text.empty()) return;
    h.order_hash = order_hash_of(op.order_text);
    const size_t n = std::min(op.order_text.size(), sizeof h.order_text - 1);
    std::memcpy(h.order_text, op.order_text.data(), n);
    h.order_text[n] = 0;
  }

  int step_send(Op& op) {
    const int64_t bytes = static_cast<int64_t>(op.tensor.nbytes());
    if (op.count == 0)
      op.count = bytes == 0 ? 1 : static_cast<uint32_t>((bytes + slot_bytes - 1) / slot_bytes);
    const uint32_t h = position;
    // Full when the receiver has released exactly h - slots.
    if (header->tail.value.load(std::memory_order_acquire) == h - slots) return -1;
    const uint32_t s = h & (slots - 1);
    if (cma && static_cast<uint64_t>(bytes) >= cma_min) {
      slot_headers[s] = SlotHeader{bytes, 0, bytes, op.tag,
                                   static_cast<int32_t>(op.tensor.scalar_type()), 0, 1,
                                   reinterpret_cast<uint64_t>(op.tensor.data_ptr()), 0, {}};
      write_order(slot_headers[s], op);
      position = h + 1;
      publish(header->head, position);
      op.count = 1;
      op.next = position;  // acked() once tail reaches it
      return 2;
    }
    const uint32_t i = op.next;
    const int64_t off = static_cast<int64_t>(i) * static_cast<int64_t>(slot_bytes);
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(slot_bytes), bytes - off);
    slot_headers[s] = SlotHeader{bytes, off, len, op.tag,
                                 static_cast<int32_t>(op.tensor.scalar_type()), i, op.count, 0, 0,
                                 {}};
    if (i == 0) write_order(slot_headers[s], op);
    if (len > 0)
      std::memcpy(data + static_cast<size_t>(s) * slot_bytes,
                  static_cast<const char*>(op.tensor.data_ptr()) + off, len);
    position = h + 1;
    publish(header->head, position);
    return ++op.next == op.count ? 1 : 0;
  }

  int step_recv(Op& op) {
    const uint32_t t = position;
    if (header->head.value.load(std::memory_order_acquire) == t) return -1;
    const uint32_t s = t & (slots - 1);
    const SlotHeader h = slot_headers[s];
    if (op.count == 0) {
      const int64_t bytes = static_cast<int64_t>(op.tensor.nbytes());
      const auto dtype = op.tensor.scalar_type();
      TR_CHECK(h.index == 0, op.text, " failed: the shared-memory channel from ", peer_name,
               " is out of step (chunk ", h.index, " of ", h.count, " where a message starts)");
      // Before the tag and size: a collective issued out of order usually differs in those
      // too, and its description says more. Messages of point-to-point ops carry none.
      if (!op.order_text.empty() && h.order_hash != 0 &&
          h.order_hash != order_hash_of(op.order_text)) {
        std::string theirs(h.order_text, strnlen(h.order_text, sizeof h.order_text));
        throw CollectiveMismatch(cat(op.text, " failed: ", peer_name, " sent a message of ",
                                     theirs, " where this rank runs ", op.order_text),
                                 peer, std::move(theirs));
      }
      if (h.tag != op.tag || h.total_bytes != bytes || h.dtype != static_cast<int32_t>(dtype)) {
        const auto their = static_cast<c10::ScalarType>(h.dtype);
        const int64_t esize = static_cast<int64_t>(c10::elementSize(their));
        throw Error(cat(op.text, " failed: the next message ", peer_name, " sent to ", self_name,
                        " is ", v1::dtype_name(their), " x ", h.total_bytes / esize, ", ",
                        h.total_bytes, " B, tag ", h.tag, ", where this recv expects ",
                        v1::dtype_name(dtype), " x ", op.tensor.numel(), ", ", bytes, " B, tag ",
                        op.tag, ". Between two ranks of one machine, send/recv go through shared "
                        "memory and are matched in posting order: the n-th recv from a peer must "
                        "match the n-th send of that peer to this rank in tag, dtype and size"));
      }
      op.count = h.count;
    }
    if (h.remote != 0) {
      // Single copy: one piece per step, straight from the sender's memory; the slot is
      // released (the sender's op completes) after the last piece.
      const int64_t done = static_cast<int64_t>(op.piece);
      const int64_t len = std::min<int64_t>(static_cast<int64_t>(cma_piece), h.len - done);
      char* dst = static_cast<char*>(op.tensor.data_ptr()) + done;
      if (!op.reduce) {
        read_remote(op, dst, h.remote + done, len);
      } else {
        if (staging.size() < static_cast<size_t>(len)) staging.resize(len);
        read_remote(op, staging.data(), h.remote + done, len);
        comm::reduce_bytes(dst, staging.data(), len, op.tensor.scalar_type(), *op.reduce);
      }
      op.piece += len;
      if (static_cast<int64_t>(op.piece) < h.len) return 0;
    } else if (h.len > 0) {
      char* dst = static_cast<char*>(op.tensor.data_ptr()) + h.offset;
      const char* src = data + static_cast<size_t>(s) * slot_bytes;
      if (!op.reduce)
        std::memcpy(dst, src, h.len);
      else
        comm::reduce_bytes(dst, src, h.len, op.tensor.scalar_type(), *op.reduce);
    }
    position = t + 1;
    publish(header->tail, position);
    return ++op.next == op.count ? 1 : 0;
  }
};

void Transport::Channel::read_remote(const Op& op, char* dst, uint64_t src, int64_t len) const {
  while (len > 0) {
    iovec local{dst, static_cast<size_t>(len)};
    iovec remote{reinterpret_cast<void*>(src), static_cast<size_t>(len)};
    const ssize_t n = process_vm_readv(static_cast<pid_t>(peer_pid), &local, 1, &remote, 1, 0);
    if (n <= 0)
      throw Error(cat(op.text, " failed: reading ", peer_name, "'s memory (pid ", peer_pid,
                      ", single copy) failed: ", n < 0 ? std::strerror(errno) : "nothing read"));
    dst += n;
    src += static_cast<uint64_t>(n);
    len -= n;
  }
}

struct Transport::Finished {
  Op op;
  std::exception_ptr error;
};

// ---------------------------------------------------------------------------------------------
// Progress

bool Transport::pass(std::vector<Finished>& finished, bool check_liveness, int round) {
  bool moved = false;
  for (Channel* c : channels_) {
    if (!c->inflight.empty()) {
      Op& f = c->inflight.front();
      std::exception_ptr error;
      bool acked = false;
      try {
        if (aborted_.load(std::memory_order_relaxed))
          throw Error(f.text + " failed: the communicator was aborted");
        acked = c->acked(f);
        if (!acked && check_liveness) c->check(f, round % 10 == 0);
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(Error(what_of(e)));
      }
      if (acked || error) {
        moved = true;
        finished.push_back({std::move(f), error});
        c->inflight.pop_front();
      }
    }
    Op* op = c->front();
    if (!op) continue;
    int r = -1;
    std::exception_ptr error;
    try {
      if (aborted_.load(std::memory_order_relaxed))
        throw Error(op->text + " failed: the communicator was aborted");
      r = c->step(*op);
      if (r < 0 && check_liveness) c->check(*op, round % 10 == 0);
    } catch (const CollectiveMismatch&) {
      error = std::current_exception();
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(Error(what_of(e)));
    }
    if (r < 0 && !error) continue;
    moved = true;
    if (r == 1 || error) finished.push_back({c->pop(), error});
    else if (r == 2) c->inflight.push_back(c->pop());
  }
  return moved;
}

bool Transport::progress(bool check_liveness, int round) {
  std::unique_lock<std::mutex> lk(progress_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  std::vector<Finished> finished;
  bool moved = false;
  // Passes until nothing moves or an op ends (its waiter may want to act on it at once).
  while (pass(finished, check_liveness, round)) {
    moved = true;
    check_liveness = false;
    if (!finished.empty()) break;
  }
  lk.unlock();
  for (auto& f : finished) {
    pending_.fetch_sub(1, std::memory_order_acq_rel);
    auto done = std::move(f.op.done);
    f.op.tensor.reset();  // the caller may free the buffer once done() has run
    done(f.error);
  }
  return moved;
}

// Sleeps until the counter the channel of the oldest queued op waits on changes, or `ns` pass
// (500 us at most when several channels have ops: the oldest op is what a waiter usually waits
// for, but not always).
void Transport::sleep_on_blocked(long ns) {
  Channel* pick = nullptr;
  uint32_t expected = 0;
  int busy = 0;
  {
    std::unique_lock<std::mutex> lk(progress_mu_, std::try_to_lock);
    if (lk.owns_lock()) {
      uint64_t oldest = UINT64_MAX;
      for (Channel* c : channels_) {
        const Op* op = !c->inflight.empty() ? &c->inflight.front() : c->front();
        if (!op) continue;
        ++busy;
        if (op->seq < oldest) {
          oldest = op->seq;
          pick = c;
          expected = c->blocking_value();
        }
      }
    }
  }
  if (!pick) {
    // Nothing queued here (the op is still with gloo-cpu's worker) or another thread is
    // copying: wait for the next post instead.
    posted_sleepers_.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t p = posted_.load(std::memory_order_seq_cst);
    futex_wait(&posted_, p, std::min<long>(ns, 200'000));
    posted_sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    return;
  }
  if (busy > 1) ns = std::min<long>(ns, 500'000);
  Counter& c = pick->blocking_counter();
  // Dekker with publish(): either this sees the new value, or publish() sees sleepers > 0.
  c.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (c.value.load(std::memory_order_seq_cst) == expected && !aborted_)
    futex_wait(&c.value, expected, ns);
  c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void Transport::wait_until(const std::function<bool()>& done,
                           std::chrono::steady_clock::time_point deadline) {
  static const int64_t spin_ns =
      static_cast<int64_t>(env_u64("TRAINRUN_SHM_SPIN_US", kDefaultSpinNs / 1000)) * 1000;
  static const int64_t yield_ns =
      static_cast<int64_t>(env_u64("TRAINRUN_SHM_YIELD_US", kDefaultYieldNs / 1000)) * 1000;
  waiting_.fetch_add(1, std::memory_order_acq_rel);
  int64_t idle_since = 0;  // 0: the last poll moved something
  int64_t idle = 0;        // ns since then, read every 16 polls
  int polls = 0, round = 0;
  while (!done()) {
    // Liveness (deadlines, a dead or aborted peer) is checked once polling is over.
    if (idle_since != 0 && (++polls & 15) == 0) idle = now_ns() - idle_since;
    const bool sleepy = idle >= yield_ns;
    if (progress(sleepy, round)) {
      idle_since = idle = 0;
      continue;
    }
    if (idle_since == 0) {
      idle_since = now_ns();
      polls = 0;
    }
    if (!sleepy) {
      if (idle < spin_ns) cpu_relax();
      else sched_yield();
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    sleep_on_blocked(kSleepNs);
    ++round;
  }
  last_wait_ns_.store(now_ns(), std::memory_order_release);
  waiting_.fetch_sub(1, std::memory_order_acq_rel);
}

void Transport::background() {
  // Idle (nothing pending for 100 ticks): sleeps until post() wakes it. Otherwise ticks every
  // millisecond without being woken, so that a busy communicator pays no wake-up per post; on
  // each tick it drives the ops if no thread has been waiting on them for a millisecond.
  int quiet_ticks = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(bg_mu_);
      if (pending_.load() == 0 && (quiet_ticks >= 100 || bg_stopping_)) {
        if (bg_stopping_) return;
        bg_idle_.store(true);
        bg_cv_.wait(lk, [&] { return bg_stopping_ || pending_.load() > 0; });
        bg_idle_.store(false);
        quiet_ticks = 0;
        continue;
      }
      bg_cv_.wait_for(lk, std::chrono::milliseconds(1));
      if (pending_.load() == 0) {
        ++quiet_ticks;
        continue;
      }
      quiet_ticks = 0;
      if (!(bg_stopping_ && aborted_) &&
          (waiting_.load() > 0 ||
           now_ns() - last_wait_ns_.load(std::memory_order_acquire) < 1'000'000))
        continue;
    }
    // Drive until nothing is pending or a waiter takes over.
    int round = 0;
    while (pending_.load() > 0 && waiting_.load() == 0) {
      if (progress(true, round++)) continue;
      sleep_on_blocked(1'000'000);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Set-up

namespace {

// What makes two ranks able to share memory and see each other's pid: the same machine (host
// name and boot id) and the same pid namespace. A rank in another container with its own
// /dev/shm passes this test but fails to open the segment, and falls back to TCP then.
std::string machine_identity() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown-host");
  char ns[256] = {0};
  const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  if (n > 0) ns[n] = 0;
  return cat(host, '\t', read_line("/proc/sys/kernel/random/boot_id"), '\t', ns);
}

std::string random_id() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << rd() << rd() << getpid();
  return os.str();
}

// "host \t boot id \t pid namespace \t pid \t probe address", as publish() writes it.
bool parse_who(const std::string& who, std::string& machine, int64_t& pid, uint64_t& probe) {
  const auto b = who.rfind('\t');
  if (b == std::string::npos || b == 0) return false;
  const auto a = who.rfind('\t', b - 1);
  if (a == std::string::npos) return false;
  machine = who.substr(0, a);
  pid = std::atoll(who.c_str() + a + 1);
  probe = std::strtoull(who.c_str() + b + 1, nullptr, 10);
  return true;
}

// Step 1 of the set-up, one receiving segment: created (exclusively), sized, its memory
// reserved by posix_fallocate (so a full /dev/shm is a fallback to TCP now instead of a SIGBUS
// at the first copy) and mapped. MAP_FAILED, with `status` saying why, when any of it fails
// (the name is unlinked again if it was created).
void* create_segment(const std::string& name, size_t length, std::string& status) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  void* b = MAP_FAILED;
  if (fd < 0) {
    status = errno_text("shm_open", name);
    return b;
  }
  int rc = 0;
  if (ftruncate(fd, static_cast<off_t>(length)) != 0) {
    status = errno_text("ftruncate", name);
  } else if ((rc = posix_fallocate(fd, 0, static_cast<off_t>(length))) != 0) {
    errno = rc;
    status = errno_text("posix_fallocate", name) + " (is /dev/shm full?)";
  } else {
    b = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (b == MAP_FAILED) status = errno_text("mmap", name);
  }
  close(fd);
  if (b == MAP_FAILED) shm_unlink(name.c_str());
  return b;
}

// Step 2 of the set-up, one sending segment the peer created: opened, checked to be the
// channel to `sender` (magic, size), mapped, and unlinked (this rank maps it last). Its
// address and length, or MAP_FAILED with `status` saying why.
void* map_segment(const std::string& name, int sender, size_t& len, std::string& status) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  struct stat st {};
  void* out = MAP_FAILED;
  if (fd < 0) {
    status = errno_text("shm_open", name) + " (another /dev/shm than the peer's?)";
  } else if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(SegmentHeader)) {
    status = "segment " + name + " has the wrong size";
  } else {
    len = static_cast<size_t>(st.st_size);
    void* b = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (b == MAP_FAILED) {
      status = errno_text("mmap", name);
    } else {
      auto* h = static_cast<SegmentHeader*>(b);
      if (h->magic.load(std::memory_order_acquire) != kMagic || h->total_bytes != len ||
          h->sender != sender) {
        munmap(b, len);
        status = "segment " + name + " is not the expected channel";
      } else {
        out = b;
      }
    }
  }
  if (fd >= 0) {
    close(fd);
    shm_unlink(name.c_str());
  }
  return out;
}

}  // namespace

void Transport::publish(c10d::Store& store, const std::string& prefix, int rank, bool enabled) {
  if (rank == 0) set_string(store, prefix + "shm/id", random_id());
  // Where Yama restricts ptrace to descendants (ptrace_scope 1), let the launcher's other
  // children (this rank's peers on this machine) read this process's memory for single copy.
  // Harmless where Yama is absent (EINVAL) or stricter (the peers fall back to two copies).
  if (enabled) prctl(PR_SET_PTRACER, static_cast<unsigned long>(getppid()), 0, 0, 0);
  set_string(store, prefix + "shm/who/" + std::to_string(rank),
             enabled ? cat(machine_identity(), '\t', getpid(), '\t',
                           reinterpret_cast<uintptr_t>(&cma_probe))
                     : std::string("off"));
}

Transport::Transport(std::shared_ptr<c10d::Store> store, Config config)
    : store_(std::move(store)), config_(std::move(config)) {
  const int size = static_cast<int>(config_.global_ranks.size());
  const int rank = config_.rank;
  out_.resize(size);
  in_.resize(size);
  const std::string where = cat(config_.backend, ": group ", config_.group, ": ",
                                config_.peer_name(rank), ": shared-memory set-up: ");
  c10d::Store& st = *store_;
  const std::string& prefix = config_.prefix;
  auto pair_key = [&](const char* what, int from, int to) {
    return cat(prefix, "shm/", what, "/", from, "-", to);
  };
  // Store waits are bounded by the store's own timeout (the rendezvous timeout).
  auto get = [&](const std::string& key, int peer) {
    try {
      return get_string(st, key);
    } catch (const std::exception& e) {
      TR_FAIL(where, "no answer from ", config_.peer_name(peer), " (", key, "): ", what_of(e));
    }
  };

  const std::string mine = get(prefix + "shm/who/" + std::to_string(rank), rank);
  if (mine == "off") return;
  std::string machine;
  int64_t my_pid = 0;
  uint64_t my_probe = 0;
  if (!parse_who(mine, machine, my_pid, my_probe)) return;
  const std::string id = get(prefix + "shm/id", 0);
  std::vector<int64_t> pid(size, 0);
  std::vector<uint64_t> probe(size, 0);
  std::vector<int> local;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const std::string who = get(prefix + "shm/who/" + std::to_string(p), p);
    std::string theirs;
    if (who == "off" || !parse_who(who, theirs, pid[p], probe[p]) || theirs != machine) continue;
    local.push_back(p);
  }
  // Single copy from peer p works if this rank can read p's probe (same user, no ptrace
  // restriction in the way, no seccomp filter refusing process_vm_readv).
  const char* cma_env = std::getenv("TRAINRUN_SHM_CMA");
  const bool cma_wanted = cma_env && std::string(cma_env) == "1";
  std::string cma_off;  // why single copy is off for some peer (the first reason)
  auto cma_from = [&](int p) {
    if (!cma_wanted) return false;
    uint64_t value = 0;
    iovec local_iov{&value, sizeof(value)};
    iovec remote_iov{reinterpret_cast<void*>(probe[p]), sizeof(value)};
    const ssize_t n = process_vm_readv(static_cast<pid_t>(pid[p]), &local_iov, 1, &remote_iov, 1, 0);
    if (n == static_cast<ssize_t>(sizeof(value)) && value == kMagic) return true;
    if (cma_off.empty())
      cma_off = n < 0 ? cat("process_vm_readv from ", config_.peer_name(p), ": ", std::strerror(errno))
                      : cat("process_vm_readv from ", config_.peer_name(p), " read the wrong bytes");
    return false;
  };
  if (local.empty()) return;

  const uint64_t slot_bytes = env_u64("TRAINRUN_SHM_SLOT_BYTES", kDefaultSlotBytes);
  uint64_t slots = env_u64("TRAINRUN_SHM_SLOTS", kDefaultSlots);
  while (slots & (slots - 1)) slots &= slots - 1;  // round down to a power of two
  const uint64_t page = 4096;
  const uint64_t data_offset =
      (sizeof(SegmentHeader) + slots * sizeof(SlotHeader) + page - 1) / page * page;
  const size_t length = data_offset + slots * slot_bytes;
  auto segment_name = [&](int from, int to) {
    return cat("/trainrun-", id, "-", config_.global_ranks[from], "-", config_.global_ranks[to]);
  };
  auto make_channel = [&](bool is_send, int peer) {
    auto c = std::make_unique<Channel>();
    c->is_send = is_send;
    c->peer = peer;
    c->peer_name = config_.peer_name(peer);
    c->self_name = config_.peer_name(rank);
    c->peer_pid = pid[peer];
    c->segment = is_send ? segment_name(rank, peer) : segment_name(peer, rank);
    return c;
  };
  std::vector<std::string> fallbacks;

  // 1. The segments this rank receives in. posix_fallocate reserves their memory now, so a
  //    full /dev/shm is a fallback to TCP here instead of a SIGBUS at the first copy.
  for (int p : local) {
    auto c = make_channel(false, p);
    std::string status = "ok";
    void* b = create_segment(c->segment, length, status);
    if (b != MAP_FAILED) {
      auto* h = new (b) SegmentHeader();
      h->slots = static_cast<uint32_t>(slots);
      h->slot_bytes = slot_bytes;
      h->data_offset = data_offset;
      h->total_bytes = length;
      h->sender = config_.global_ranks[p];
      h->receiver = config_.global_ranks[rank];
      h->cma = cma_from(p) ? 1 : 0;
      for (uint64_t s = 0; s < slots; ++s) new (reinterpret_cast<SlotHeader*>(h + 1) + s) SlotHeader{};
      h->magic.store(kMagic, std::memory_order_release);
      c->attach(b, length);
      in_[p] = std::move(c);
    } else {
      fallbacks.push_back(cat("recv from ", config_.peer_name(p), ": ", status));
    }
    set_string(st, pair_key("seg", p, rank), status);
  }

  // 2. The segments this rank sends in, created by the peers in step 1; the last of the two to
  //    map a segment (this rank) unlinks it, so a crash from here on leaves nothing behind.
  for (int p : local) {
    const std::string theirs = get(pair_key("seg", rank, p), p);
    auto c = make_channel(true, p);
    std::string status = "ok";
    if (theirs != "ok") {
      status = config_.peer_name(p) + " could not create it: " + theirs;
    } else {
      size_t len = 0;
      void* b = map_segment(c->segment, config_.global_ranks[rank], len, status);
      if (b != MAP_FAILED) c->attach(b, len);
    }
    if (status == "ok")
      out_[p] = std::move(c);
    else
      fallbacks.push_back(cat("send to ", config_.peer_name(p), ": ", status));
    set_string(st, pair_key("map", rank, p), status);
  }

  // 3. Both ends agree on every direction: one the sender could not map goes over TCP.
  for (int p : local) {
    const std::string theirs = get(pair_key("map", p, rank), p);
    if (!in_[p]) continue;
    shm_unlink(in_[p]->segment.c_str());  // normally gone already (ENOENT)
    if (theirs != "ok") {
      in_[p].reset();
      if (theirs.rfind(config_.peer_name(rank) + " could not create it", 0) != 0)
        fallbacks.push_back(cat("recv from ", config_.peer_name(p), ": ", theirs));
    }
  }
  for (int p = 0; p < size; ++p)
    for (auto* side : {&out_, &in_})
      if ((*side)[p]) channels_.push_back((*side)[p].get());
  if (!cma_off.empty())
    std::cerr << config_.backend << ": group " << config_.group << ": "
              << config_.peer_name(rank) << ": single copy is unavailable (" << cma_off
              << "); messages of " << (kDefaultCmaMinBytes >> 20)
              << " MiB and more take two copies through shared memory" << std::endl;
  for (const auto& f : fallbacks)
    std::cerr << config_.backend << ": group " << config_.group << ": "
              << config_.peer_name(rank) << ": " << f << "; using TCP for this direction"
              << std::endl;
}

Transport::~Transport() { stop(); }

bool Transport::can_send(int peer) const {
  return peer >= 0 && peer < static_cast<int>(out_.size()) && out_[peer];
}
bool Transport::can_recv(int peer) const {
  return peer >= 0 && peer < static_cast<int>(in_.size()) && in_[peer];
}
int Transport::single_copy_peers() const {
  int n = 0;
  for (const auto& c : out_) n += c && c->cma;
  return n;
}

int Transport::peers() const {
  int n = 0;
  for (size_t p = 0; p < out_.size(); ++p) n += out_[p] && in_[p];
  return n;
}

void Transport::post(bool is_send, int peer, Op op) {
  Channel& c = is_send ? *out_.at(peer) : *in_.at(peer);
  op.seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
  c.push(std::move(op));
  pending_.fetch_add(1, std::memory_order_acq_rel);
  if (!bg_started_.load(std::memory_order_acquire) || bg_idle_.load()) {
    std::lock_guard<std::mutex> g(bg_mu_);
    if (!bg_.joinable() && !bg_stopping_) {
      bg_ = std::thread([this] { background(); });
      bg_started_.store(true, std::memory_order_release);
    }
    bg_cv_.notify_one();
  }
  posted_.fetch_add(1, std::memory_order_seq_cst);
  if (posted_sleepers_.load(std::memory_order_seq_cst)) futex_wake(&posted_);
}

void Transport::abort() {
  aborted_ = true;
  for (Channel* c : channels_) {
    // The peer's thread may sleep on either word of this channel, as may this rank's own
    // waiters: all wake and see the flag.
    c->header->aborted.value.store(1, std::memory_order_seq_cst);
    futex_wake(&c->header->head.value);
    futex_wake(&c->header->tail.value);
  }
  posted_.fetch_add(1, std::memory_order_release);
  futex_wake(&posted_);
  std::lock_guard<std::mutex> g(bg_mu_);
  bg_cv_.notify_all();
}

void Transport::stop() {
  {
    std::lock_guard<std::mutex> g(bg_mu_);
    bg_stopping_ = true;
  }
  bg_cv_.notify_all();
  if (bg_.joinable()) bg_.join();
}

}  // namespace trainrun::plugins::shm
