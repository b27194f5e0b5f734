#pragma once
// The `nccl` communicator of the cuda accelerator: NCCL collectives among one GPU per rank.
// Rendezvous, the collective-order check and the stall inspector come from comm-common; this
// file owns the NCCL side: the communicator (its unique id travels through the job's store),
// the communication stream and its events, and the failure handling (watchdog, ncclCommAbort).
#include <trainrun/interfaces.hpp>

#include <memory>
#include <string>
#include <vector>

#include "backend_options.hpp"
#include "communicator_overrides.hpp"

namespace c10d {
class Store;
}

namespace trainrun::plugins::cuda {

/// What every communicator of one accelerator (the world and its sub-groups) shares: the
/// options every backend takes (timeout_s, stall_warning_s, check_collectives), then NCCL's.
struct NcclSettings : comm::BackendOptions {
  double rendezvous_timeout_s = 300;  ///< rendezvous of the world and of every new_group
  bool blocking_wait = false;         ///< Work::wait() blocks the host until the op is done
};

/// NCCL collectives among the ranks of one group, one CUDA device per rank (backend "nccl").
///
/// Streams and events: every operation runs on this communicator's own high-priority stream,
/// never on the compute stream. Before it, an event recorded on the caller's current stream
/// makes the communication stream wait for the kernels that produced the input; after it, an
/// end event is recorded. Work::wait() makes the caller's current stream wait for that end
/// event (the host goes on; with blocking_wait it also waits, bounded by the timeout), so a ddp
/// bucket or an fsdp gather overlaps the compute queued after it until something needs its
/// result. Input and output storages are marked as used on the communication stream (the
/// caching allocator's recordStream) and stay referenced until the op has finished.
///
/// Order: collectives get the comm-common sequence number and cross-rank order check before
/// they are enqueued. send/recv are not sequence-numbered; NCCL matches them by order between
/// each pair (it has no tags): the tag is checked only to be >= 0.
///
/// Failures: a watchdog thread polls the end events; the first op unfinished past its timeout
/// (or an asynchronous NCCL error, ncclCommGetAsyncError) aborts the communicator
/// (ncclCommAbort, which also ends kernels stuck waiting for a dead peer) and poisons it: every
/// later call throws that error, naming the op, its group and the ranks that have not arrived
/// (comm::Monitor::describe_failure). If no call picks the error up within 30 s (the host is
/// blocked elsewhere), the watchdog prints it and ends the process with exit code 1, so no
/// rank outlives a dead peer by more than the timeout and a grace period.
class NcclCommunicator final : public v1::Communicator {
 public:
  /// Joins one group: rendezvous of its members through `store` (keys under "g0/" for the
  /// world, "g<id>/" for a sub-group), rank 0 of the group creates the NCCL unique id and
  /// publishes it, every member initialises its NCCL communicator on `device`. Throws Error
  /// naming the ranks that did not arrive within rendezvous_timeout_s, or NCCL's error.
  NcclCommunicator(std::shared_ptr<c10d::Store> store, NcclSettings settings, std::string id,
                   std::string name, std::vector<int> global_ranks, int rank, int device);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::string backend() const override { return "nccl"; }
  /// NCCL's version as "2.28.9".
  static std::string nccl_version();

  /// barrier: NCCL has none; it is an all-reduce of one int32 on the device, whose wait()
  /// blocks the host until it is done (bounded by the timeout), as c10d's NCCL barrier does.
  TRAINRUN_COMMUNICATOR_OVERRIDES;
  /// c10d semantics: every rank of this group calls it with the same list; ranks not in the
  /// list get nullptr, members a communicator with its own NCCL communicator, order check and
  /// stall inspector.
  std::shared_ptr<v1::Communicator> new_group(const std::vector<int>& ranks) override;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

/// NCCL's data type for a tensor dtype; throws Error naming the dtype when NCCL has none.
/// (int as NCCL's ncclDataType_t, so this header needs no nccl.h.)
int nccl_dtype(c10::ScalarType t);
/// NCCL's reduction for a ReduceOp (Avg is NCCL's own ncclAvg, NCCL >= 2.10).
int nccl_reduce_op(v1::ReduceOp op);

}  // namespace trainrun::plugins::cuda
