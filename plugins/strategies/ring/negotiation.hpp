#pragma once
// Negotiation, as in Horovod's controller but without a coordinator: which gradients are ready
// on every rank. Each round every rank contributes a vote and a MAX all-reduce gives every rank
// the same answer, so every rank reduces the same tensors in the same order whatever order its
// own hooks fired in.
#include <trainrun/interfaces.hpp>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trainrun::plugins::ring_strategy {

/// One round's vote: a byte per tensor, 1 = not ready on this rank, then a byte per rank, 1 =
/// that rank gives up (Horovod's coordinator message). After exchange(), tensor i is ready on
/// every rank when its byte is 0 (the MAX over ranks is an AND of readiness), and a rank gave up
/// when any rank flagged it.
class Vote {
 public:
  Vote(size_t tensors, int world_size);
  /// This rank's vote for tensor `i` (every tensor starts ready).
  void set_ready(size_t i, bool ready);
  /// Tells the other ranks that `rank` (this one) stops the reduction.
  void give_up(int rank);
  /// The MAX all-reduce over `comm`, pipelined in chunks of `chunk_bytes`; `timeout_s` limits
  /// each message (0: the communicator's default). Throws what the ring throws.
  void exchange(v1::Communicator& comm, int64_t chunk_bytes, double timeout_s);
  /// After exchange(): whether tensor `i` is ready on every rank.
  bool ready_everywhere(size_t i) const;
  /// After exchange(): the ranks that gave up, in increasing order.
  std::vector<int> quitters() const;

 private:
  size_t tensors_;
  int world_size_;
  at::Tensor bytes_;  ///< uint8 [tensors + world_size]
};

/// find_unused_parameters: for each tensor, whether some rank used it in this step (`used`, a
/// byte per tensor, is this rank's answer). Collective over `comm`: a MAX all-reduce.
std::vector<uint8_t> used_anywhere(v1::Communicator& comm, const std::vector<uint8_t>& used);

}  // namespace trainrun::plugins::ring_strategy
