#pragma once
// ABI 1.14: expert parallelism. A mixture-of-experts model holds only its share of each MoE
// layer's experts and sends every token to the ranks holding the experts its router chose, and
// the results back, through an all_to_all of uneven parts (AllToAllCommunicator). References:
// Lepikhin et al. 2020 (GShard), Fedus et al. 2021 (Switch Transformer), Rajbhandari et al. 2022
// (DeepSpeed-MoE); torchtitan's and Megatron-LM's expert parallel.
//
// Protocol (the core follows it; so must any other host of a Model):
//  1. The job's [parallel] ep cuts the world into expert-parallel groups of ep consecutive ranks
//     (the ranks of one node first, where all_to_all moves through shared memory); the ranks at
//     the same place in every group hold the same experts (the expert-data-parallel group).
//  2. After the precision, the callbacks (LoRA) and the freezing have seen the whole model and
//     before Strategy::setup, the host calls shard_experts() once on every rank. Afterwards the
//     model's named_parameters() leaves the experts out, so a strategy replicates or shards the
//     rest as usual; expert_parameters() lists this rank's experts under their whole-model
//     names. The host owns what a strategy does for the others: their gradients (summed over the
//     expert-data-parallel group), the optimizer, checkpoints and the final state dict.
//  3. Every forward of the model is then collective over the expert-parallel group: the ranks
//     of a group run the same number of forwards (micro-batches, evaluation batches), and the
//     backward of each all_to_all is an all_to_all the other way.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trainrun/interfaces.hpp"
#include "trainrun/types.hpp"

namespace trainrun::v1 {

/// ABI 1.14. Capability of a Model with mixture-of-experts layers that can split its experts
/// over ranks (see the protocol above). Found with dynamic_cast.
class ExpertParallelModel {
 public:
  virtual ~ExpertParallelModel() = default;
  /// Experts of each MoE layer (the same in every one); 0 = the model has no MoE layer.
  virtual int64_t num_experts() const = 0;
  /// Whether parameter `name` (a name of the whole model, as named_parameters() gives it before
  /// shard_experts()) belongs to an expert, i.e. would be split; memory estimates ask it.
  virtual bool is_expert_parameter(const std::string& name) const = 0;
  /// Keeps experts [r * E / ep, (r + 1) * E / ep) of every MoE layer, r = group.rank(),
  /// ep = group.world_size(), E = num_experts(), frees the others, and routes every later
  /// forward's tokens over `group` (which must outlive the model's forwards). Weights that are
  /// still deferred (DeferredWeights) are read for the kept experts only. Throws ConfigError
  /// when ep does not divide E, Error when called twice or when the model has no MoE layer.
  virtual void shard_experts(Communicator& group) = 0;
  /// This rank's expert parameters (trainable and frozen, adapters on experts included), named
  /// as in the whole model ("model.layers.0.mlp.experts.5.down_proj.weight"); empty before
  /// shard_experts(). The tensors are the live parameters.
  virtual std::vector<NamedTensor> expert_parameters() = 0;
};

}  // namespace trainrun::v1
