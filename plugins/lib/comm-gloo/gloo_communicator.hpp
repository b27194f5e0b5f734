#pragma once
// Collectives over Gloo's TCP transport, with shared memory between ranks of one machine
// (shm.hpp): the communicator of the gloo-cpu accelerator, and of the cuda accelerator's
// collectives = "gloo" (through host memory). A static library beside comm-common, so neither
// plugin compiles the other's sources. Rendezvous, the collective-order check and the stall
// inspector come from comm-common; this file owns the Gloo side: the TCP mesh, one worker
// thread per group, the mapping of each operation onto a Gloo algorithm, and failure handling.
#include <trainrun/interfaces.hpp>

#include <memory>
#include <string>
#include <vector>

#include "backend_options.hpp"
#include "communicator_overrides.hpp"

namespace c10d {
class Store;
}
namespace gloo::transport {
class Device;
}

namespace trainrun::plugins {

/// What every communicator of one accelerator (the world and its sub-groups) shares: the
/// options every backend takes (timeout_s, stall_warning_s, check_collectives), then Gloo's.
struct GlooSettings : comm::BackendOptions {
  double rendezvous_timeout_s = 300;  ///< rendezvous of the world and of every new_group
  /// all_reduce: Auto = the shared-memory ring when every rank of the group is on this machine
  /// (and shm is on), else Gloo's TCP ring; Ring / Bcube = that Gloo algorithm over TCP always.
  enum class Algorithm { Auto, Ring, Bcube } allreduce_algorithm = Algorithm::Auto;
  bool shm = true;  ///< send/recv and collectives on one machine through shared memory
};

/// Collectives over Gloo's TCP transport among the ranks of one group (backend "gloo-cpu").
///
/// Threads and order: the calling thread checks preconditions, gives a collective its sequence
/// number and cross-rank order check (comm::Monitor::issue) and queues it; one worker thread per
/// communicator runs the queue in issue order, so two collectives on the same tensor need no
/// wait() in between. Point-to-point operations are posted by that worker in the same order but
/// complete on a second thread, so that a send and the matching recv issued in opposite orders
/// on two ranks (an exchange) cannot deadlock; they are not sequence-numbered, and a tensor
/// given to send/recv must not be touched until its Work's wait() returns. send and recv must
/// agree on tag, dtype and element count: otherwise neither matches and both time out.
///
/// Same machine (option shm, default on; see shm.hpp): send/recv between two members of a
/// group (world or sub-group) that share a machine go through a shared-memory channel per
/// direction instead of TCP, copied in and out by a thread per channel. There, messages are
/// matched strictly in posting order per pair: a recv whose tag, dtype or size differs from
/// the peer's next send fails at once naming both ranks, the tag and the sizes. A peer that
/// exits while a send/recv waits on it fails that operation within milliseconds.
///
/// Failures: a Gloo error (a peer closed its connections, a timeout) fails the operation with
/// an Error naming it, its group and the ranks that have not arrived; the communicator is then
/// poisoned: every later call throws that first error at once, queued operations fail with it,
/// and its TCP connections are closed so the peers' pending operations fail within moments
/// instead of at their own timeouts. A collective-order mismatch poisons it too.
///
/// Timeouts: an operation's timeout_s > 0, else the accelerator's timeout_s, bounds both the
/// Work's wait() and Gloo's own waits (bcube all_reduce waits inside Gloo with the
/// accelerator's timeout_s, which Gloo fixes when the mesh is connected).
///
/// Algorithms: when every rank of the group shares this machine and shm is on, all_reduce
/// (unless allreduce_algorithm names a Gloo algorithm), reduce_scatter and all_gather are rings
/// over the shared-memory transport (shm_collectives.hpp). A group that spans machines with the
/// same number (>= 2) of its ranks on each runs all_reduce in two levels (hierarchy_machines()):
/// a shared-memory reduce-scatter within each machine, Gloo's TCP ring all-reduce of each
/// segment among the ranks at the same position on every machine, a shared-memory all-gather.
/// Otherwise all_reduce is Gloo's ring or bcube, all_gather Gloo's, reduce_scatter a ring on
/// Gloo's unbound buffers (Gloo's ReduceScatterHalvingDoubling returns wrong results when a
/// send is still queued; see gloo.cpp). broadcast and barrier are always Gloo's.
///
/// Destroying a communicator with operations still queued or running aborts them.
class GlooCommunicator final : public v1::Communicator,
                               public v1::RecvReduceCommunicator,
                               public v1::AllToAllCommunicator {
 public:
  /// Joins one group: rendezvous of its members through `store` (keys under "g0/" for the
  /// world, "g<id>/" for a sub-group), then a Gloo full mesh on `device`. `id` numbers
  /// sub-groups ("" for the world, "1", "1.2" for sub-group 1's second); `global_ranks[i]` is
  /// the global rank of group rank i; `rank` is this process's group rank; `name` follows
  /// "group" in messages ("world", "1 [0, 2]"). Blocks until every member has arrived; throws
  /// Error naming the ranks that did not within rendezvous_timeout_s, or those whose rank list
  /// differs.
  GlooCommunicator(std::shared_ptr<c10d::Store> store,
                   std::shared_ptr<gloo::transport::Device> device, GlooSettings settings,
                   std::string id, std::string name, std::vector<int> global_ranks, int rank);
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  std::string backend() const override { return "gloo-cpu"; }
  /// "world" or "1 [0, 2]" (sub-group 1, global ranks 0 and 2); messages say "group <name>".
  const std::string& group_name() const;
  /// Peers this rank reaches over shared memory in both directions (0: TCP only).
  int shm_peers() const;
  /// Whether all_reduce, reduce_scatter and all_gather run over shared memory (every rank of
  /// the group on this machine, agreed by all of them at set-up).
  bool shm_collectives() const;
  /// Machines of a two-level (hierarchical) all_reduce: shared memory within each machine, Gloo's
  /// TCP ring between them (the group spans >= 2 machines with the same number >= 2 of its ranks
  /// each, shm on, allreduce_algorithm "auto"); 0 when all_reduce has one level.
  int hierarchy_machines() const;
  /// Of those, the peers to which messages of 1 MiB and more go by single copy (the peer reads
  /// them from this process's memory with process_vm_readv).
  int shm_single_copy_peers() const;

  TRAINRUN_COMMUNICATOR_OVERRIDES;
  /// ABI 1.5: over shared memory each chunk is combined into `tensor` straight from the shared
  /// slot; over TCP the message lands in a staging tensor, combined when it is complete.
  std::shared_ptr<v1::Work> recv_reduce(at::Tensor& tensor, v1::ReduceOp op,
                                        const v1::PointToPointOptions& opts) override;
  /// ABI 1.13: plain bytes, any dtype; with every peer over shared memory the parts go through
  /// the send/recv channels, otherwise Gloo's alltoallv over TCP.
  std::shared_ptr<v1::Work> all_to_all(const at::Tensor& input, at::Tensor& output,
                                       const v1::AllToAllOptions& opts = {}) override;
  /// c10d semantics: every rank of this group calls it with the same list (ranks of this
  /// group); ranks not in the list get nullptr, members a communicator with its own Gloo mesh,
  /// order check and stall inspector, in which their rank is their position in the list.
  std::shared_ptr<v1::Communicator> new_group(const std::vector<int>& ranks) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The world's communicator of a Gloo job and how it was reached, as open_gloo_world() makes it.
struct GlooWorld {
  std::unique_ptr<GlooCommunicator> communicator;
  std::string transport;  ///< "tcp 127.0.0.1", "tcp eth0", "tcp host-a"
};

/// Joins the world with `settings` (rendezvous_timeout_s included) as rank ctx.rank of
/// ctx.world_size. The store comes from MASTER_ADDR/MASTER_PORT (an in-process store when
/// world_size is 1 and neither is set). Gloo listens on 127.0.0.1 when MASTER_ADDR is a
/// loopback address, else on GLOO_SOCKET_IFNAME's interface when set, else on the address of
/// this host's name. Errors name "gloo-cpu" (for cuda's collectives = "gloo" too): ConfigError
/// for a bad rank or a world of several without the store's address, Error when the TCP device
/// cannot be opened or the rendezvous fails.
GlooWorld open_gloo_world(const GlooSettings& settings, const v1::RunContext& ctx);

}  // namespace trainrun::plugins
