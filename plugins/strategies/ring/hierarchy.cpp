#include "hierarchy.hpp"

#include <trainrun/collectives/ring.hpp>
#include <trainrun/collectives/ring_all_gather.hpp>
#include <trainrun/error.hpp>
#include <trainrun/strategy/strategy_helpers.hpp>

#include <ATen/ATen.h>

#include <utility>

#include "tags.hpp"

namespace trainrun::plugins::ring_strategy {

using namespace trainrun::v1;

void Hierarchy::setup(Communicator& world, c10::Device device, int local_rank, int local_world_size,
                      const std::string& who) {
  const int L = local_world_size;
  const int rank = world.rank(), world_size = world.world_size();
  if (L <= 1 || L >= world_size) return;  // one node (or one rank per node): the flat ring
  TR_CHECK_TYPED(ConfigError, world_size % L == 0, who,
                 ": hierarchical = true needs the same number of ranks on every node, but world "
                 "size ",
                 world_size, " is not a multiple of local_world_size ", L);
  // The groups below assume the launcher's numbering (rank = node x L + local rank); check it
  // on every rank, so a different numbering is a clear error and not a wrong reduction.
  const auto lopts = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor mine = at::tensor({static_cast<int64_t>(local_rank), static_cast<int64_t>(L)}, lopts);
  at::Tensor all = at::empty({2 * world_size}, lopts);
  world.all_gather(mine, all)->wait();
  const at::Tensor a = all.cpu();
  for (int r = 0; r < world_size; ++r) {
    const int64_t lr = a.data_ptr<int64_t>()[2 * r], lw = a.data_ptr<int64_t>()[2 * r + 1];
    TR_CHECK_TYPED(ConfigError, lw == L && lr == r % L, who,
                   ": hierarchical = true needs ranks numbered node by node (rank = node x "
                   "local_world_size + local_rank) with the same local_world_size everywhere, "
                   "but rank ",
                   r, " has local rank ", lr, " of ", lw, " (rank ", rank, " has ", local_rank,
                   " of ", L, ")");
  }
  BlockGroups groups = new_block_groups(world, L);
  local_ = std::move(groups.block);
  cross_ = std::move(groups.across);
  TR_CHECK(local_ && cross_, who, ": rank ", rank,
           ": new_group did not return this rank's node or cross-node group");
}

void Hierarchy::all_reduce(Communicator& world, at::Tensor& wire, ReduceOp op,
                           int64_t chunk_bytes) const {
  ring::Options o;
  o.chunk_bytes = chunk_bytes;
  o.tag = kDataTag;
  if (!local_) {
    o.op = op;
    ring::all_reduce(world, wire, o);
    return;
  }
  //  1. ring all-reduce (sum) within the node: every local rank holds the node's sum. (A
  //     reduce-scatter would move (L-1)/L of the buffer less inside the node; the SDK's ring
  //     offers the all-reduce, and intra-node bandwidth is the cheap kind.)
  //  2. local rank l all-reduces (sum) shard l of the buffer across nodes, with the ranks of
  //     the same local rank: the inter-node traffic is 1/L of a flat ring's per rank.
  //  3. ring all-gather of the shards within the node.
  // Every rank ends with identical values: each shard's sum is computed once per node group.
  o.op = ReduceOp::Sum;
  ring::all_reduce(*local_, wire, o);
  const int L = local_->world_size();
  auto [b, e] = ring::segment(wire.numel(), L, local_->rank());
  at::Tensor shard = wire.slice(0, b, e);
  if (e > b) ring::all_reduce(*cross_, shard, o);
  ring::all_gather_segments(*local_, wire, kGatherTag);
  if (op == ReduceOp::Avg) wire.div_(world.world_size());
}

}  // namespace trainrun::plugins::ring_strategy
