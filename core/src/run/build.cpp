// The build phase: the run directory, every component through the registry, the capabilities
// the loop will use (resolved here, once), the model as the precision, the callbacks and
// [trainer] leave it, then Strategy::setup and Optimizer::init, and the checkpoint settings.
#include "run.hpp"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "setup.hpp"
#include "trainrun/deferred_weights.hpp"
#include "trainrun/core/log.hpp"
#include "trainrun/core/launcher.hpp"
#include "trainrun/core/memory.hpp"
#include "trainrun/core/trainer.hpp"

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

}  // namespace

Run::Run(const JobConfig& job, const Registry& registry)
    : job_(job), registry_(registry), t_start_(Clock::now()), ctx_(context_from_environment(job)) {
  lead_ = ctx_.rank == 0;
  prepare_run_dir();
  build_components();
  resolve_capabilities();
  set_up_model();
  set_up_checkpoints();
}

void Run::write_job() const {
  std::ofstream f(fs::path(ctx_.run_dir) / "job.toml");
  f << "# resolved from " << job_.file << " (every default filled in)\n";
  // Under mpiexec, srun or a cluster's operator the launcher's layout is what ran, whatever
  // [launch] says (context_from_environment says so at start-up too).
  const int64_t asked = job_.launch.get_int("nproc_per_node") * job_.launch.get_int("nnodes");
  if (ctx_.world_size != asked) {
    const WorkerEnvironment env = detect_worker_environment();
    f << "# started by " << (env.source.empty() ? std::string("a launcher") : env.source)
      << " as world_size " << ctx_.world_size << " (" << ctx_.local_world_size
      << " on this node): that layout ran, not [launch] below\n";
  }
  f << job_.resolved_toml;
  if (!f) throw v1::Error("cannot write " + (fs::path(ctx_.run_dir) / "job.toml").string());
}

void Run::prepare_run_dir() {
  // Under trainrun's agent, run_dir was rotated before any worker started. Under mpiexec, srun
  // or torchrun nobody did it, and rank 0 must move an earlier run aside before any other rank
  // writes there. The ranks agree on that with a barrier of the accelerator's communicator,
  // right after it is built (before it, nothing but this create_directories touches run_dir):
  // it needs no shared identifier of the launch (which a marker file would, and which mpiexec
  // and srun do not give in a portable way), leaves no stale marker behind, and is bounded by
  // the collective timeout instead of a poll on a possibly shared file system.
  rotate_here_ = !detect_worker_environment().run_dir_ready;
  // The process that prepares run_dir holds its lock for the whole run (run_dir.hpp).
  if (rotate_here_ && lead_) run_dir_lock_ = RunDirLock::acquire(ctx_.run_dir);
  fs::create_directories(ctx_.run_dir);
  // job.toml goes in as early as possible, so a run that fails while building its components
  // still says what it was: at once when the agent has rotated run_dir or there is no other
  // rank, else after the accelerator exists (rotation, then the barrier in build_components).
  if (lead_ && (!rotate_here_ || ctx_.world_size == 1)) {
    if (rotate_here_) keep_previous_run(ctx_.run_dir);
    write_job();
  }
}

// On a device (cuda) the mem_* metrics are the accelerator's allocator statistics (bytes held
// by tensors on the device, as the CPU tracker counts host tensors); its peak is the peak since
// the start (the Accelerator interface has no reset), the CPU tracker's the step's.
int64_t Run::memory_now(bool peak) {
  if (!device_memory_) return peak ? tracked_peak_bytes() : tracked_current_bytes();
  const v1::MemoryStats m =
      accelerator_.call("memory_stats", [](v1::Accelerator& a) { return a.memory_stats(); });
  return peak ? m.peak_bytes : m.current_bytes;
}

