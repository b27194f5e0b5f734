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
// backend's point-to-point matching (FIFO per peer and tag) pairs correctly.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/interfaces.hpp"

namespace trainrun::v1::ring {

/// Options of all_reduce.
struct Options {
  ReduceOp op = ReduceOp::Sum;      ///< Sum, Avg (sum, then divided by N), Min or Max
  int64_t chunk_bytes = 512 << 10;  ///< pipelining unit in bytes (rounded to whole elements)
  int tag = 0x7269;                 ///< point-to-point tag used for every message
  double timeout_s = 0;             ///< per message; 0 = the communicator's default
};

namespace detail_ring {
// [begin, end) of segment i of n elements cut into `parts` parts.
inline std::pair<int64_t, int64_t> segment(int64_t n, int parts, int i) {
  return {n * i / parts, n * (i + 1) / parts};
}

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
    auto [b, e] = detail_ring::segment(n, N, seg);
    return (e - b + chunk - 1) / chunk;
  };
  auto chunk_view = [&](at::Tensor& t, int seg, int64_t c) {
    auto [b, e] = detail_ring::segment(n, N, seg);
    const int64_t cb = b + c * chunk, ce = std::min(e, cb + chunk);
    return t.slice(0, cb, ce);
  };

  // --- reduce-scatter ------------------------------------------------------------------------
  // Receives land in a scratch buffer (two steps' worth, so step s+1 can be posted while step
  // s is still being reduced), then are reduced into the tensor.
  const int64_t max_seg = (n + N - 1) / N + 1;
  at::Tensor scratch = at::empty({2, max_seg}, flat.options());
  std::deque<std::shared_ptr<Work>> sends;
  auto recv_view = [&](int step, int seg, int64_t c) {
    auto [b, e] = detail_ring::segment(n, N, seg);
    const int64_t cb = c * chunk, ce = std::min(e - b, cb + chunk);
    return scratch[step % 2].slice(0, cb, ce);
  };
  // Step 0 sends can all go at once; every later send waits for its chunk's reduction.
  auto post_step = [&](int step, bool post_sends) {
    const int send_seg = mod(r - step), recv_seg = mod(r - step - 1);
    std::vector<std::shared_ptr<Work>> recvs;
    const int64_t rc = chunks_of(recv_seg);
    for (int64_t c = 0; c < rc; ++c) {
      at::Tensor v = recv_view(step, recv_seg, c);
      recvs.push_back(comm.recv(v, from_left));
    }
    if (post_sends) {
      const int64_t sc = chunks_of(send_seg);
      for (int64_t c = 0; c < sc; ++c) sends.push_back(comm.send(chunk_view(flat, send_seg, c), to_right));
    }
    return recvs;
  };
  std::vector<std::shared_ptr<Work>> recvs = post_step(0, true);
  for (int step = 0; step < N - 1; ++step) {
    const int recv_seg = mod(r - step - 1);
    const bool more = step + 1 < N - 1;
    // The next step's receives go out before this step's reductions, so the left neighbour
    // never waits for a posted buffer.
    std::vector<std::shared_ptr<Work>> next = more ? post_step(step + 1, false) : std::vector<std::shared_ptr<Work>>{};
    for (int64_t c = 0; c < static_cast<int64_t>(recvs.size()); ++c) {
      recvs[c]->wait();
      at::Tensor acc = chunk_view(flat, recv_seg, c);
      detail_ring::reduce_into(acc, recv_view(step, recv_seg, c), opts.op);
      // This chunk is what the next step sends (send_seg(step+1) == recv_seg(step)).
      if (more) sends.push_back(comm.send(acc, to_right));
      else if (opts.op == ReduceOp::Avg) {
        if (at::isIntegralType(acc.scalar_type(), /*includeBool=*/true)) acc.div_(N, "trunc");
        else acc.div_(N);
      }
    }
    // Bound the sends in flight (and the scratch half they no longer need) to one step.
    while (sends.size() > static_cast<size_t>(2 * (chunks_of(recv_seg) + 1))) {
      sends.front()->wait();
      sends.pop_front();
    }
    recvs = std::move(next);
  }
  for (auto& w : sends) w->wait();
  sends.clear();

  // --- all-gather ----------------------------------------------------------------------------
  // Received chunks land in place; each is forwarded as soon as it arrives.
  auto post_gather_recvs = [&](int step) {
    const int recv_seg = mod(r - step);
    std::vector<std::shared_ptr<Work>> out;
    const int64_t rc = chunks_of(recv_seg);
    for (int64_t c = 0; c < rc; ++c) {
      at::Tensor v = chunk_view(flat, recv_seg, c);
      out.push_back(comm.recv(v, from_left));
    }
    return out;
  };
  {
    const int own = mod(r + 1);
    const int64_t sc = chunks_of(own);
    for (int64_t c = 0; c < sc; ++c) sends.push_back(comm.send(chunk_view(flat, own, c), to_right));
  }
  for (int step = 0; step < N - 1; ++step) {
    const int recv_seg = mod(r - step);
    std::vector<std::shared_ptr<Work>> got = post_gather_recvs(step);
    for (int64_t c = 0; c < static_cast<int64_t>(got.size()); ++c) {
      got[c]->wait();
      if (step + 1 < N - 1) sends.push_back(comm.send(chunk_view(flat, recv_seg, c), to_right));
    }
  }
  for (auto& w : sends) w->wait();
}

}  // namespace trainrun::v1::ring
