#pragma once
// One direction of a shared-memory channel between this rank and a peer, and its queue of ops:
// the transport's progress engine (shm.cpp) moves their chunks one slot at a time through
// step(); the copies themselves, and how a mismatched message or a dead peer is told, are in
// shm_channel.cpp. The segment was created and mapped at set-up (shm_setup.cpp).
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "shm.hpp"
#include "shm_segment.hpp"

namespace trainrun::plugins::shm {

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

  bool cma = false;  // single copy for messages of at least cma_min bytes
  uint64_t cma_min = 0;
  uint64_t cma_piece = 0;
  std::vector<char> staging;  // a recv's piece to reduce from (single copy)

  std::mutex mu;         // guards queue (posting threads push, the progressing thread pops)
  std::deque<Op> queue;  // front: the op in progress; deque keeps its address across pushes
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
  void check(const Op& op, bool thorough) const;

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
  // The collective's description into chunk 0 of its message (Op::order_text).
  static void write_order(SlotHeader& h, const Op& op);
  int step_send(Op& op);
  int step_recv(Op& op);
};

struct Transport::Finished {
  Op op;
  std::exception_ptr error;
};

}  // namespace trainrun::plugins::shm
