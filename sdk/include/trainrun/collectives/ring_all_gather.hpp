#pragma once
// Ring all-gather of segments over a Communicator's send/recv, and the segment cut every ring
// algorithm here shares (trainrun/collectives/ring.hpp's all-reduce cuts the same way).
//
// The algorithm. A flat tensor of n elements is cut into L segments (L = world size; segment j
// is [n j / L, n (j + 1) / L)); rank l starts with segment l filled in. In step s (s = 0 ..
// L - 2) rank l sends segment (l - s) mod L to rank l + 1 and receives segment (l - s - 1) mod
// L from rank l - 1, in place: what a rank received in one step is what it sends in the next.
// After L - 1 steps every rank holds every segment, having sent (L - 1) / L of the tensor, the
// least an all-gather can. The ring strategy's hierarchical all-reduce uses it for its last
// phase (gathering the cross-node shards within the node).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "trainrun/interfaces.hpp"

namespace trainrun::v1::ring {

/// [begin, end) of segment j of n elements cut into `parts` parts (parts > 0, 0 <= j < parts);
/// segments differ in length by at most one element and the last ends at n.
inline std::pair<int64_t, int64_t> segment(int64_t n, int parts, int j) {
  return {n * j / parts, n * (j + 1) / parts};
}

/// All-gathers in place: on entry rank l of `comm` holds segment l of the 1-D tensor `flat`
/// (cut as segment()), on return every rank holds all of them. Every rank passes the same numel
/// and dtype. Point-to-point messages use `tag`. Blocks until done; throws whatever the
/// communicator's send/recv throw (timeouts, a dead peer). World size 1 returns at once.
inline void all_gather_segments(Communicator& comm, at::Tensor& flat, int tag) {
  const int L = comm.world_size(), l = comm.rank();
  if (L == 1) return;
  const int64_t n = flat.numel();
  auto mod = [L](int x) { return ((x % L) + L) % L; };
  PointToPointOptions to_right{(l + 1) % L, tag, 0}, from_left{(l + L - 1) % L, tag, 0};
  for (int s = 0; s < L - 1; ++s) {
    auto [sb, se] = segment(n, L, mod(l - s));
    auto [rb, re] = segment(n, L, mod(l - s - 1));
    std::shared_ptr<Work> recv, send;
    at::Tensor rv = flat.slice(0, rb, re);
    if (re > rb) recv = comm.recv(rv, from_left);
    if (se > sb) send = comm.send(flat.slice(0, sb, se), to_right);
    if (recv) recv->wait();
    if (send) send->wait();
  }
}

}  // namespace trainrun::v1::ring
