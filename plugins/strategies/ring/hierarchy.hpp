#pragma once
// How the ring strategy all-reduces a fused buffer over the world: the flat ring, or, when the
// job spans several nodes, Horovod's hierarchical all-reduce (HOROVOD_HIERARCHICAL_ALLREDUCE)
// built on send/recv only, which sends 1/local_world_size of a flat ring's traffic per rank
// across nodes.
#include <trainrun/interfaces.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

namespace trainrun::plugins::ring_strategy {

/// This rank's groups for the hierarchical all-reduce: the ranks of its node, and the ranks with
/// its local rank on the other nodes. Without them (one node, one rank per node, or not asked
/// for), all_reduce() is the flat ring.
class Hierarchy {
 public:
  /// Creates the groups when the job spans several nodes with several ranks each. Collective
  /// over `world` (every rank creates every group, in the same order). Throws ConfigError naming
  /// `who` when the nodes hold different numbers of ranks or the ranks are not numbered node by
  /// node (rank = node x local_world_size + local_rank).
  void setup(v1::Communicator& world, c10::Device device, int local_rank, int local_world_size,
             const std::string& who);
  /// Whether all_reduce() goes through the node and cross-node groups.
  bool active() const { return local_ != nullptr; }
  /// All-reduces `wire` (flat, contiguous, the same numel and dtype on every rank) over `world`
  /// with `op`, pipelined in chunks of `chunk_bytes`. Throws what the ring throws.
  void all_reduce(v1::Communicator& world, at::Tensor& wire, v1::ReduceOp op,
                  int64_t chunk_bytes) const;

 private:
  std::shared_ptr<v1::Communicator> local_;
  std::shared_ptr<v1::Communicator> cross_;
};

}  // namespace trainrun::plugins::ring_strategy
