#include "shm.hpp"

#include <trainrun/error.hpp>
#include <trainrun/interfaces.hpp>
#include <trainrun/strategy_helpers.hpp>

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
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
using v1::detail::cat;

namespace {

// Ring geometry, chosen by the receiver (it creates the segment; the sender reads both from
// the header). Measured on 2 ranks of a 2-core machine: 256 KiB slots keep a slot in L2 while
// it is copied in and out, and 16 of them let a sender run ahead of a receiver that is briefly
// descheduled. TRAINRUN_SHM_SLOT_BYTES / TRAINRUN_SHM_SLOTS override them (for measuring).
constexpr uint64_t kDefaultSlotBytes = 256 << 10;
constexpr uint32_t kDefaultSlots = 16;
// Busy-wait this many pause instructions before sleeping on the futex: a pipelined stream of
// chunks then never pays a sleep and a wake per slot. TRAINRUN_SHM_SPINS overrides it (for
// measuring; yielding the CPU between polls instead was measured slower, 2-4x).
constexpr int kDefaultSpins = 4000;
// Each sleep on the futex is this long at most, so that timeouts, a peer's death and this
// rank's own abort are noticed within a few milliseconds even without a wake.
constexpr long kSleepNs = 5'000'000;

constexpr uint64_t kMagic = 0x31686d736e727274ull;  // "trrnshm1"

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
};

struct SegmentHeader {
  std::atomic<uint64_t> magic{0};  // set last by the creator
  uint32_t slots = 0;              // a power of two, so head % slots survives 2^32 wrap-around
  uint32_t reserved = 0;
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

std::string what_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Channel: one direction between this rank and a peer, and the thread that runs its ops

struct Transport::Channel {
  bool is_send = false;
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
  uint32_t position = 0;  // this side's copy of head (sender) or tail (receiver); thread-owned

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Op> queue;
  bool stopping = false;
  std::atomic<bool> aborted{false};  // this rank's communicator failed
  std::thread thread;

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
  }

