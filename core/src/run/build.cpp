// The build phase: the run directory, every component through the registry, the capabilities
// the loop will use (resolved here, once), the model as the precision, the callbacks and
// [trainer] leave it, then Strategy::setup and Optimizer::init, and the checkpoint settings.
#include "run.hpp"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "setup.hpp"
#include "trainrun/deferred_weights.hpp"
#include "trainrun/model/linear.hpp"
#include "trainrun/core/log.hpp"
#include "trainrun/core/launcher.hpp"
#include "trainrun/core/memory.hpp"
#include "trainrun/core/plan.hpp"

namespace fs = std::filesystem;

namespace trainrun::core {

using v1::ConfigError;

namespace {

// Dropout and augmentation draw per-rank streams (two ranks must not drop the same units), all
// derived from the job's seed; model initialisation happened earlier from the seed alone.
uint64_t rank_seed(uint64_t seed, int rank) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(rank + 1);  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

template <class T>
Slot<T> build(const Registry& reg, const ComponentConfig& c, const v1::RunContext& ctx) {
  return Slot<T>{reg.create<T>(*c.info, c.options, ctx), describe_component(*c.info)};
}

// ABI minor of the plugin a component comes from.
uint32_t abi_minor_of(const Registry& reg, const ComponentConfig& c) {
  for (const auto& p : reg.plugins())
    if (p.name == c.info->plugin_name) return p.abi_minor;
  return v1::kAbiMinor;
}

// ABI 1.11 (v1::FrozenWeightCopies): the precision's dtype copy of every resident frozen Linear
// weight, made once now that the strategy has set the model up (a weight it shards is released
// here, so it is not copied). Only for a model plugin built for 1.11 or later: the copy lives in
// the layer, whose older layout has no room for it. Returns what was kept, for the log.
std::string keep_frozen_weight_copies(Slot<v1::Model>& model, Slot<v1::Precision>& precision,
                                      uint32_t model_abi) {
  auto* copies = dynamic_cast<v1::FrozenWeightCopies*>(precision.obj.get());
  if (copies == nullptr || model_abi < 11) return "";
  const std::optional<at::ScalarType> dtype = copies->frozen_weight_dtype();
  torch::nn::Module* root = model.obj->module();
  if (!dtype || root == nullptr) return "";
  int64_t layers = 0, bytes = 0;
  for (const auto& item : root->named_modules("", /*include_self=*/false))
    if (auto l = std::dynamic_pointer_cast<v1::LinearImpl>(item.value());
        l && l->keep_frozen_weight_copy(*dtype)) {
      ++layers;
      bytes += l->frozen_weight_copy().nbytes();
    }
  if (layers == 0) return "";
  return std::to_string(layers) + " frozen Linear weights kept in " +
         std::string(c10::toString(*dtype)) + " for the run (" +
         std::to_string((bytes + (1 << 19)) >> 20) + " MiB)";
}

// ABI 1.7 deferred loading (trainrun/deferred_weights.hpp, protocol step 2): a model built with
// its weights still in their files is filled by a strategy that reads only this rank's shard,
// when nothing before the strategy reads values; otherwise its weights are read whole here, once.
// Returns why they were read whole ("" when left to the strategy or nothing was deferred).
std::string settle_deferred_weights(Slot<v1::Model>& model, bool init_weights, const Registry& reg,
                                    const JobConfig& job, Slot<v1::Precision>& precision,
                                    Slot<v1::Strategy>& strategy) {
  auto* d = dynamic_cast<v1::DeferredWeights*>(model.obj.get());
  if (d == nullptr || !model.call("weights_deferred", [&](v1::Model&) { return d->weights_deferred(); }))
    return "";
  std::string why;
  const auto* loader = dynamic_cast<const v1::DeferredWeightsLoader*>(strategy.obj.get());
  const auto* bytes = dynamic_cast<const v1::PrecisionBytes*>(precision.obj.get());
  if (init_weights)
    why = "[trainer] init_weights replaces them";
  else if (loader == nullptr || abi_minor_of(reg, job.strategy) < 7 || !loader->loads_deferred_weights())
    why = strategy.label + " does not load them by shard";
  else if (bytes == nullptr || bytes->param_bytes() != 4 || abi_minor_of(reg, job.precision) < 7)
    why = precision.label + " converts them";
  for (const auto& c : job.callbacks)
    if (why.empty() && abi_minor_of(reg, c) < 7)
      why = "callback '" + c.plugin + "' predates ABI 1.7 and may read them";
  if (!why.empty())
    model.call("load_deferred_weights", [&](v1::Model&) { d->load_deferred_weights(); return 0; });
  return why;
}

// Components that report their own per-step figures (capability v1::StepMetricsSource).
template <class T>
v1::StepMetricsSource* metrics_source(Slot<T>& slot) {
  return dynamic_cast<v1::StepMetricsSource*>(slot.obj.get());
}

// The plan: the batch layout with its sampler (built once, here) and the [trainer] settings the
// loop reads, all fixed before the first step.
RunPlan plan_run(const v1::Options& trainer, const v1::RunContext& ctx, int64_t train_samples,
                 int64_t eval_samples, int64_t completions_per_sample, int64_t steps_per_batch) {
  RunPlan p{make_plan(trainer, ctx.world_size, ctx.rank, train_samples, completions_per_sample,
                      steps_per_batch)};
  p.train_samples = train_samples;
  p.eval_samples = eval_samples;
  p.stop_after = trainer.get_int("stop_after_steps");
  p.max_skipped_fraction = trainer.get_double("max_skipped_fraction");
  p.clip = trainer.get_double("gradient_clip_val");
  p.clip_by_value = trainer.get_string("gradient_clip_algorithm") == "value";
  p.log_every = trainer.get_int("log_every");
  p.eval_every = trainer.get_int("eval_every");
  p.eval_on_start = trainer.get_bool("eval_on_start");
  p.eval_max_batches = trainer.get_int("eval_max_batches");
  p.eval_batch_size = trainer.get_int("eval_batch_size") > 0 ? trainer.get_int("eval_batch_size")
                                                             : p.steps().micro_batch_size;
  // Test hook for elastic restarts: TRAINRUN_TEST_SIGKILL_AT_STEP=N (1-based) makes rank
  // TRAINRUN_TEST_SIGKILL_RANK (default 0) kill itself with SIGKILL as step N starts, in the
  // first attempt only (not after a [launch] max_restarts restart).
  const char* kill_at_env = std::getenv("TRAINRUN_TEST_SIGKILL_AT_STEP");
  p.kill_at = kill_at_env && !std::getenv("TRAINRUN_RESTART") ? std::atoll(kill_at_env) : -1;
  const char* kill_rank_env = std::getenv("TRAINRUN_TEST_SIGKILL_RANK");
  p.kill_rank = kill_rank_env ? std::atoi(kill_rank_env) : 0;
  return p;
}

}  // namespace

Run::Run(const JobConfig& job, const Registry& registry)
    : job_(job), registry_(registry) {
  env_.t_start = Clock::now();
  env_.ctx = context_from_environment(job);
  env_.lead = env_.ctx.rank == 0;
  prepare_run_dir();
  build_components();
  resolve_capabilities();
  set_up_model();
  set_up_checkpoints();
  prepare_reference();
  set_up_eval_tasks();
}

void Run::write_job() const {
  std::ofstream f(fs::path(env_.ctx.run_dir) / "job.toml");
  f << "# resolved from " << job_.file << " (every default filled in)\n";
  // Under mpiexec, srun or a cluster's operator the launcher's layout is what ran, whatever
  // [launch] says (context_from_environment says so at start-up too).
  const int64_t asked = job_.launch.get_int("nproc_per_node") * job_.launch.get_int("nnodes");
  if (env_.ctx.world_size != asked) {
    const WorkerEnvironment env = detect_worker_environment();
    f << "# started by " << (env.source.empty() ? std::string("a launcher") : env.source)
      << " as world_size " << env_.ctx.world_size << " (" << env_.ctx.local_world_size
      << " on this node): that layout ran, not [launch] below\n";
  }
  f << job_.resolved_toml;
  if (!f) throw v1::Error("cannot write " + (fs::path(env_.ctx.run_dir) / "job.toml").string());
}

void Run::prepare_run_dir() {
  // Under trainrun's agent, run_dir was rotated before any worker started. Under mpiexec, srun
  // or torchrun nobody did it, and rank 0 must move an earlier run aside before any other rank
  // writes there. The ranks agree on that with a barrier of the accelerator's communicator,
  // right after it is built (before it, nothing but this create_directories touches run_dir):
  // it needs no shared identifier of the launch (which a marker file would, and which mpiexec
  // and srun do not give in a portable way), leaves no stale marker behind, and is bounded by
  // the collective timeout instead of a poll on a possibly shared file system.
  env_.rotate_here = !detect_worker_environment().run_dir_ready;
  // The process that prepares run_dir holds its lock for the whole run (run_dir.hpp).
  if (env_.rotate_here && env_.lead) env_.run_dir_lock = RunDirLock::acquire(env_.ctx.run_dir);
  fs::create_directories(env_.ctx.run_dir);
  // job.toml goes in as early as possible, so a run that fails while building its components
  // still says what it was: at once when the agent has rotated run_dir or there is no other
  // rank, else after the accelerator exists (rotation, then the barrier in build_components).
  if (env_.lead && (!env_.rotate_here || env_.ctx.world_size == 1)) {
    if (env_.rotate_here) keep_previous_run(env_.ctx.run_dir);
    write_job();
  }
}

// On a device (cuda) the mem_* metrics are the accelerator's allocator statistics (bytes held
// by tensors on the device, as the CPU tracker counts host tensors); its peak is the peak since
// the start (the Accelerator interface has no reset), the CPU tracker's the step's.
int64_t Run::memory_now(bool peak) {
  if (!env_.device_memory) return peak ? tracked_peak_bytes() : tracked_current_bytes();
  const v1::MemoryStats m =
      parts_.accelerator.call("memory_stats", [](v1::Accelerator& a) { return a.memory_stats(); });
  return peak ? m.peak_bytes : m.current_bytes;
}

void Run::build_components() {
  const bool early = !env_.rotate_here || env_.ctx.world_size == 1;
  torch::manual_seed(env_.ctx.seed);
  parts_.accelerator = build<v1::Accelerator>(registry_, job_.accelerator, env_.ctx);
  if (env_.lead && !early) {
    keep_previous_run(env_.ctx.run_dir);
    write_job();
  }
  if (env_.rotate_here && env_.ctx.world_size > 1) {
    parts_.accelerator.call("barrier (run_dir ready)", [](v1::Accelerator& a) {
      a.communicator().barrier()->wait();
      return 0;
    });
  }
  env_.runtime_lines = report_runtime(parts_.accelerator, env_.ctx);
  parts_.dataset = build<v1::Dataset>(registry_, job_.data, env_.ctx);
  env_.ctx.data = parts_.dataset.call("info", [](v1::Dataset& d) { return d.info(); });
  // Re-seed so the model's initial weights depend on the seed alone, not on what the dataset
  // or accelerator drew while being built.
  torch::manual_seed(env_.ctx.seed);
  env_.device_memory =
      !parts_.accelerator.call("device", [](v1::Accelerator& a) { return a.device(); }).is_cpu();
  // What the process holds before the model exists (libraries, dataset): mem_model_state_bytes
  // is measured from here.
  env_.mem_baseline = memory_now(false);
  parts_.model = build<v1::Model>(registry_, job_.model, env_.ctx);
  const std::string init_weights = job_.trainer.get_string("init_weights");
  if (!init_weights.empty()) {
    if (auto* d = dynamic_cast<v1::DeferredWeights*>(parts_.model.obj.get()))
      parts_.model.call("load_deferred_weights", [&](v1::Model&) { d->load_deferred_weights(); return 0; });
    load_initial_weights(*parts_.model.obj, init_weights, parts_.model.label);
  }
  parts_.precision = build<v1::Precision>(registry_, job_.precision, env_.ctx);
  parts_.strategy = build<v1::Strategy>(registry_, job_.strategy, env_.ctx);
  parts_.optimizer = build<v1::Optimizer>(registry_, job_.optimizer, env_.ctx);
  for (const auto& c : job_.callbacks) parts_.callbacks.push_back(build<v1::Callback>(registry_, c, env_.ctx));
  if (!job_.objective.plugin.empty())
    parts_.objective = build<v1::Objective>(registry_, job_.objective, env_.ctx);
  add_default_callbacks();
  // [[rewards]] (ABI 1.10) are scored by an online objective (set_up_online_objective).
  if (!job_.rewards.empty() && env_.lead &&
      dynamic_cast<v1::OnlineObjective*>(parts_.objective.obj.get()) == nullptr)
    log_warn(job_.file + ": [[rewards]] are validated but not used: only an online objective " +
             "([objective] plugin = \"grpo\") trains on rewards (try them with `trainrun reward`)");
  settle_deferred_weights(parts_.model, !init_weights.empty(), registry_, job_, parts_.precision, parts_.strategy);
  parts_.comm = parts_.accelerator.call("communicator", [](v1::Accelerator& a) { return &a.communicator(); });
}

// The default callbacks joined the job at validation (config.cpp, kDefaultCallbacks) when their
// plugins are installed; one that is not is said here, once per run, with what it would write.
void Run::add_default_callbacks() {
  for (const auto& d : kDefaultCallbacks) {
    const bool present = std::any_of(job_.callbacks.begin(), job_.callbacks.end(),
                                     [&](const ComponentConfig& c) { return c.plugin == d.plugin; });
    if (!present)
      log_warn(std::string("no '") + d.plugin + "' callback plugin found: " + d.output + " will not be written");
  }
}

// Every capability the run uses, looked up once. Batch grew in ABI 1.6 (position_ids,
// segment_ids): batches of an older dataset are received in their own layout; behind an older
// strategy (whose copies of a batch end before the new fields) a model must not read them, and
// a batch that needs them is refused (get_batch, step.cpp).
void Run::resolve_capabilities() {
  caps_.data_abi = abi_minor_of(registry_, job_.data);
  caps_.strategy_abi = abi_minor_of(registry_, job_.strategy);
  caps_.fields_reader = dynamic_cast<v1::BatchFieldsReader*>(parts_.model.obj.get());
  if (auto* m = metrics_source(parts_.strategy)) caps_.metric_sources.push_back({parts_.strategy.label, m});
  if (auto* m = metrics_source(parts_.precision)) caps_.metric_sources.push_back({parts_.precision.label, m});
  if (auto* m = metrics_source(parts_.optimizer)) caps_.metric_sources.push_back({parts_.optimizer.label, m});
  // Checkpoints: the policy is a callback with the CheckpointPolicy capability (at most one);
  // the I/O is the core's (checkpoint.cpp), the pieces are the strategy's.
  for (auto& cb : parts_.callbacks)
    if (auto* p = dynamic_cast<v1::CheckpointPolicy*>(cb.obj.get())) {
      if (caps_.policy != nullptr)
        throw ConfigError(job_.file + ": two [[callbacks]] decide checkpoints (" + cb.label +
                          " and an earlier one); list one");
      caps_.policy = p;
    }
  caps_.checkpointable = dynamic_cast<v1::CheckpointableStrategy*>(parts_.strategy.obj.get());
  // Components whose state travels beside the tensors (capability CheckpointState).
  auto add = [&](const std::string& key, auto& slot) {
    if (auto* c = dynamic_cast<v1::CheckpointState*>(slot.obj.get())) caps_.state_holders.push_back({key, c});
  };
  add("precision", parts_.precision);
  add("optimizer", parts_.optimizer);
  add("strategy", parts_.strategy);
  add("model", parts_.model);
  for (size_t i = 0; i < parts_.callbacks.size(); ++i) add("callbacks." + std::to_string(i), parts_.callbacks[i]);
  caps_.sharded_source = dynamic_cast<v1::ShardedStateDictSource*>(parts_.strategy.obj.get());
  // Callbacks that want the gathered final state (capability v1::FinalStateDictConsumer).
  for (auto& cb : parts_.callbacks)
    if (auto* c = dynamic_cast<v1::FinalStateDictConsumer*>(cb.obj.get())) caps_.state_consumers.push_back({&cb, c});
  // A model may want it too (ABI 1.5: llama writes <run_dir>/hf/ from it).
  caps_.model_consumer = dynamic_cast<v1::FinalStateDictConsumer*>(parts_.model.obj.get());
}

void Run::set_up_model() {
  if (caps_.strategy_abi < 6)
    if (auto* reader = caps_.fields_reader)
      parts_.model.call("set_batch_fields_available", [&](v1::Model&) { reader->set_batch_fields_available(false); return 0; });
  const int64_t train_samples = parts_.dataset.call("size", [](v1::Dataset& d) { return d.size(v1::Split::Train); });
  const int64_t eval_samples = parts_.dataset.call("size", [](v1::Dataset& d) { return d.size(v1::Split::Eval); });
  set_up_online_objective();
  plan_.emplace(plan_run(job_.trainer, env_.ctx, train_samples, eval_samples,
                         caps_.online ? caps_.rollout.num_generations : 1,
                         caps_.online ? caps_.rollout.num_iterations : 1));
  if (eval_samples == 0 && env_.lead)
    log_warn(job_.file + ": [data] " + job_.data.plugin + " gives 0 held-out (eval) samples: " +
             "no evaluation runs and no eval loss is logged (give the dataset a held-out part, " +
             "e.g. its eval_paths or validation_fraction where it has them)");

  parts_.precision.call("convert", [&](v1::Precision& p) { p.convert(*parts_.model.obj); return 0; });
  for (auto& cb : parts_.callbacks) cb.call("on_setup", [&](v1::Callback& c) { c.on_setup(*parts_.model.obj, env_.ctx); return 0; });
  if (const std::string f = freeze_parameters(job_.trainer, *parts_.model.obj); !f.empty() && env_.lead)
    log_info("freeze: " + f);
  set_up_objective();
  check_online_reference();
  plan_->n_params = parts_.model.call("count parameters", [](v1::Model& m) { return count_model_parameters(m); });
  // On the units as the callbacks left them, before a strategy hooks or shards them.
  plan_->checkpointed = install_activation_checkpointing(job_.trainer, parts_.model);
  if (auto* shapes = dynamic_cast<v1::ParameterShapesAware*>(parts_.optimizer.obj.get())) {
    // Before the strategy shards anything: a sharded strategy hands the optimizer 1-D pieces.
    std::map<std::string, std::vector<int64_t>> by_name;
    for (const auto& p : parts_.model.call("named_parameters", [](v1::Model& m) { return m.named_parameters(); }))
      by_name[p.name] = p.tensor.sizes().vec();
    parts_.optimizer.call("set_parameter_shapes", [&](v1::Optimizer&) { shapes->set_parameter_shapes(by_name); return 0; });
  }
  // After everything that sees the whole model (precision, callbacks, freezing), before the
  // strategy, which then never sees the experts.
  set_up_experts();
  if (auto* aware = dynamic_cast<v1::MemoryInputsAware*>(parts_.strategy.obj.get())) {
    const int64_t total = parts_.accelerator.call("memory_stats", [](v1::Accelerator& a) { return a.memory_stats(); }).total_bytes;
    const v1::MemoryInputs mi = memory_inputs(parts_.precision.obj.get(), parts_.optimizer.obj.get(), total,
                                              env_.ctx.local_world_size, env_.ctx.world_size);
    parts_.strategy.call("set_memory_inputs", [&](v1::Strategy&) { aware->set_memory_inputs(mi); return 0; });
  }
  parts_.strategy.call("setup", [&](v1::Strategy& s) { s.setup(*parts_.model.obj, *parts_.accelerator.obj, plan_->steps()); return 0; });
  if (const std::string k = keep_frozen_weight_copies(parts_.model, parts_.precision,
                                                      abi_minor_of(registry_, job_.model));
      !k.empty() && env_.lead)
    log_info("precision " + job_.precision.plugin + ": " + k);
  parts_.params = parts_.strategy.call("optimizer_parameters", [](v1::Strategy& s) { return s.optimizer_parameters(); });
  parts_.params.insert(parts_.params.end(), experts_.trainable.begin(), experts_.trainable.end());
  parts_.optimizer.call("init", [&](v1::Optimizer& o) { o.init(parts_.params, plan_->steps()); return 0; });
  torch::manual_seed(rank_seed(env_.ctx.seed, env_.ctx.rank));
}

uint32_t Run::abi_minor_of_model() const { return abi_minor_of(registry_, job_.model); }

void Run::set_up_checkpoints() {
  env_.ckpt_root = caps_.policy ? caps_.policy->checkpoint_settings().dir
                       : (fs::path(env_.ctx.run_dir) / "checkpoints").string();
  // Before the first step, not at the first save: a job that cannot checkpoint says so at once.
  if (caps_.policy != nullptr || !job_.trainer.get_string("resume").empty()) checkpointable();
  if (caps_.policy != nullptr) check_checkpoint_dir_writable(env_.ckpt_root, env_.ctx.rank);
}

void Run::print_banner(size_t n_units) {
  std::cout
      << "trainrun " << TRAINRUN_VERSION << " | LibTorch " << TRAINRUN_BUILD_TORCH_VERSION
      << " | run_dir " << env_.ctx.run_dir << "\n"
      << "  model       "
      << parts_.model.call("describe", [](v1::Model& m) { return m.describe(); }) << ", "
      << plan_->n_params << " parameters, " << (n_units ? n_units : 1) << " unit(s)\n"
      << "  data        " << job_.data.plugin << ": " << plan_->train_samples << " train / "
      << plan_->eval_samples << " eval samples\n"
      << "  accelerator " << job_.accelerator.plugin << ": "
      << parts_.accelerator.call("describe", [](v1::Accelerator& a) { return a.describe(); })
      << "\n"
      << "  strategy " << job_.strategy.plugin << " | precision " << job_.precision.plugin
      << " | optimizer " << job_.optimizer.plugin
      << (job_.objective.plugin.empty()
              ? ""
              : " | objective " + job_.objective.plugin +
                    (plan_->reference == ReferenceMode::AdaptersOff   ? " (reference: adapters off)"
                     : plan_->reference == ReferenceMode::Precomputed ? " (reference: precomputed)"
                                                                      : ""))
      << (plan_->checkpointed.empty() ? "" : " | activation checkpointing " + plan_->checkpointed)
      << "\n";
  for (size_t i = 0; i < env_.runtime_lines.size(); ++i)
    std::cout << (i ? "              " : "  runtime     ") << env_.runtime_lines[i] << "\n";
  std::cout << "  batch: global " << plan_->steps().global_batch_size << " = micro "
            << plan_->steps().micro_batch_size << " x accumulation " << plan_->steps().accumulation_steps
            << " x world " << env_.ctx.world_size << " | " << plan_->steps().total_steps << " steps ("
            << plan_->steps().steps_per_epoch << " per epoch";
  if (plan_->batches.sampler.dropped_per_epoch())
    std::cout << ", last " << plan_->batches.sampler.dropped_per_epoch() << " samples of each epoch skipped (drop_last)";
  if (plan_->batches.sampler.padded_per_epoch())
    std::cout << ", " << plan_->batches.sampler.padded_per_epoch() << " samples repeated to fill the last batch";
  std::cout << ")" << std::endl;
  if (caps_.online != nullptr) {
    const v1::RolloutSpec& r = caps_.rollout;
    std::cout << "  rollouts: " << plan_->steps().global_batch_size / r.num_generations
              << " prompts x " << r.num_generations
              << " completions of <= " << r.max_completion_length << " tokens per "
              << r.num_iterations << (r.num_iterations == 1 ? " step" : " steps")
              << " (temperature " << r.temperature << (r.old_logps ? ", old log-probabilities" : "")
              << (r.reference ? ", reference: adapters off" : "") << ")" << std::endl;
  }
}

}  // namespace trainrun::core
