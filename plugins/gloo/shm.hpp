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
// receiver copies it out and advances tail. So a message is copied exactly twice (in, out), and
// a large one streams: the receiver empties slot i while the sender fills slot i + 1. Waiting
// (for data, or for a free slot) spins briefly and then sleeps on the counter itself with
// FUTEX_WAIT (a shared futex: the word lives in the segment); the other side FUTEX_WAKEs only
// when the sleeper has said it sleeps. No store round trip per message.
//
// Each channel direction has its own thread in each process (started on first use), so a send
// that is larger than the ring never blocks the recv of an exchange posted after it. Messages
// between two ranks are matched in posting order: the n-th recv from a peer takes the n-th
// message that peer sent to this rank. A recv whose tag, dtype or size differs from that
// message's fails naming both ranks, the tag and both sizes (the message is not consumed).
//
// Set-up (Transport's constructor, once per communicator, every member at the same time):
// each rank has published its host, boot id, pid namespace and pid (publish()); ranks whose
// three first fields match share a machine. Every rank creates the segment of each channel in
// which it receives (named from a random id of the group, so unique per job), publishes "ok"
// or why not, maps the segments in which it sends, unlinks them, publishes "ok" or why not,
// and finally unlinks its own (a no-op when the sender did). A direction whose segment could
// not be created or mapped uses TCP; both ends learn that from the store, so they agree.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace trainrun::plugins::shm {

/// One send or recv to run on a channel.
struct Op {
  at::Tensor tensor;  ///< kept alive until done() is called
  int tag = 0;
  std::chrono::steady_clock::time_point deadline;
  double timeout_s = 0;  ///< for messages
  std::string text;      ///< "gloo-cpu: recv(float32 x 7, 28 B) from rank 1, tag 7, in group world"
  /// Called once on the channel's thread: null on success, else the error. Not called with
  /// any lock of the transport held, so it may call Transport::abort().
  std::function<void(std::exception_ptr)> done;
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

  /// Queues `op` on the channel to (is_send) or from `peer`; ops of one channel run in posting
  /// order. Requires can_send / can_recv.
  void post(bool is_send, int peer, Op op);

  /// Fails every queued and running op at once and tells every peer's end of each channel
  /// (which then fails its own ops): the communicator is poisoned. Idempotent; any thread.
  void abort();
  /// Joins the channel threads (after abort() or once nothing is pending).
  void stop();

 private:
  struct Channel;
  std::shared_ptr<c10d::Store> store_;
  Config config_;
  std::vector<std::unique_ptr<Channel>> out_;  // by peer; null: TCP
  std::vector<std::unique_ptr<Channel>> in_;
};

}  // namespace trainrun::plugins::shm