  void loop() {
    for (;;) {
      Op op;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [this] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        op = std::move(queue.front());
        queue.pop_front();
      }
      std::exception_ptr error;
      try {
        if (aborted) throw Error(op.text + " failed: the communicator was aborted");
        is_send ? run_send(op) : run_recv(op);
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(Error(what_of(e)));
      }
      auto done = std::move(op.done);
      op.tensor.reset();  // the caller may free the buffer once done() has run
      done(error);
    }
  }

  // Throws when waiting cannot go on: this rank aborted, the peer aborted or died, or the
  // operation's deadline passed.
  void check(const Op& op, const char* waiting_for, int round) {
    if (aborted) throw Error(op.text + " failed: the communicator was aborted");
    if (header->aborted.value.load(std::memory_order_acquire))
      throw Error(cat(op.text, " failed: ", peer_name,
                      " aborted its end of the shared-memory channel (its communicator failed)"));
    if (!process_alive(peer_pid, round % 10 == 0))
      throw Error(cat(op.text, " failed: ", peer_name, " (pid ", peer_pid,
                      ") has exited while this rank waited ", waiting_for));
    if (std::chrono::steady_clock::now() >= op.deadline)
      throw Error(cat(op.text, " timed out after ", op.timeout_s, " s waiting ", waiting_for,
                      " (shared memory)"));
  }

  // Returns once c.value != expected: spins, then sleeps on the futex in short rounds.
  void wait_while(Counter& c, uint32_t expected, const Op& op, const char* waiting_for) {
    static const int spins = static_cast<int>(env_u64("TRAINRUN_SHM_SPINS", kDefaultSpins));
    for (int i = 0; i < spins; ++i) {
      if (c.value.load(std::memory_order_acquire) != expected) return;
      cpu_relax();
    }
    for (int round = 0;; ++round) {
      // Dekker with publish(): either this sees the new value, or publish() sees sleepers > 0
      // and wakes; FUTEX_WAIT itself returns at once if the value has changed meanwhile.
      c.sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (c.value.load(std::memory_order_seq_cst) == expected && !aborted)
        futex_wait(&c.value, expected, kSleepNs);
      c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      if (c.value.load(std::memory_order_acquire) != expected) return;
      check(op, waiting_for, round);
    }
  }

  static void publish(Counter& c, uint32_t v) {
    c.value.store(v, std::memory_order_seq_cst);
    if (c.sleepers.load(std::memory_order_seq_cst)) futex_wake(&c.value);
  }

  void run_send(const Op& op) {
    const auto* src = static_cast<const char*>(op.tensor.data_ptr());
    const int64_t bytes = static_cast<int64_t>(op.tensor.nbytes());
    const uint32_t count =
        bytes == 0 ? 1 : static_cast<uint32_t>((bytes + slot_bytes - 1) / slot_bytes);
    const std::string waiting = "for " + peer_name + " to receive";
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t h = position;
      // Full when the receiver has released exactly h - slots.
      wait_while(header->tail, h - slots, op, waiting.c_str());
      const uint32_t s = h & (slots - 1);
      const int64_t off = static_cast<int64_t>(i) * static_cast<int64_t>(slot_bytes);
      const int64_t len = std::min<int64_t>(static_cast<int64_t>(slot_bytes), bytes - off);
      slot_headers[s] = SlotHeader{bytes, off, len, op.tag,
                                   static_cast<int32_t>(op.tensor.scalar_type()), i, count};
      if (len > 0) std::memcpy(data + static_cast<size_t>(s) * slot_bytes, src + off, len);
      position = h + 1;
      publish(header->head, position);
    }
  }

  void run_recv(const Op& op) {
    auto* dst = static_cast<char*>(op.tensor.data_ptr());
    const int64_t bytes = static_cast<int64_t>(op.tensor.nbytes());
    const auto dtype = op.tensor.scalar_type();
    const std::string waiting = "for " + peer_name + " to send";
    uint32_t t = position;
    wait_while(header->head, t, op, waiting.c_str());
    const SlotHeader first = slot_headers[t & (slots - 1)];
    TR_CHECK(first.index == 0, op.text, " failed: the shared-memory channel from ", peer_name,
             " is out of step (chunk ", first.index, " of ", first.count,
             " where a message starts)");
    if (first.tag != op.tag || first.total_bytes != bytes || first.dtype != static_cast<int32_t>(dtype)) {
      const auto their = static_cast<c10::ScalarType>(first.dtype);
      const int64_t esize = static_cast<int64_t>(c10::elementSize(their));
      throw Error(cat(op.text, " failed: the next message ", peer_name, " sent to ", self_name,
                      " is ", v1::dtype_name(their), " x ", first.total_bytes / esize, ", ",
                      first.total_bytes, " B, tag ", first.tag, ", where this recv expects ",
                      v1::dtype_name(dtype), " x ", op.tensor.numel(), ", ", bytes, " B, tag ",
                      op.tag, ". Between two ranks of one machine, send/recv go through shared "
                      "memory and are matched in posting order: the n-th recv from a peer must "
                      "match the n-th send of that peer to this rank in tag, dtype and size"));
    }
    const std::string rest = "for " + peer_name + " to send the rest of the message";
    for (uint32_t i = 0; i < first.count; ++i) {
      if (i) wait_while(header->head, t, op, rest.c_str());
      const uint32_t s = t & (slots - 1);
      const SlotHeader& h = slot_headers[s];
      if (h.len > 0) std::memcpy(dst + h.offset, data + static_cast<size_t>(s) * slot_bytes, h.len);
      ++t;
      position = t;
      publish(header->tail, t);
    }
  }
};

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

}  // namespace

