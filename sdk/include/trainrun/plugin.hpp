#pragma once
// The plugin ABI: one extern "C" entry symbol per shared object returning a plain descriptor.
//
//   TRAINRUN_PLUGIN("my-plugin", "1.0.0",
//       trainrun::v1::component<trainrun::v1::Callback, MyCallback>("my-callback", "Does X"));
//
// Each Impl class has `static void declare_options(trainrun::v1::OptionSchema&)` and a
// constructor `Impl(const trainrun::v1::Options&, const trainrun::v1::RunContext&)`.
// Build plugins only with the SDK's CMake function trainrun_add_plugin(), which stamps the
// LibTorch version and compiler the descriptor reports and exports only the entry symbol.
#include <c10/core/CPUAllocator.h>

#include <cstdint>

#include "trainrun/interfaces.hpp"
#include "trainrun/objective.hpp"
#include "trainrun/options.hpp"
#include "trainrun/reward.hpp"

namespace trainrun::v1 {

/// ABI version of this SDK. The loader accepts a plugin whose major equals the core's and whose
/// minor is not newer than the core's.
constexpr uint32_t kAbiMajor = 1;
/// The minor's history: 1.1: capability StepMetricsSource; 1.2: OptionType::IntOrAuto; 1.3:
/// UnitOutputHooks, Unit checkpointer, ParameterShapesAware, CheckpointState; 1.4: LinearBase,
/// LinearAdapter, trainrun Linear, FinalStateDictConsumer (adapters); CheckpointableStrategy,
/// CheckpointPolicy (checkpoints); 1.5: RecvReduceCommunicator (ring all-reduce); 1.6:
/// Batch::position_ids/segment_ids, kIgnoreIndex targets, BatchFieldsReader; 1.7:
/// DeferredWeights, DeferredWeightsLoader (loading weights by shard); 1.8:
/// ComponentKind::Objective, ObjectiveModel, AdapterSwitch, EvalMetrics::extra (objectives
/// beyond SFT, objective.hpp); 1.9: Objective::kScores, TokenLogProbs::scores,
/// SequenceClassifier, ObjectiveExtremes (reward models); 1.10: ComponentKind::Reward, Reward,
/// RewardSample (rewards for online RL, reward.hpp), SampleValues and
/// ObjectiveForward::sample_values (per-sample values: a reward margin), packed objective batches
/// (TokenLogProbs rows per sequence, objective.hpp), PaddedDecoder (left-padded batched
/// decoding, generation.hpp); 1.11: FrozenWeightCopies (a precision's frozen Linear weights kept
/// in its compute dtype, interfaces.hpp; Linear's kept copy, model/linear.hpp); 1.12: online
/// objectives (OnlineObjective, RolloutSpec, RolloutScores, PromptSource, LogitTemperature,
/// ObjectivePass::Old; rollout.hpp); 1.13: AllToAllCommunicator, AllToAllOptions (all-to-all of
/// uneven parts, interfaces.hpp; collectives/all_to_all.hpp); 1.14: ExpertParallelModel (a model
/// holding its share of the experts, model/expert_parallel.hpp); 1.15: WeightStoragePlan (a
/// precision's stored form of frozen weights known before convert, precision/weight_storage.hpp),
/// ActivationMemory (a model's activation estimate, model/activation_memory.hpp),
/// find_linear_layers refusing a target_modules entry that matches no layer; 1.16:
/// LastLogitsDecoder (logits of the last slots only, generation.hpp). CMakeLists.txt reads the
/// number from the next line: keep it whole.
constexpr uint32_t kAbiMinor = 16;

/// Component kinds; values are part of the ABI and never renumbered.
enum class ComponentKind : uint32_t {
  Model = 1,
  Dataset = 2,
  Strategy = 3,
  Accelerator = 4,
  Precision = 5,
  Optimizer = 6,
  Callback = 7,
  Objective = 8,  ///< ABI 1.8
  Reward = 9,     ///< ABI 1.10
};

/// Job-file name of a kind ("model", "data", "strategy", ...).
inline const char* kind_name(ComponentKind k) {
  switch (k) {
    case ComponentKind::Model: return "model";
    case ComponentKind::Dataset: return "data";
    case ComponentKind::Strategy: return "strategy";
    case ComponentKind::Accelerator: return "accelerator";
    case ComponentKind::Precision: return "precision";
    case ComponentKind::Optimizer: return "optimizer";
    case ComponentKind::Callback: return "callback";
    case ComponentKind::Objective:
      return "objective";
    case ComponentKind::Reward:
      return "reward";
  }
  return "unknown";
}

template <class Interface>
struct KindOf;
template <> struct KindOf<Model> { static constexpr ComponentKind value = ComponentKind::Model; };
template <> struct KindOf<Dataset> { static constexpr ComponentKind value = ComponentKind::Dataset; };
template <> struct KindOf<Strategy> { static constexpr ComponentKind value = ComponentKind::Strategy; };
template <> struct KindOf<Accelerator> { static constexpr ComponentKind value = ComponentKind::Accelerator; };
template <> struct KindOf<Precision> { static constexpr ComponentKind value = ComponentKind::Precision; };
template <> struct KindOf<Optimizer> { static constexpr ComponentKind value = ComponentKind::Optimizer; };
template <> struct KindOf<Callback> { static constexpr ComponentKind value = ComponentKind::Callback; };
template <>
struct KindOf<Objective> {
  static constexpr ComponentKind value = ComponentKind::Objective;
};
template <>
struct KindOf<Reward> {
  static constexpr ComponentKind value = ComponentKind::Reward;
};

}  // namespace trainrun::v1

