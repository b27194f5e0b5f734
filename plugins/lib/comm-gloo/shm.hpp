#pragma once
// gloo-cpu's intra-node fast path for send/recv: one shared-memory channel per ordered pair of
// ranks on the same machine (sender -> receiver), as NCCL's SHM transport does, instead of a
// loopback TCP connection.
//
// A channel is a POSIX shared-memory segment holding a ring of fixed-size slots and two
// counters: head (slots the sender has filled) and tail (slots the receiver has emptied). A
// message takes one slot per slot_bytes of payload (at least one, so an empty message is still
// matched), each slot carrying the message's tag, dtype, total size and its chunk's offset. The
// sender copies a chunk into the next free slot and publishes it by advancing head; the
// receiver copies it out and advances tail. So a message is copied twice (in, out), and a large
// one streams: the receiver empties slot i while the sender fills slot i + 1. No store round
// trip per message.
//
// Single copy, off unless TRAINRUN_SHM_CMA=1 (two copies through 128 KiB slots were faster at
// every size where both were measured, shm_segment.hpp says where). A message of 1 MiB or more is
// then not copied through the slots: its one slot carries the sender's address, and the receiver
// reads the sender's memory directly with process_vm_readv (Linux cross-memory attach, as
// UCX's cma transport does under MPICH), in 256 KiB pieces. The send completes when the
// receiver releases the slot. Each receiver checks at set-up that it can read each peer (same
// user; Yama's ptrace_scope 1 is handled by PR_SET_PTRACER to the launcher, whose children the
// peers are) and records it in the segment, so both ends agree; where it cannot, it says why
// once and those messages take two copies.
//
// A recv may reduce instead of copy (Op::reduce): each chunk is combined into the destination
// straight from the shared slot, or from a 256 KiB staging piece under single copy (dst = dst +
// chunk for Sum). That saves the ring all-reduce's reduce-scatter a full copy through a buffer.
//
// Progress: no thread per channel. A message is copied by whichever thread drives the
// transport, as MPICH's shared-memory progress engine does. A thread waiting for a send or recv
// (wait_until, from the Work's wait()) advances every queued op of every channel as far as it
// goes without waiting, one slot at a time and round-robin, so the sends of a ring step flow
// while its receives are awaited. When nothing moves it polls (pause, then sched_yield, 2 ms in
// all), then sleeps on the counter of the oldest blocked op with FUTEX_WAIT (a shared futex:
// the word lives in the segment; the other side FUTEX_WAKEs only when a sleeper said it
// sleeps). On two cores and two ranks that is one busy thread per rank and no hand-off between
// threads per message. A background thread per transport drives ops nobody waits for (a send
// whose Work is never waited on still completes), but only after 1 ms without a waiting
// thread, so it does not compete with one. Messages between two ranks are matched in posting
// order: the n-th recv from a peer takes the n-th message that peer sent to this rank. A recv
// whose tag, dtype or size differs from that message's fails naming both ranks, the tag and
// both sizes (the message is not consumed).
//
// Set-up (Transport's constructor, once per communicator, every member at the same time):
// each rank has published its host, boot id, pid namespace and pid (publish()); ranks whose
// three first fields match share a machine. Every rank creates the segment of each channel in
// which it receives (named from a random id of the group, so unique per job), publishes "ok"
// or why not, maps the segments in which it sends, unlinks them, publishes "ok" or why not,
// and finally unlinks its own (a no-op when the sender did). A direction whose segment could
// not be created or mapped uses TCP; both ends learn that from the store, so they agree.
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <trainrun/interfaces.hpp>

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace trainrun::plugins::shm {

/// One send or recv to run on a channel.
struct Op {
  at::Tensor tensor;  ///< kept alive until done() is called
  int tag = 0;
  /// recv only: combine each arriving chunk into the destination with this op (comm-common's
  /// reduce_bytes), or copy it (nullopt).
  std::optional<v1::ReduceOp> reduce;
  std::chrono::steady_clock::time_point deadline;
  double timeout_s = 0;  ///< for messages
  std::string text;      ///< "gloo-cpu: recv(float32 x 7, 28 B) from rank 1, tag 7, in group world"
  /// Collectives only: the collective's description ("all_reduce(sum, float32 x 10, 40 B)"),
  /// the same on every rank that issues the same collective. A send writes it (and its hash)
  /// into its message's first slot; a recv compares it with its own and throws
  /// CollectiveMismatch when they differ. That is the collective-order check in band, with no
  /// store round trip per collective. Empty for point-to-point messages (not checked).
  std::string order_text;
  /// Called once, by the thread that finished the op: null on success, else the error. Not
  /// called with any lock of the transport held, so it may call Transport::abort().
  std::function<void(std::exception_ptr)> done;

  // Progress, owned by the thread driving the transport.
  uint32_t next = 0;   ///< chunks copied so far
  uint32_t count = 0;  ///< chunks of the message (0: not started)
  uint64_t seq = 0;    ///< posting order within the transport
  uint64_t piece = 0;  ///< single-copy recv: bytes read so far
};

/// A collective's message came from a different collective on the peer (Op::order_text): the
/// ranks issued collectives in different orders. Reaches the op's done callback as itself (not
/// rewrapped), so the caller can word it as the collective-order check does.
class CollectiveMismatch : public v1::Error {
 public:
  CollectiveMismatch(const std::string& what, int peer, std::string peer_text)
      : v1::Error(what), peer(peer), peer_text(std::move(peer_text)) {}
  int peer;               ///< group rank of the sender
  std::string peer_text;  ///< its collective's description (at most 95 characters of it)
};

class Transport {
 public:
  struct Config {
    std::string backend;       ///< "gloo-cpu", for messages
    std::string group;         ///< "world", "1 [0, 2]": messages say "group <group>"
    std::string prefix;        ///< the group's store prefix ("g0/")
    int rank = 0;              ///< group rank
    std::vector<int> global_ranks;
    std::function<std::string(int)> peer_name;  ///< "rank 2 (global 5)"
  };

  /// Before the group's rendezvous: publishes this rank's identity (or that shm is off here),
  /// and, on group rank 0, the group's random segment id.
  static void publish(c10d::Store& store, const std::string& prefix, int rank, bool enabled);

  /// After the rendezvous (every rank has published): connects the channels. Store waits are
  /// bounded by the store's own timeout (the rendezvous timeout). Throws Error only when the
  /// store fails; a channel that cannot be set up falls back to TCP, with a warning.
  Transport(std::shared_ptr<c10d::Store> store, Config config);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  bool can_send(int peer) const;
  bool can_recv(int peer) const;
  /// Peers reached over shared memory in both directions.
  int peers() const;
  /// Peers that read this rank's large messages from its memory directly (single copy).
  int single_copy_peers() const;

  /// Queues `op` on the channel to (is_send) or from `peer`; ops of one channel run in posting
  /// order. Requires can_send / can_recv. Any thread.
  void post(bool is_send, int peer, Op op);

  /// Drives every channel on the calling thread until `done()` is true: copies what can be
  /// copied, spins, then sleeps on the counter of a blocked channel (at most 1 ms at a time).
  /// Errors of the ops (timeouts, a dead or aborted peer, a mismatched message) reach their
  /// done callbacks, not the caller. Returns early, with done() false, once `deadline` passes.
  void wait_until(const std::function<bool()>& done,
                  std::chrono::steady_clock::time_point deadline);

  /// Fails every queued and running op at once and tells every peer's end of each channel
  /// (which then fails its own ops): the communicator is poisoned. Idempotent; any thread.
  void abort();
  /// Joins the background thread (after abort() or once nothing is pending).
  void stop();

 private:
  struct Channel;   // shm_channel.hpp
  struct Finished;  // shm_channel.hpp
  struct SetUp;     // the constructor's steps, shm_setup.cpp
  // One pass over every channel, one slot each; returns whether anything moved. Requires
  // progress_mu_. Fills `finished` with the ops that ended.
  bool pass(std::vector<Finished>& finished, bool check_liveness, int round);
  // Runs passes while they move; calls the finished ops' done() after unlocking. False when
  // another thread holds progress_mu_ or nothing moved.
  bool progress(bool check_liveness, int round);
  void sleep_on_blocked(long ns);
  void background();

  std::shared_ptr<c10d::Store> store_;
  Config config_;
  std::vector<std::unique_ptr<Channel>> out_;  // by peer; null: TCP
  std::vector<std::unique_ptr<Channel>> in_;
  std::vector<Channel*> channels_;  // out_ and in_ interleaved per peer, non-null

  std::mutex progress_mu_;         // held by the one thread copying
  std::atomic<int> pending_{0};    // ops queued and not finished
  std::atomic<int> waiting_{0};    // threads in wait_until
  std::atomic<int64_t> last_wait_ns_{0};  // steady clock, when a wait_until last returned
  std::atomic<uint32_t> posted_{0};       // futex word: bumped by post()
  std::atomic<int> posted_sleepers_{0};
  std::atomic<bool> aborted_{false};
  std::atomic<uint64_t> next_seq_{0};

  std::mutex bg_mu_;
  std::condition_variable bg_cv_;
  bool bg_stopping_ = false;
  std::atomic<bool> bg_started_{false};
  std::atomic<bool> bg_idle_{false};  // sleeping until post() wakes it
  std::thread bg_;
};

}  // namespace trainrun::plugins::shm
