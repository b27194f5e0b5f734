#pragma once
// The capability interfaces, in one index. A component (or a communicator, a Unit's hooks, a
// Linear's adapter) may derive from any of these besides its own interface; whoever needs the
// capability finds it with dynamic_cast and falls back when it is absent, so a plugin built
// against an older ABI minor keeps working unchanged (interfaces.hpp, "Capabilities").
// Including this header gives every one of them; trainrun/trainrun.hpp does not include it
// (model/linear.hpp brings torch::nn).
//
// "Since" is the ABI minor that added the interface (plugin.hpp's kAbiMinor history); "no ABI"
// marks one that only header-only code of the SDK uses on both sides, so it needs no minor.
// Implemented / queried name the in-tree code; a third-party plugin may implement any of them.
//
// capability              | header               | since  | implemented by                              | queried by
// ------------------------+----------------------+--------+---------------------------------------------+-----------------------------------
// StepMetricsSource       | interfaces.hpp       | 1.1    | precision (bf16-*, fp16-mixed, auto),       | core/src/run/build.cpp
//                         |                      |        | ReplicatedStrategy (ddp, ring),             |
//                         |                      |        | ShardedStrategy (zero, fsdp)                |
// ParameterShapesAware    | interfaces.hpp       | 1.3    | optim (adamw)                               | core/src/run/build.cpp
// PrecisionBytes          | interfaces.hpp       | 1.3    | precision (all: fp32, bf16-*, fp16, auto)   | core/src/memory_check.cpp,
//                         |                      |        |                                             | core/src/run/build.cpp
// OptimizerStateBytes     | interfaces.hpp       | 1.3    | optim (sgd, adamw)                          | core/src/memory_check.cpp
// MemoryInputsAware       | interfaces.hpp       | 1.3    | ShardedStrategy (zero, fsdp)                | core/src/run/build.cpp
// CheckpointState         | interfaces.hpp       | 1.3    | precision (bf16-*, fp16-mixed, auto: the    | core/src/run/build.cpp
//                         |                      |        | loss scaler's state)                        |
// ShardedStateDictSource  | interfaces.hpp       | 1.3    | ShardedStrategy (zero, fsdp)                | core/src/run/build.cpp
// UnitOutputHooks         | unit.hpp             | 1.3    | ShardedStrategy's runtime                   | Unit (unit.hpp)
// LinearBase              | interfaces.hpp       | 1.4    | quant (quant-nf4, quant-int8)               | Linear (model/linear.hpp); lora
// LinearAdapter           | interfaces.hpp       | 1.4    | lora                                        | Linear (model/linear.hpp)
// CheckpointableStrategy  | interfaces.hpp       | 1.4    | single, ReplicatedStrategy (ddp, ring),     | core/src/run/build.cpp
//                         |                      |        | ShardedStrategy (zero, fsdp)                |
// CheckpointPolicy        | interfaces.hpp       | 1.4    | callbacks (checkpoint)                      | core/src/run/build.cpp
// FinalStateDictConsumer  | interfaces.hpp       | 1.4    | lora (a Callback); llama (a Model, since    | core/src/run/build.cpp,
//                         |                      |        | 1.5)                                        | apps/trainrun/export_cli.cpp
// RecvReduceCommunicator  | interfaces.hpp       | 1.5    | the Gloo communicator (plugins/lib/         | collectives/ring.hpp (the ring
//                         |                      |        | comm-gloo/: gloo-cpu, cuda over gloo)       | strategy's all-reduce)
// HfModelSource           | hf/model_source.hpp  | 1.5    | llama                                       | lora (PEFT adapter files)
// IncrementalDecoder      | generation.hpp       | no ABI | llama (llama_decode.inc)                    | apps/trainrun/generate_cli.cpp
//                         |                      | (1.5)  |                                             |
// BatchFieldsReader       | interfaces.hpp       | 1.6    | BatchFieldsReaderBase (model/packed_batch.  | core/src/run/build.cpp
//                         |                      |        | hpp): llama, models (gpt)                   |
// DeferredWeights         | deferred_weights.hpp | 1.7    | llama                                       | core/src/run/build.cpp,
//                         |                      |        |                                             | apps/trainrun/generate_cli.cpp,
//                         |                      |        |                                             | strategy/sharded_runtime.hpp
// DeferredWeightsLoader   | deferred_weights.hpp | 1.7    | ShardedStrategy (zero, fsdp)                | core/src/run/build.cpp
// LowRankAdapter          | model/linear.hpp     | no ABI | lora                                        | Linear (model/linear.hpp)
//                         |                      | (1.7)  |                                             |
//
// "(1.5)" / "(1.7)" under "no ABI": the minor that was current when it was added. ReplicatedStrategy
// is trainrun/strategy/replicated_strategy.hpp, ShardedStrategy trainrun/strategy/sharded_runtime.hpp.
// A new capability goes in the header of its area (interfaces.hpp unless it belongs with one of
// the others), bumps kAbiMinor when the core queries it, and gets a row here.
#include "trainrun/deferred_weights.hpp"
#include "trainrun/generation.hpp"
#include "trainrun/hf/model_source.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/model/linear.hpp"
#include "trainrun/unit.hpp"