extern "C" {

/// One component offered by a plugin. `create` returns a heap object of the kind's interface
/// type (Model*, Strategy*, ...) cast to void*; the host owns it and deletes it through the
/// interface's virtual destructor. `create` may throw; the host adds the plugin's name.
struct trainrun_component_v1 {
  uint32_t struct_size;  ///< sizeof(trainrun_component_v1) as the plugin saw it
  uint32_t kind;         ///< trainrun::v1::ComponentKind
  const char* name;      ///< unique across all loaded plugins, e.g. "adamw"
  const char* summary;   ///< one line for `trainrun plugins`
  void (*declare_options)(trainrun::v1::OptionSchema* schema);
  void* (*create)(const trainrun::v1::Options* options, const trainrun::v1::RunContext* ctx);
};

/// What the entry symbol returns. Fields are only ever appended; struct_size comes first so a
/// host can tell which fields a plugin has.
struct trainrun_plugin_descriptor_v1 {
  uint32_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* torch_version;  ///< LibTorch version the plugin was compiled against, "1.13.0"
  int32_t cxx11_abi;          ///< _GLIBCXX_USE_CXX11_ABI at compile time
  const char* compiler_id;    ///< e.g. "GNU-12.2.0"
  const char* plugin_name;
  const char* plugin_version;
  const void* torch_anchor;   ///< address of c10::GetCPUAllocator as the plugin resolved it
  uint32_t num_components;
  const trainrun_component_v1* components;
};

/// Signature of the single exported symbol, named by TRAINRUN_PLUGIN_ENTRY_NAME.
typedef const trainrun_plugin_descriptor_v1* (*trainrun_plugin_entry_fn)(void);
}

/// Name of the one symbol every plugin exports.
#define TRAINRUN_PLUGIN_ENTRY_NAME "trainrun_plugin_entry"

namespace trainrun::v1 {
namespace detail {
template <class Interface, class Impl>
void* create_component(const Options* options, const RunContext* ctx) {
  Interface* obj = new Impl(*options, *ctx);
  return static_cast<void*>(obj);
}
template <class Impl>
void declare_component_options(OptionSchema* schema) {
  Impl::declare_options(*schema);
}
}  // namespace detail

/// Describes component Impl (implementing Interface) for TRAINRUN_PLUGIN.
template <class Interface, class Impl>
constexpr trainrun_component_v1 component(const char* name, const char* summary) {
  return trainrun_component_v1{sizeof(trainrun_component_v1),
                               static_cast<uint32_t>(KindOf<Interface>::value),
                               name,
                               summary,
                               &detail::declare_component_options<Impl>,
                               &detail::create_component<Interface, Impl>};
}
}  // namespace trainrun::v1

#if !defined(TRAINRUN_BUILD_TORCH_VERSION) || !defined(TRAINRUN_BUILD_COMPILER_ID)
#define TRAINRUN_PLUGIN(...) \
  static_assert(false, "build trainrun plugins with the SDK's CMake function trainrun_add_plugin()")
#else
// In-tree plugins are compiled into object libraries that unit tests link several of at once,
// so there their entry symbols are weak (TRAINRUN_PLUGIN_ENTRY_WEAK, set by the build); a
// third-party plugin's stays strong, so two entry symbols in one plugin are a link error.
#if defined(TRAINRUN_PLUGIN_ENTRY_WEAK)
#define TRAINRUN_PLUGIN_ENTRY_BINDING __attribute__((weak))
#else
#define TRAINRUN_PLUGIN_ENTRY_BINDING
#endif
/// Defines the plugin's entry symbol. NAME and VERSION are string literals; the rest are
/// trainrun::v1::component<Interface, Impl>(name, summary) entries.
#define TRAINRUN_PLUGIN(NAME, VERSION, ...)                                                     \
  extern "C" __attribute__((visibility("default"))) TRAINRUN_PLUGIN_ENTRY_BINDING               \
  const trainrun_plugin_descriptor_v1* trainrun_plugin_entry(void) {                            \
    static const trainrun_component_v1 components[] = {__VA_ARGS__};                          \
    static const trainrun_plugin_descriptor_v1 descriptor = {                                   \
        sizeof(trainrun_plugin_descriptor_v1),                                                  \
        ::trainrun::v1::kAbiMajor,                                                              \
        ::trainrun::v1::kAbiMinor,                                                              \
        TRAINRUN_BUILD_TORCH_VERSION,                                                           \
        _GLIBCXX_USE_CXX11_ABI,                                                                 \
        TRAINRUN_BUILD_COMPILER_ID,                                                             \
        NAME,                                                                                   \
        VERSION,                                                                                \
        reinterpret_cast<const void*>(&::c10::GetCPUAllocator),                                 \
        static_cast<uint32_t>(sizeof(components) / sizeof(components[0])),                     \
        components};                                                                            \
    return &descriptor;                                                                         \
  }
#endif