void Transport::publish(c10d::Store& store, const std::string& prefix, int rank, bool enabled) {
  if (rank == 0) set_string(store, prefix + "shm/id", random_id());
  set_string(store, prefix + "shm/who/" + std::to_string(rank),
             enabled ? cat(machine_identity(), '\t', getpid()) : std::string("off"));
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
  const std::string machine = mine.substr(0, mine.rfind('\t'));
  const std::string id = get(prefix + "shm/id", 0);
  std::vector<int64_t> pid(size, 0);
  std::vector<int> local;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const std::string who = get(prefix + "shm/who/" + std::to_string(p), p);
    const auto cut = who.rfind('\t');
    if (who == "off" || cut == std::string::npos || who.substr(0, cut) != machine) continue;
    pid[p] = std::atoll(who.c_str() + cut + 1);
    local.push_back(p);
  }
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
    const int fd = shm_open(c->segment.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    void* b = MAP_FAILED;
    if (fd < 0) {
      status = errno_text("shm_open", c->segment);
    } else {
      int rc = 0;
      if (ftruncate(fd, static_cast<off_t>(length)) != 0) {
        status = errno_text("ftruncate", c->segment);
      } else if ((rc = posix_fallocate(fd, 0, static_cast<off_t>(length))) != 0) {
        errno = rc;
        status = errno_text("posix_fallocate", c->segment) + " (is /dev/shm full?)";
      } else {
        b = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (b == MAP_FAILED) status = errno_text("mmap", c->segment);
      }
      close(fd);
    }
    if (b != MAP_FAILED) {
      auto* h = new (b) SegmentHeader();
      h->slots = static_cast<uint32_t>(slots);
      h->slot_bytes = slot_bytes;
      h->data_offset = data_offset;
      h->total_bytes = length;
      h->sender = config_.global_ranks[p];
      h->receiver = config_.global_ranks[rank];
      for (uint64_t s = 0; s < slots; ++s) new (reinterpret_cast<SlotHeader*>(h + 1) + s) SlotHeader{};
      h->magic.store(kMagic, std::memory_order_release);
      c->attach(b, length);
      in_[p] = std::move(c);
    } else {
      if (fd >= 0) shm_unlink(c->segment.c_str());
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
      const int fd = shm_open(c->segment.c_str(), O_RDWR, 0600);
      struct stat st {};
      if (fd < 0) {
        status = errno_text("shm_open", c->segment) + " (another /dev/shm than the peer's?)";
      } else if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(SegmentHeader)) {
        status = "segment " + c->segment + " has the wrong size";
      } else {
        const size_t len = static_cast<size_t>(st.st_size);
        void* b = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (b == MAP_FAILED) {
          status = errno_text("mmap", c->segment);
        } else {
          auto* h = static_cast<SegmentHeader*>(b);
          if (h->magic.load(std::memory_order_acquire) != kMagic || h->total_bytes != len ||
              h->sender != config_.global_ranks[rank]) {
            munmap(b, len);
            status = "segment " + c->segment + " is not the expected channel";
          } else {
            c->attach(b, len);
          }
        }
      }
      if (fd >= 0) {
        close(fd);
        shm_unlink(c->segment.c_str());
      }
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
int Transport::peers() const {
  int n = 0;
  for (size_t p = 0; p < out_.size(); ++p) n += out_[p] && in_[p];
  return n;
}

void Transport::post(bool is_send, int peer, Op op) {
  Channel& c = is_send ? *out_.at(peer) : *in_.at(peer);
  {
    std::lock_guard<std::mutex> g(c.mu);
    c.queue.push_back(std::move(op));
    if (!c.thread.joinable()) c.thread = std::thread([&c] { c.loop(); });
  }
  c.cv.notify_one();
}

void Transport::abort() {
  for (auto* side : {&out_, &in_})
    for (auto& c : *side) {
      if (!c) continue;
      {
        std::lock_guard<std::mutex> g(c->mu);
        c->aborted = true;
      }
      c->cv.notify_all();
      // The peer's thread of this channel sleeps on one of these two words, as may this
      // rank's own: both wake and see the flag.
      c->header->aborted.value.store(1, std::memory_order_seq_cst);
      futex_wake(&c->header->head.value);
      futex_wake(&c->header->tail.value);
    }
}

void Transport::stop() {
  for (auto* side : {&out_, &in_})
    for (auto& c : *side) {
      if (!c) continue;
      {
        std::lock_guard<std::mutex> g(c->mu);
        c->stopping = true;
      }
      c->cv.notify_all();
      if (c->thread.joinable()) c->thread.join();
    }
}

}  // namespace trainrun::plugins::shm
