#pragma once
// The capability interfaces, in one index. A component (or a communicator, a Unit's hooks, a
// Linear's adapter) may derive from any of these besides its own interface; whoever needs the
// capability finds it with dynamic_cast and falls back when it is absent, so a plugin built
// against an older ABI minor keeps working unchanged (interfaces.hpp, "Capabilities").
// Including this header gives every one of them; trainrun/trainrun.hpp does not include it
// (model/linear.hpp brings torch::nn).
//
// "Since" is the ABI minor that added the interface (plugin.hpp's kAbiMinor history); "no ABI
// minor" marks one whose header explains why it needed none (the minor current then is named).
// Implemented / queried name the in-tree code; a third-party plugin may implement any of them.
//
// StepMetricsSource (interfaces.hpp, since 1.1)
//   implemented by: precision (bf16-*, fp16-mixed, auto); ReplicatedStrategy (ddp, ring);
//                   ShardedStrategy (zero, fsdp)
//   queried by:     core/src/run/build.cpp
// ParameterShapesAware (interfaces.hpp, since 1.3)
//   implemented by: optim (adamw)
//   queried by:     core/src/run/build.cpp
// PrecisionBytes (interfaces.hpp, since 1.3)
//   implemented by: precision (every component)
//   queried by:     core/src/memory_check.cpp, core/src/run/build.cpp
// OptimizerStateBytes (interfaces.hpp, since 1.3)
//   implemented by: optim (sgd, adamw)
//   queried by:     core/src/memory_check.cpp
// MemoryInputsAware (interfaces.hpp, since 1.3)
//   implemented by: ShardedStrategy (zero, fsdp)
//   queried by:     core/src/run/build.cpp
// CheckpointState (interfaces.hpp, since 1.3)
//   implemented by: precision (bf16-*, fp16-mixed, auto: the loss scaler's state)
//   queried by:     core/src/run/build.cpp
// ShardedStateDictSource (interfaces.hpp, since 1.3)
//   implemented by: ShardedStrategy (zero, fsdp)
//   queried by:     core/src/run/build.cpp
// UnitOutputHooks (unit.hpp, since 1.3)
//   implemented by: ShardedStrategy's runtime
//   queried by:     Unit (unit.hpp)
// LinearBase (interfaces.hpp, since 1.4)
//   implemented by: quant (quant-nf4, quant-int8)
//   queried by:     Linear (model/linear.hpp); lora
// LinearAdapter (interfaces.hpp, since 1.4)
//   implemented by: lora
//   queried by:     Linear (model/linear.hpp)
// CheckpointableStrategy (interfaces.hpp, since 1.4)
//   implemented by: single; ReplicatedStrategy (ddp, ring); ShardedStrategy (zero, fsdp)
//   queried by:     core/src/run/build.cpp
// CheckpointPolicy (interfaces.hpp, since 1.4)
//   implemented by: callbacks (checkpoint)
//   queried by:     core/src/run/build.cpp
// FinalStateDictConsumer (interfaces.hpp, since 1.4)
//   implemented by: lora (a Callback); llama (a Model, since 1.5)
//   queried by:     core/src/run/build.cpp, apps/trainrun/export_cli.cpp
// RecvReduceCommunicator (interfaces.hpp, since 1.5)
//   implemented by: the Gloo communicator (plugins/lib/comm-gloo/: gloo-cpu, cuda over gloo)
//   queried by:     collectives/ring.hpp (the ring strategy's all-reduce)
// AllToAllCommunicator (interfaces.hpp, since 1.13)
//   implemented by: the Gloo communicator (gloo-cpu, cuda over gloo), mpi
//   queried by:     collectives/all_to_all.hpp (v1::all_to_all, else send/recv); trainrun bench
//                   collectives
// HfModelSource (hf/model_source.hpp, since 1.5)
//   implemented by: llama
//   queried by:     lora (PEFT adapter files)
// IncrementalDecoder (generation.hpp, no ABI minor, as its header says; added at 1.5)
//   implemented by: llama (decode.cpp)
//   queried by:     apps/trainrun/generate_cli.cpp
// PaddedDecoder (generation.hpp, since 1.10)
//   implemented by: llama (decode.cpp)
//   queried by:     v1::generate_batch (batch_generation.hpp): trainrun generate
// LastLogitsDecoder (generation.hpp, since 1.16)
//   implemented by: llama (decode.cpp)
//   queried by:     v1::decode_padded_last (batch_generation.hpp): v1::generate_batch (trainrun
//                   generate, core/src/run/rollout_phase.cpp), trainrun eval
// BatchFieldsReader (interfaces.hpp, since 1.6)
//   implemented by: BatchFieldsReaderBase (model/packed_batch.hpp): llama, models (gpt)
//   queried by:     core/src/run/build.cpp
// DeferredWeights (deferred_weights.hpp, since 1.7)
//   implemented by: llama
//   queried by:     core/src/run/build.cpp, apps/trainrun/generate_cli.cpp,
//                   strategy/sharded_runtime.hpp
// DeferredWeightsLoader (deferred_weights.hpp, since 1.7)
//   implemented by: ShardedStrategy (zero, fsdp)
//   queried by:     core/src/run/build.cpp
// LowRankAdapter (model/linear.hpp, no ABI minor: only the header uses it; added at 1.7)
//   implemented by: lora
//   queried by:     Linear (model/linear.hpp)
// ObjectiveModel (objective.hpp, since 1.8)
//   implemented by: llama
//   queried by:     core/src/run/build.cpp
// AdapterSwitch (objective.hpp, since 1.8)
//   implemented by: lora (a Callback)
//   queried by:     core/src/run/build.cpp (the reference model of DPO under LoRA)
// SequenceClassifier (objective.hpp, since 1.9)
//   implemented by: llama (with architecture = "sequence_classification")
//   queried by:     core/src/run/build.cpp (objectives wanting kScores), trainrun score
// ObjectiveExtremes (objective.hpp, since 1.9)
//   implemented by: reward (an Objective)
//   queried by:     core/src/run/objective.cpp
// SampleValues (objective.hpp, since 1.10)
//   implemented by: preference (a Dataset: the "margin" column with trainer = "reward")
//   queried by:     core/src/run/objective.cpp (ObjectiveForward::sample_values)
// FrozenWeightCopies (interfaces.hpp, since 1.11)
//   implemented by: precision (bf16-mixed; auto when it chose bf16-mixed)
//   queried by:     core/src/run/build.cpp (keeps the copies through Linear, model/linear.hpp)
// OnlineObjective (rollout.hpp, since 1.12)
//   implemented by: grpo (an Objective)
//   queried by:     core/src/run/rollout_phase.cpp, core/src/run/build.cpp (the plan)
// PromptSource (rollout.hpp, since 1.12)
//   implemented by: prompts (a Dataset)
//   queried by:     core/src/run/rollout_phase.cpp
// LogitTemperature (rollout.hpp, since 1.12)
//   implemented by: grpo (an Objective)
//   queried by:     llama (divides the logits before the log-softmax)
// ExpertParallelModel (model/expert_parallel.hpp, since 1.14)
//   implemented by: llama (Mixtral, Qwen3-MoE)
//   queried by:     core/src/run/experts.cpp ([parallel] ep)
// ActivationMemory (model/activation_memory.hpp, since 1.15)
//   implemented by: llama
//   queried by:     core/src/memory_check.cpp (trainrun check: the peak estimate)
// WeightStoragePlan (precision/weight_storage.hpp, since 1.15)
//   implemented by: quant (quant-nf4, quant-int8)
//   queried by:     core/src/memory_check.cpp (trainrun check: layer selection, stored bytes)
//
// Not capabilities but component kinds of their own (plugin.hpp's ComponentKind), each in its
// header: Objective (objective.hpp, since 1.8), Reward (reward.hpp, since 1.10; created by
// core/src/rewards.cpp for `trainrun check`, `trainrun reward` and the rollouts of an online
// objective, core/src/run/rollout_phase.cpp).
//
// ReplicatedStrategy is trainrun/strategy/replicated_strategy.hpp, ShardedStrategy
// trainrun/strategy/sharded_runtime.hpp.
// A new capability goes in the header of its area (interfaces.hpp unless it belongs with one of
// the others), bumps kAbiMinor when the core queries it, and gets an entry here.
#include "trainrun/deferred_weights.hpp"
#include "trainrun/generation.hpp"
#include "trainrun/hf/model_source.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/model/activation_memory.hpp"
#include "trainrun/model/expert_parallel.hpp"
#include "trainrun/model/linear.hpp"
#include "trainrun/objective.hpp"
#include "trainrun/precision/weight_storage.hpp"
#include "trainrun/rollout.hpp"
#include "trainrun/unit.hpp"