void Run::build_components() {
  const bool early = !rotate_here_ || ctx_.world_size == 1;
  torch::manual_seed(ctx_.seed);
  accelerator_ = build<v1::Accelerator>(registry_, job_.accelerator, ctx_);
  if (lead_ && !early) {
    keep_previous_run(ctx_.run_dir);
    write_job();
  }
  if (rotate_here_ && ctx_.world_size > 1) {
    accelerator_.call("barrier (run_dir ready)", [](v1::Accelerator& a) {
      a.communicator().barrier()->wait();
      return 0;
    });
  }
  runtime_lines_ = report_runtime(accelerator_, ctx_);
  dataset_ = build<v1::Dataset>(registry_, job_.data, ctx_);
  ctx_.data = dataset_.call("info", [](v1::Dataset& d) { return d.info(); });
  // Re-seed so the model's initial weights depend on the seed alone, not on what the dataset
  // or accelerator drew while being built.
  torch::manual_seed(ctx_.seed);
  device_memory_ =
      !accelerator_.call("device", [](v1::Accelerator& a) { return a.device(); }).is_cpu();
  // What the process holds before the model exists (libraries, dataset): mem_model_state_bytes
  // is measured from here.
  mem_baseline_ = memory_now(false);
  model_ = build<v1::Model>(registry_, job_.model, ctx_);
  const std::string init_weights = job_.trainer.get_string("init_weights");
  if (!init_weights.empty()) {
    if (auto* d = dynamic_cast<v1::DeferredWeights*>(model_.obj.get()))
      model_.call("load_deferred_weights", [&](v1::Model&) { d->load_deferred_weights(); return 0; });
    load_initial_weights(*model_.obj, init_weights, model_.label);
  }
  precision_ = build<v1::Precision>(registry_, job_.precision, ctx_);
  strategy_ = build<v1::Strategy>(registry_, job_.strategy, ctx_);
  optimizer_ = build<v1::Optimizer>(registry_, job_.optimizer, ctx_);
  for (const auto& c : job_.callbacks) callbacks_.push_back(build<v1::Callback>(registry_, c, ctx_));
  add_default_callbacks();
  settle_deferred_weights(model_, !init_weights.empty(), registry_, job_, precision_, strategy_);
  comm_ = accelerator_.call("communicator", [](v1::Accelerator& a) { return &a.communicator(); });
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
  data_abi_ = abi_minor_of(registry_, job_.data);
  strategy_abi_ = abi_minor_of(registry_, job_.strategy);
  fields_reader_ = dynamic_cast<v1::BatchFieldsReader*>(model_.obj.get());
  if (auto* m = metrics_source(strategy_)) metric_sources_.push_back({strategy_.label, m});
  if (auto* m = metrics_source(precision_)) metric_sources_.push_back({precision_.label, m});
  if (auto* m = metrics_source(optimizer_)) metric_sources_.push_back({optimizer_.label, m});
  // Checkpoints: the policy is a callback with the CheckpointPolicy capability (at most one);
  // the I/O is the core's (checkpoint.cpp), the pieces are the strategy's.
  for (auto& cb : callbacks_)
    if (auto* p = dynamic_cast<v1::CheckpointPolicy*>(cb.obj.get())) {
      if (policy_ != nullptr)
        throw ConfigError(job_.file + ": two [[callbacks]] decide checkpoints (" + cb.label +
                          " and an earlier one); list one");
      policy_ = p;
    }
  checkpointable_ = dynamic_cast<v1::CheckpointableStrategy*>(strategy_.obj.get());
  // Components whose state travels beside the tensors (capability CheckpointState).
  auto add = [&](const std::string& key, auto& slot) {
    if (auto* c = dynamic_cast<v1::CheckpointState*>(slot.obj.get())) state_holders_.push_back({key, c});
  };
  add("precision", precision_);
  add("optimizer", optimizer_);
  add("strategy", strategy_);
  add("model", model_);
  for (size_t i = 0; i < callbacks_.size(); ++i) add("callbacks." + std::to_string(i), callbacks_[i]);
  sharded_source_ = dynamic_cast<v1::ShardedStateDictSource*>(strategy_.obj.get());
  // Callbacks that want the gathered final state (capability v1::FinalStateDictConsumer).
  for (auto& cb : callbacks_)
    if (auto* c = dynamic_cast<v1::FinalStateDictConsumer*>(cb.obj.get())) state_consumers_.push_back({&cb, c});
  // A model may want it too (ABI 1.5: llama writes <run_dir>/hf/ from it).
  model_consumer_ = dynamic_cast<v1::FinalStateDictConsumer*>(model_.obj.get());
}

