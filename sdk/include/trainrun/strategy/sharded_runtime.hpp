#pragma once
// The run-time half of the sharding engine: groups a model's parameters into flat parameters
// (trainrun/strategy/sharding.hpp), gathers and releases them around each unit's forward and
// backward, reduces gradients during backward in a fixed order, and assembles full or sharded
// state. ZeRO (stages 1-3) and FSDP (every sharding strategy) are policies over this one
// implementation; a third-party sharded strategy can be one too. References: Rajbhandari et al.,
// "ZeRO" (SC20); Zhao et al., "PyTorch FSDP" (VLDB 2023).
//
// Policies (RuntimeOptions):
//  - grouping: Buckets (ZeRO-1/2: parameters in reverse registration order, bucket_elements per
//    flat parameter) or Units (one flat parameter per Unit of the model, units smaller than
//    min_unit_params merged with the next one; parameters outside units or shared between
//    units form the root group; parameters below persistence_threshold one persistent group).
//  - keep_full: parameters stay gathered (ZeRO-1/2, FSDP NO_SHARD); otherwise a unit is gathered
//    before its forward and released after it (reshard_after_forward, FSDP FULL_SHARD) or at the
//    end of backward (SHARD_GRAD_OP), and gathered again just before its backward when released.
//  - gradients are reduce-scattered (ReduceOp::Avg) over the shard group as soon as a group's
//    gradients are all in (overlap) — every micro-batch, accumulating into the gradient shard,
//    or only on the synchronised micro-batch with full_grads (ZeRO-1) — and, with a replicate
//    group (FSDP HYBRID_SHARD, NO_SHARD), the shard is then all-reduced across replicas.
//  - prefetch: the next units' gathers start ahead of use, up to a number of elements, in forward
//    and backward order; limit_all_gathers caps the gathered (non-root) units at two.
//  - frozen parameters (requires_grad false, any dtype: QLoRA's packed 4-bit weights and their
//    quantization constants, a LoRA base) used by one unit are sharded as raw bytes
//    (FrozenFlat) when units are sharded (Units grouping without keep_full), and gathered and
//    released with the unit; a unit with only frozen parameters is gathered for its forward and
//    again for its backward, and released when its forward ends and when the step's gradients
//    are complete. Frozen parameters outside units, and buffers, stay whole on every rank.
// Collectives are issued in the same order on every rank: a group whose gradients are complete
// waits for every group before it in the expected order; prefetches follow the model's (fixed)
// unit order.
//
// The engine's parts, each in its own header and all included here:
//  - sharded_policy.hpp: RuntimeOptions and the grouping as a pure function (plan_groups);
//  - sharded_engine.hpp: ShardedRuntime, the run-time mechanics, and its RuntimeMetrics;
//  - sharded_strategy.hpp: ShardedStrategy, the base of zero and fsdp, and model_statistics.
// The flat parameters themselves are trainrun/strategy/sharding.hpp.
#include "trainrun/strategy/sharded_engine.hpp"
#include "trainrun/strategy/sharded_policy.hpp"
#include "trainrun/strategy/sharded_strategy.hpp"
