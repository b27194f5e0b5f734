#pragma once
// Bandwidth-optimal ring all-reduce over a Communicator's send/recv, as Baidu's ring all-reduce
// and Horovod use it (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters
// of workstations", JPDC 2009). Kept apart from any transport, as Gloo's allreduce_ring.h is,
// so it runs unchanged on every backend that has send/recv (gloo-cpu, mpi, later nccl).
//
// The algorithm. The tensor is cut into N segments (N = world size; segment i starts at element
// floor(i * n / N)). Ranks form a ring: rank r sends to r+1 and receives from r-1.
//  1. Reduce-scatter, N-1 steps: at step s rank r sends segment (r - s) mod N and receives
//     segment (r - s - 1) mod N, which it reduces into its own copy. After the last step rank r
//     holds the fully reduced segment (r + 1) mod N.
//  2. All-gather, N-1 steps: at step s rank r sends segment (r + 1 - s) mod N and receives
//     segment (r - s) mod N in place.
// Each rank sends and receives 2(N-1)/N of the tensor in all, whatever N is: that is why the
// ring is bandwidth-optimal, and why busbw = algbw * 2(N-1)/N is the figure to compare.
//
// Pipelining. Every segment is further cut into chunks of `chunk_bytes`. A chunk is sent at
// step s+1 as soon as it has been received and reduced at step s, so the transfer of one chunk
// overlaps the reduction of the previous one and the next step starts before this one ends.
// Both sides post their messages to a peer in the same order with one tag, which every
// backend's point-to-point matching (FIFO per peer and tag) pairs correctly. A communicator
// with the RecvReduceCommunicator capability reduces each received chunk into the tensor
// itself (gloo-cpu from its shared-memory slot), which saves the staging copy.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "trainrun/collectives/ring_all_gather.hpp"
#include "trainrun/error.hpp"
#include "trainrun/interfaces.hpp"

namespace trainrun::v1::ring {

/// Options of all_reduce.
struct Options {
  ReduceOp op = ReduceOp::Sum;      ///< Sum, Avg (sum, then divided by N), Min or Max
  int64_t chunk_bytes = 4 << 20;  ///< pipelining unit in bytes (rounded to whole elements)
  int tag = 0x7269;                 ///< point-to-point tag used for every message
  double timeout_s = 0;             ///< per message; 0 = the communicator's default
};

namespace detail_ring {
inline void reduce_into(at::Tensor& acc, const at::Tensor& in, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: acc.add_(in); return;
    case ReduceOp::Min: at::minimum_out(acc, acc, in); return;
    case ReduceOp::Max: at::maximum_out(acc, acc, in); return;
  }
}
}  // namespace detail_ring

