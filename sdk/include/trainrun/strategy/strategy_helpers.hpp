#pragma once
// Small pieces every strategy needs the same way (single, ddp, ring, and the sharded ones). The
// dtype vocabulary shared by communicators and strategies is in trainrun/types.hpp.
#include <ATen/core/Tensor.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "trainrun/interfaces.hpp"
#include "trainrun/types.hpp"

namespace trainrun::v1 {

/// The batch's tensors (input, target, and the ABI 1.6 position_ids / segment_ids when defined)
/// moved to `device` (the batch itself when it is the CPU, where datasets build batches).
inline Batch batch_to_device(const Batch& batch, c10::Device device) {
  if (device.is_cpu()) return batch;
  Batch moved = batch;
  for (at::Tensor* t : {&moved.input, &moved.target, &moved.position_ids, &moved.segment_ids})
    if (t->defined()) *t = t->to(device, /*non_blocking=*/true);
  return moved;
}

/// L2 norm of the gradients of `params` that have one (0 when none has), on this rank only.
/// Per-tensor norms in the gradient's dtype, float32 for bfloat16/float16 gradients (a float64
/// copy of every gradient costs ~5x more), combined in float64 on the device: one
/// synchronisation per call.
inline double local_grad_norm(const std::vector<NamedTensor>& params) {
  std::vector<at::Tensor> norms;
  norms.reserve(params.size());
  for (const auto& p : params) {
    const at::Tensor& g = p.tensor.grad();
    if (!g.defined()) continue;
    const bool reduced = g.scalar_type() == at::kBFloat16 || g.scalar_type() == at::kHalf;
    norms.push_back((reduced ? at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kFloat)
                             : at::linalg_vector_norm(g, 2))
                        .to(at::kDouble));
  }
  if (norms.empty()) return 0.0;
  return at::linalg_vector_norm(at::stack(norms), 2).item<double>();
}

/// Makes every gradient undefined rather than zero: the next backward writes instead of adding,
/// and a parameter unused in that step shows as having no gradient (optimizers skip it).
inline void drop_grads(const std::vector<NamedTensor>& params) {
  for (const auto& p : params) p.tensor.mutable_grad() = at::Tensor();
}

/// Parameters then buffers, detached, as a full state dict of a replicated model.
inline std::vector<NamedTensor> replicated_state_dict(const std::vector<NamedTensor>& params,
                                                      Model& model) {
  std::vector<NamedTensor> out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back({p.name, p.tensor.detach()});
  for (auto& b : model.named_buffers()) out.push_back({b.name, b.tensor.detach()});
  return out;
}

/// ABI 1.4 (checkpoints). A replicated strategy's model pieces (CheckpointableStrategy): every
/// parameter and buffer whole (offset 0, its shape, data a flat view of the live tensor), written
/// by rank 0 only and filled on every rank at load (each rank reads the same bytes, so the
/// replicas stay identical). Throws Error on a non-contiguous tensor (no flat view aliases it).
inline std::vector<CheckpointPiece> replicated_checkpoint_pieces(const std::vector<NamedTensor>& params,
                                                                 Model& model, int rank) {
  std::vector<CheckpointPiece> out;
  auto add = [&](const NamedTensor& t) {
    TR_CHECK(t.tensor.is_contiguous(), "checkpoint: tensor '", t.name,
             "' is not contiguous; it cannot be loaded in place");
    out.push_back({{t.name, t.tensor.sizes().vec(), 0, t.tensor.detach().view({-1})}, rank == 0});
  };
  for (const auto& p : params) add(p);
  for (const auto& b : model.named_buffers()) add(b);
  return out;
}

/// ABI 1.4 (checkpoints). A replicated strategy's optimizer_parameter_pieces(): each optimizer
/// parameter is a whole model parameter (offset 0), written by rank 0.
inline std::vector<CheckpointPiece> replicated_optimizer_pieces(const std::vector<NamedTensor>& params,
                                                                int rank) {
  std::vector<CheckpointPiece> out;
  for (const auto& p : params)
    out.push_back({{p.name, p.tensor.sizes().vec(), 0, p.tensor.detach().reshape({-1})}, rank == 0});
  return out;
}

/// This rank's two groups of a world cut into blocks of `block` consecutive ranks.
struct BlockGroups {
  std::shared_ptr<Communicator> block;   ///< the ranks of this rank's block
  std::shared_ptr<Communicator> across;  ///< the ranks at this rank's place in every block
};

/// Creates the groups of `world` cut into blocks of `block` consecutive ranks (world_size a
/// multiple of `block`): every block, then for each place in a block the ranks at that place in
/// every block. With ranks numbered node by node these are the nodes and the ranks of one local
/// rank across nodes (hierarchical all-reduce), or the shard groups and their replicas (hybrid
/// sharding). Collective over `world`: every rank creates every group in the same order, as
/// c10d requires, and keeps its own; a member the communicator did not return stays null.
inline BlockGroups new_block_groups(Communicator& world, int block) {
  const int rank = world.rank();
  const int blocks = world.world_size() / block;
  BlockGroups out;
  for (int b = 0; b < blocks; ++b) {
    std::vector<int> ranks(static_cast<size_t>(block));
    std::iota(ranks.begin(), ranks.end(), b * block);
    auto g = world.new_group(ranks);
    if (b == rank / block) out.block = g;
  }
  for (int i = 0; i < block; ++i) {
    std::vector<int> ranks;
    for (int b = 0; b < blocks; ++b) ranks.push_back(b * block + i);
    auto g = world.new_group(ranks);
    if (i == rank % block) out.across = g;
  }
  return out;
}

}  // namespace trainrun::v1