void Run::set_up_model() {
  if (strategy_abi_ < 6)
    if (auto* reader = fields_reader_)
      model_.call("set_batch_fields_available", [&](v1::Model&) { reader->set_batch_fields_available(false); return 0; });
  train_samples_ = dataset_.call("size", [](v1::Dataset& d) { return d.size(v1::Split::Train); });
  eval_samples_ = dataset_.call("size", [](v1::Dataset& d) { return d.size(v1::Split::Eval); });
  plan_ = make_plan(job_.trainer, ctx_.world_size, train_samples_);

  precision_.call("convert", [&](v1::Precision& p) { p.convert(*model_.obj); return 0; });
  for (auto& cb : callbacks_) cb.call("on_setup", [&](v1::Callback& c) { c.on_setup(*model_.obj, ctx_); return 0; });
  if (const std::string f = freeze_parameters(job_.trainer, *model_.obj); !f.empty() && lead_)
    log_info("freeze: " + f);
  n_params_ = model_.call("count parameters", [](v1::Model& m) { return count_model_parameters(m); });
  // On the units as the callbacks left them, before a strategy hooks or shards them.
  checkpointed_ = install_activation_checkpointing(job_.trainer, model_);
  if (auto* shapes = dynamic_cast<v1::ParameterShapesAware*>(optimizer_.obj.get())) {
    // Before the strategy shards anything: a sharded strategy hands the optimizer 1-D pieces.
    std::map<std::string, std::vector<int64_t>> by_name;
    for (const auto& p : model_.call("named_parameters", [](v1::Model& m) { return m.named_parameters(); }))
      by_name[p.name] = p.tensor.sizes().vec();
    optimizer_.call("set_parameter_shapes", [&](v1::Optimizer&) { shapes->set_parameter_shapes(by_name); return 0; });
  }
  if (auto* aware = dynamic_cast<v1::MemoryInputsAware*>(strategy_.obj.get())) {
    const int64_t total = accelerator_.call("memory_stats", [](v1::Accelerator& a) { return a.memory_stats(); }).total_bytes;
    const v1::MemoryInputs mi = memory_inputs(precision_.obj.get(), optimizer_.obj.get(), total,
                                              ctx_.local_world_size, ctx_.world_size);
    strategy_.call("set_memory_inputs", [&](v1::Strategy&) { aware->set_memory_inputs(mi); return 0; });
  }
  strategy_.call("setup", [&](v1::Strategy& s) { s.setup(*model_.obj, *accelerator_.obj, plan_); return 0; });
  params_ = strategy_.call("optimizer_parameters", [](v1::Strategy& s) { return s.optimizer_parameters(); });
  optimizer_.call("init", [&](v1::Optimizer& o) { o.init(params_, plan_); return 0; });
  torch::manual_seed(rank_seed(ctx_.seed, ctx_.rank));
}

void Run::set_up_checkpoints() {
  ckpt_root_ = policy_ ? policy_->checkpoint_settings().dir
                       : (fs::path(ctx_.run_dir) / "checkpoints").string();
  // Before the first step, not at the first save: a job that cannot checkpoint says so at once.
  if (policy_ != nullptr || !job_.trainer.get_string("resume").empty()) checkpointable();
  if (policy_ != nullptr) check_checkpoint_dir_writable(ckpt_root_, ctx_.rank);
}

void Run::print_banner(size_t n_units) {
  std::cout << "trainrun " << TRAINRUN_VERSION << " | LibTorch " << TRAINRUN_BUILD_TORCH_VERSION
            << " | run_dir " << ctx_.run_dir << "\n"
            << "  model       "
            << model_.call("describe", [](v1::Model& m) { return m.describe(); }) << ", "
            << n_params_ << " parameters, " << (n_units ? n_units : 1) << " unit(s)\n"
            << "  data        " << job_.data.plugin << ": " << train_samples_ << " train / "
            << eval_samples_ << " eval samples\n"
            << "  accelerator " << job_.accelerator.plugin << ": "
            << accelerator_.call("describe", [](v1::Accelerator& a) { return a.describe(); }) << "\n"
            << "  strategy " << job_.strategy.plugin << " | precision " << job_.precision.plugin
            << " | optimizer " << job_.optimizer.plugin
            << (checkpointed_.empty() ? "" : " | activation checkpointing " + checkpointed_)
            << "\n";
  for (size_t i = 0; i < runtime_lines_.size(); ++i)
    std::cout << (i ? "              " : "  runtime     ") << runtime_lines_[i] << "\n";
  std::cout << "  batch: global " << plan_.global_batch_size << " = micro "
            << plan_.micro_batch_size << " x accumulation " << plan_.accumulation_steps
            << " x world " << ctx_.world_size << " | " << plan_.total_steps << " steps ("
            << plan_.steps_per_epoch << " per epoch";
  if (sampler_->dropped_per_epoch())
    std::cout << ", last " << sampler_->dropped_per_epoch() << " samples of each epoch skipped (drop_last)";
  if (sampler_->padded_per_epoch())
    std::cout << ", " << sampler_->padded_per_epoch() << " samples repeated to fill the last batch";
  std::cout << ")" << std::endl;
}

}  // namespace trainrun::core
