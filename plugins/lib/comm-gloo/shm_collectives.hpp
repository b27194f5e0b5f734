#pragma once
// gloo-cpu's collectives among ranks that all share one machine: ring algorithms whose messages
// go through the shared-memory transport (shm.hpp) instead of Gloo's TCP pairs.
//
// Why: Gloo's algorithms over loopback TCP cost a system call and a kernel copy per message
// and per side; through shared memory a message is one copy in and one out (or one read of
// the sender's memory for large ones), and a reducing receive combines each chunk straight
// from the shared slot. The ring strategy already used that path through send/recv; the
// collectives every other strategy issues (ddp's buckets, zero's and fsdp's reduce-scatter and
// all-gather, the trainer's small all-reduces) now take it too.
//
// The algorithms are the bandwidth-optimal rings (Patarasuk & Yuan, JPDC 2009), as in
// trainrun/collectives/ring.hpp, but driven directly on the transport from gloo-cpu's worker
// thread: every step posts its send and its receive and drives the transport until both are done,
// so no other thread takes part in a step. At 2 ranks each is a direct exchange of halves.
// That step is why they stay here rather than beside the SDK's send/recv rings: it is the
// transport's own (shm::Op posts carrying the collective's description, Transport::wait_until on
// this thread, one deadline for the whole collective), none of which a Communicator's send/recv
// and Work offer; only the segment cut (v1::ring::segment) is shared.
//
// Matching: the shared-memory channels match messages strictly in posting order per pair of
// ranks, so collectives and point-to-point messages between two ranks must be issued in the
// same order on both (as NCCL requires); the worker runs them in issue order. Collective
// messages carry negative tags, which point-to-point options never produce from the SDK's
// strategies, so a crossed order fails at once naming both tags instead of mixing data.
// They also carry their collective's description, so the collective-order check needs no
// store round trip per collective (CollectiveContext::order_text).
#include <ATen/core/Tensor.h>
#include <trainrun/interfaces.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace trainrun::plugins::shm {

class Transport;

/// Thrown when a collective's deadline passes with a step unfinished; the caller reports it
/// as the collective's timeout, naming the ranks that have not arrived (comm::Monitor).
class CollectiveTimeout : public v1::Error {
 public:
  using v1::Error::Error;
};

/// Where a collective runs and how it names itself in errors.
struct CollectiveContext {
  Transport* transport = nullptr;
  int rank = 0;       ///< position in the ring: the group rank, or an index into `ring`
  int size = 1;       ///< ranks in the ring; every one reaches every other over `transport`
  /// Empty: the ring is the whole group (position = group rank). Else the group ranks of the
  /// ring in order (those on this machine, for the hierarchical all-reduce); `size` equals its
  /// length and `rank` is this rank's index in it.
  std::vector<int> ring;
  int tag = -1;       ///< negative, the same on every rank for this collective
  double timeout_s = 0;
  /// When the collective times out (CollectiveTimeout); its messages' own deadline, which
  /// fails them with an error naming the channel, is a second later.
  std::chrono::steady_clock::time_point deadline;
  std::string text;   ///< "gloo-cpu: all_reduce(sum, float32 x 1024) in group world"
  /// The collective's description, equal on every rank issuing the same collective
  /// ("all_reduce(sum, float32 x 1024, 4096 B)"); every message carries it and every receive
  /// checks it (Op::order_text), so ranks that issued different collectives fail at their first
  /// message with CollectiveMismatch. Empty: no check.
  std::string order_text;
};

/// In-place all-reduce of the contiguous CPU tensor `tensor` (every rank the same numel and
/// dtype) with `op` (Avg reduces as Sum; the caller divides). Ring reduce-scatter with reducing
/// receives, then ring all-gather. Throws CollectiveTimeout when `deadline` passes, Error naming
/// the step and peer for a dead or aborted peer or a mismatched message.
///
/// `between` (hierarchical, two-level all-reduce as NCCL's tree/ring split and Horovod's
/// hierarchical allreduce): called between the two phases with the segment this rank has
/// reduced over the ring (1/size of the tensor, the same segment index at the same ring
/// position on every machine), to all-reduce it in place with the ranks at this position on the
/// other machines; the all-gather then spreads the result. Not called for an empty segment
/// (equal on every machine, since sizes are). Its exceptions propagate.
void all_reduce(const CollectiveContext& c, at::Tensor& tensor, v1::ReduceOp op,
                const std::function<void(at::Tensor&)>& between = {});

/// output (numel k) = op over ranks of chunk `rank` of input (numel k * size), as c10d's
/// reduce_scatter_tensor. input and output may overlap only when output is this rank's chunk
/// of input (the caller clones input for any other overlap). Avg reduces as Sum. Errors as
/// all_reduce.
void reduce_scatter(const CollectiveContext& c, const at::Tensor& input, at::Tensor& output,
                    v1::ReduceOp op);

/// output (numel k * size) = the ranks' inputs (numel k each) concatenated in rank order, as
/// c10d's all_gather_into_tensor. Plain bytes, any dtype. Errors as all_reduce.
void all_gather(const CollectiveContext& c, const at::Tensor& input, at::Tensor& output);

}  // namespace trainrun::plugins::shm
