#pragma once
// GlooCommunicator's state, private to comm-gloo. Its parts, one file each:
//  - gloo_communicator.cpp: joining a group (rendezvous, the TCP mesh, the shared-memory
//    channels, the two-level plan) and leaving it, new_group;
//  - gloo_issue.cpp: how an operation is issued, queued on the worker, and how a failure
//    poisons the communicator;
//  - gloo_collectives.cpp: each collective mapped onto a Gloo or a shared-memory algorithm;
//  - gloo_point_to_point.cpp: send, recv and recv_reduce, over shared memory or TCP;
//  - gloo_world.cpp: the world's store and TCP device (open_gloo_world).
#include <trainrun/interfaces.hpp>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm_common.hpp"
#include "gloo_communicator.hpp"
#include "serial_queue.hpp"
#include "shm.hpp"
#include "shm_collectives.hpp"

namespace trainrun::plugins {

constexpr const char* kBackend = "gloo-cpu";

using Millis = std::chrono::milliseconds;

inline Millis to_millis(double seconds) {
  return Millis(std::max<int64_t>(1, std::llround(seconds * 1000.0)));
}

struct GlooCommunicator::Impl {
  std::shared_ptr<c10d::Store> store;
  std::shared_ptr<gloo::transport::Device> device;
  GlooSettings settings;
  std::string id;      // "" for the world, "1", "1.2" for sub-groups
  std::string name;    // "world", "1 [0, 2]": messages say "group <name>"
  std::string prefix;  // store keys of this group: "g0/", "g1/", "g1.2/"
  std::vector<int> global_ranks;
  int rank = 0;
  int size = 1;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::shared_ptr<comm::Monitor> monitor;

  // Held from Monitor::issue until the task is queued, so that queue order is sequence order
  // even when several threads issue. Also guards groups_created.
  std::mutex issue_mu;
  int groups_created = 0;

  // poison: the first error; later calls rethrow it. broken: the transport is unusable, queued
  // operations fail without running. A collective-order mismatch poisons at once but breaks
  // only after the operations issued before it ran (the peers need them).
  std::mutex state_mu;
  std::exception_ptr poison;
  bool broken = false;
  gloo::transport::UnboundBuffer* reaping = nullptr;  // the buffer the reaper waits on
  bool reaping_send = false;
  // Operations issued and not yet completed; counted down before their Work completes, so a
  // caller that waited for everything sees 0.
  std::atomic<int64_t> in_flight{0};
  std::vector<unsigned char> reduce_scatter_scratch;  // the worker's, reused between calls
  // send/recv to peers on this machine (null: shm off, or no such peer); see shm.hpp. Its
  // threads complete Works through this Impl, so it is stopped in ~GlooCommunicator.
  std::shared_ptr<shm::Transport> shm;
  // Every rank of the group reaches every other over shm, agreed by all at set-up: the
  // collectives then run over shared memory (shm_collectives.hpp).
  bool shm_collectives = false;
  // The group spans machines, each holding the same number (>= 2) of its ranks, all reaching
  // each other over shm (agreed by all at set-up, plan_hierarchy): all_reduce runs in two
  // levels. node_ring: the group ranks on this machine, ascending; node_position: this rank's
  // index in it; column: Gloo's TCP mesh of the ranks at node_position on every machine
  // (machines ordered by their lowest group rank). Null column: one level.
  std::vector<int> node_ring;
  int node_position = 0;
  std::shared_ptr<gloo::rendezvous::Context> column;

  // Declared last: destroyed (drained and joined) first, while everything above still exists.
  SerialQueue reaper;  // waits for point-to-point completions
  SerialQueue worker;  // runs operations in issue order

  // --- set-up (gloo_communicator.cpp) --------------------------------------------------------

  // The shared-memory channels to the peers on this machine, and whether the collectives (or
  // all_reduce's first level) run over them.
  void connect_shm(const std::string& where);
  // Decides, identically on every rank, whether all_reduce runs in two levels, and connects the
  // column mesh if so.
  void plan_hierarchy(const std::string& where);

  std::string peer_name(int r) const {
    if (id.empty()) return "rank " + std::to_string(r);
    return "rank " + std::to_string(r) + " (global " + std::to_string(global_ranks[r]) + ")";
  }

  double resolve_timeout(double t) const { return t > 0 ? t : settings.timeout_s; }

  // --- issuing and failures (gloo_issue.cpp) -------------------------------------------------

  std::shared_ptr<comm::FutureWork> new_work(uint64_t seq, std::string text, double timeout_s) {
    ++in_flight;
    return std::make_shared<comm::FutureWork>(monitor, seq, std::move(text), timeout_s);
  }
  void complete(comm::FutureWork& work, std::exception_ptr error) {
    --in_flight;
    work.finish(std::move(error));
  }

  void throw_if_poisoned();
  std::exception_ptr broken_error();
  // Closes every connection of this group's mesh (and the shared-memory channels).
  void abort_transport();
  // Records the first failure, breaks the transport, and returns the error every failed
  // operation reports: the first one, whichever thread saw it.
  std::exception_ptr fail(std::exception_ptr error);
  // After an in-band collective failed: the store's order check (see gloo_issue.cpp).
  void check_order_after_failure(uint64_t seq, const comm::OpDesc& desc);
  // Issues a collective and queues `body`, which runs on the worker with the operation's Gloo
  // tag and timeout. `inline_if_idle`: run it on the calling thread instead when nothing is
  // queued or running (see kInlineBytes in gloo_collectives.cpp).
  // `order_in_band`: the body runs over shared memory, whose messages carry the collective's
  // description (shm_context), so the order check costs no store round trip; the store check
  // then runs only after a failure, to name a collective that the peers issued over TCP.
  std::shared_ptr<v1::Work> enqueue(const comm::OpDesc& desc, double timeout_s,
                                    std::function<void(uint32_t tag, Millis timeout)> body,
                                    bool inline_if_idle = false, bool order_in_band = false);

  // --- collectives (gloo_collectives.cpp) ----------------------------------------------------

  // The shared-memory collective's context: the same tag on every rank (from the sequence
  // number), negative so that it never equals a point-to-point tag of the strategies.
  // The ring is the whole group, or (within_machine) the shared-memory level of a hierarchical
  // all-reduce: this machine's ranks (node_ring), named so in errors.
  shm::CollectiveContext shm_context(uint32_t seq, Millis timeout, const std::string& text,
                                     bool within_machine = false);

  // --- point to point (gloo_point_to_point.cpp) ----------------------------------------------

  // A send, a recv, or (reduce != None) a recv that combines the message into `tensor`.
  std::shared_ptr<v1::Work> point_to_point(bool is_send, const at::Tensor& tensor,
                                           const v1::PointToPointOptions& opts,
                                           std::optional<v1::ReduceOp> reduce = std::nullopt);
  // One send or recv, checked, as the worker posts it.
  struct Message {
    std::shared_ptr<comm::FutureWork> work;
    at::Tensor tensor;  // the caller's
    int peer = 0;
    int tag = 0;
    bool is_send = false;
    std::optional<v1::ReduceOp> reduce;  // recv_reduce's
    double timeout_s = 0;
    std::string text;  // "gloo-cpu: send(float32 x 7, 28 B) to rank 1, tag 7, in group world"
  };
  void post_over_shm(Message m);
  void post_over_tcp(Message m, uint64_t slot);
  void reap(const Message& m, const at::Tensor& target, gloo::transport::UnboundBuffer& buf,
            std::chrono::steady_clock::time_point deadline);
};

}  // namespace trainrun::plugins