/// All-reduces `tensor` in place over `comm` with the ring algorithm above. `tensor` must be a
/// contiguous CPU tensor of a dtype the communicator's send/recv accept; every rank passes the
/// same numel and dtype. Avg of an integer dtype truncates toward zero. Blocks until done.
/// Throws Error for a non-contiguous tensor, and whatever the communicator throws (timeouts,
/// a dead peer), naming the operation. World size 1 returns at once (Avg divides by 1).
inline void all_reduce(Communicator& comm, at::Tensor& tensor, const Options& opts = {}) {
  TR_CHECK(tensor.is_contiguous(), "ring all_reduce: the tensor must be contiguous (shape ",
           tensor.sizes(), ")");
  const int N = comm.world_size();
  const int r = comm.rank();
  if (N == 1 || tensor.numel() == 0) return;
  at::Tensor flat = tensor.view(-1);
  const int64_t n = flat.numel();
  const int right = (r + 1) % N, left = (r + N - 1) % N;
  const int64_t chunk = std::max<int64_t>(1, opts.chunk_bytes / std::max<int64_t>(1, flat.element_size()));
  auto mod = [N](int x) { return ((x % N) + N) % N; };

  PointToPointOptions to_right{right, opts.tag, opts.timeout_s};
  PointToPointOptions from_left{left, opts.tag, opts.timeout_s};

  // Chunk c of segment `seg`: [begin, end) in elements; chunk counts differ by segment size, so
  // both sides iterate the same (step, chunk) sequence derived from the same n and N.
  auto chunks_of = [&](int seg) {
    auto [b, e] = segment(n, N, seg);
    return (e - b + chunk - 1) / chunk;
  };
  auto chunk_view = [&](at::Tensor& t, int seg, int64_t c) {
    auto [b, e] = segment(n, N, seg);
    const int64_t cb = b + c * chunk, ce = std::min(e, cb + chunk);
    return t.slice(0, cb, ce);
  };

  std::deque<std::shared_ptr<Work>> sends;
  auto send_chunk = [&](int seg, int64_t c) { sends.push_back(comm.send(chunk_view(flat, seg, c), to_right)); };
  // All-gather step s receives segment r - s in place.
  auto post_gather_recvs = [&](int step) {
    const int recv_seg = mod(r - step);
    std::vector<std::shared_ptr<Work>> out;
    for (int64_t c = 0; c < chunks_of(recv_seg); ++c) {
      at::Tensor v = chunk_view(flat, recv_seg, c);
      out.push_back(comm.recv(v, from_left));
    }
    return out;
  };

  // --- reduce-scatter ------------------------------------------------------------------------
  // A communicator with RecvReduceCommunicator reduces each chunk into the tensor as it
  // arrives. Otherwise receives land in a scratch buffer (two steps' worth, so step s+1 can be
  // posted while step s is still being reduced) and are reduced here.
  auto* rr = dynamic_cast<RecvReduceCommunicator*>(&comm);
  const ReduceOp pairwise = opts.op == ReduceOp::Avg ? ReduceOp::Sum : opts.op;
  at::Tensor scratch;
  if (!rr) scratch = at::empty({2, (n + N - 1) / N + 1}, flat.options());
  auto scratch_view = [&](int step, int seg, int64_t c) {
    auto [b, e] = segment(n, N, seg);
    const int64_t cb = c * chunk, ce = std::min(e - b, cb + chunk);
    return scratch[step % 2].slice(0, cb, ce);
  };
  // Step s receives segment r - s - 1 and sends segment r - s.
  auto post_reduce_recvs = [&](int step) {
    const int recv_seg = mod(r - step - 1);
    std::vector<std::shared_ptr<Work>> out;
    for (int64_t c = 0; c < chunks_of(recv_seg); ++c) {
      if (rr) {
        at::Tensor acc = chunk_view(flat, recv_seg, c);
        out.push_back(rr->recv_reduce(acc, pairwise, from_left));
      } else {
        at::Tensor v = scratch_view(step, recv_seg, c);
        out.push_back(comm.recv(v, from_left));
      }
    }
    return out;
  };
  std::vector<std::shared_ptr<Work>> recvs = post_reduce_recvs(0);
  // Step 0 sends can all go at once; every later send waits for its chunk's reduction.
  for (int64_t c = 0; c < chunks_of(r); ++c) send_chunk(r, c);
  for (int step = 0; step < N - 1; ++step) {
    const int recv_seg = mod(r - step - 1);
    const bool last = step + 1 == N - 1;
    // The next receives go out before this step's are awaited, so the left neighbour never
    // waits for a posted buffer: the next step's, or after the last step the all-gather's
    // first. None of them touches what a send in flight reads (segment r - s - 2 differs from
    // r - s and r - s - 1 when N > 2; N == 2 has one step; all-gather step 0 receives
    // segment r, which step 0 sent and every rank has reduced from before it sends again).
    std::vector<std::shared_ptr<Work>> next = last ? post_gather_recvs(0) : post_reduce_recvs(step + 1);
    for (int64_t c = 0; c < static_cast<int64_t>(recvs.size()); ++c) {
      recvs[c]->wait();
      at::Tensor acc = chunk_view(flat, recv_seg, c);
      if (!rr) detail_ring::reduce_into(acc, scratch_view(step, recv_seg, c), opts.op);
      if (last && opts.op == ReduceOp::Avg) {
        if (at::isIntegralType(acc.scalar_type(), /*includeBool=*/true)) acc.div_(N, "trunc");
        else acc.div_(N);
      }
      // The next step sends this chunk; after the last step it is final (this rank's segment
      // r + 1), and all-gather step 0 sends it at once, overlapping the rest of the reduction.
      send_chunk(recv_seg, c);
    }
    // Bound the sends in flight to about two steps.
    while (sends.size() > static_cast<size_t>(2 * (chunks_of(recv_seg) + 1))) {
      sends.front()->wait();
      sends.pop_front();
    }
    recvs = std::move(next);
  }

  // --- all-gather ----------------------------------------------------------------------------
  // Received chunks land in place; each is forwarded as soon as it arrives.
  for (int step = 0; step < N - 1; ++step) {
    const int recv_seg = mod(r - step);
    const bool more = step + 1 < N - 1;
    std::vector<std::shared_ptr<Work>> next = more ? post_gather_recvs(step + 1) : std::vector<std::shared_ptr<Work>>{};
    for (int64_t c = 0; c < static_cast<int64_t>(recvs.size()); ++c) {
      recvs[c]->wait();
      if (more) send_chunk(recv_seg, c);
    }
    recvs = std::move(next);
  }
  for (auto& w : sends) w->wait();
}

}  // namespace trainrun::v1::ring
