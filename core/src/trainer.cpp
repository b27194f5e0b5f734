// The training loop. One optimizer step: accumulation_steps micro-batches, each run through the
// strategy's forward under the precision's autocast, with the loss normalised by the number of
// targets in the whole global batch (so accumulation and world size do not change the
// gradient); then gradient sync, unscale + finite check, clipping, the optimizer step.
#include "trainrun/core/trainer.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fnmatch.h>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "trainrun/activation_checkpointing.hpp"
#include "trainrun/deferred_weights.hpp"
#include "trainrun/linear.hpp"

#include "trainrun/core/checkpoint.hpp"
#include "trainrun/core/launcher.hpp"
#include "trainrun/core/log.hpp"
#include "trainrun/core/memory.hpp"
#include "trainrun/core/runtime.hpp"
#include "trainrun/core/safetensors.hpp"
#include "trainrun/core/run_dir.hpp"
#include "trainrun/core/sampler.hpp"

namespace fs = std::filesystem;

namespace trainrun::core {

using v1::ConfigError;

namespace {

std::atomic<int> g_stop_signal{0};
// The launcher's stop protocol (core/src/launcher/agent.cpp): under trainrun's agent, fd 3
// (TRAINRUN_CONTROL_FD) is a pipe to it, and the worker says there that a stop signal arrived
// and when a checkpoint write begins and ends, so that the agent waits for a save in progress
// instead of killing it after stop_grace_s.
int g_control_fd = -1;

void open_control_channel() {
  const char* v = std::getenv("TRAINRUN_CONTROL_FD");
  if (v == nullptr) return;
  const int fd = std::atoi(v);
  if (fd >= 3 && fcntl(fd, F_GETFD) != -1) g_control_fd = fd;
}

// Async-signal-safe: called from the signal handler too.
void control_message(const char* msg, size_t len) {
  if (g_control_fd < 0) return;
  [[maybe_unused]] ssize_t n = write(g_control_fd, msg, len);
}

void control_message(const std::string& msg) {
  const std::string line = msg + "\n";
  control_message(line.data(), line.size());
}

extern "C" void on_stop_signal(int sig) {
  const int saved = errno;
  if (g_stop_signal.load() == 0) control_message("stopping\n", 9);
  g_stop_signal.store(sig);
  // A second Ctrl-C ends the process at once. A second SIGTERM does not: a cluster (SLURM)
  // may signal every process of the job as well as the launcher, which then forwards one
  // more, and the step and checkpoint in progress must still finish.
  if (sig == SIGINT) std::signal(sig, SIG_DFL);
  errno = saved;
}

std::string fmt_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  long t = static_cast<long>(s + 0.5);
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << "h" << std::setw(2) << std::setfill('0') << (t % 3600) / 60 << "m";
  else if (t >= 60) os << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else os << t << "s";
  return os.str();
}

std::string fmt_scale(double scale) {
  std::ostringstream os;
  os << std::setprecision(12) << scale;
  return os.str();
}

// A component plus the label that guarded calls put in front of its errors.
template <class T>
struct Slot {
  std::unique_ptr<T> obj;
  std::string label;
  template <class F>
  auto call(const char* op, F&& fn) {
    return guarded(label, op, [&] { return fn(*obj); });
  }
};

// Components that report their own per-step figures (capability v1::StepMetricsSource).
// [trainer] init_weights: every parameter and buffer of the model from a safetensors file, by
// name; a missing, extra or reshaped tensor is an error naming the file and the tensor, raised
// before anything trains.
void load_initial_weights(v1::Model& model, const std::string& path, const std::string& label) {
  std::map<std::string, at::Tensor> file;
  if (!fs::is_regular_file(path))
    throw ConfigError("[trainer] init_weights = \"" + path + "\": " +
                      (fs::is_directory(path) ? "is a directory (a sharded state dict? give one "
                                                "full model.safetensors)"
                                              : "no such file"));
  try {
    for (auto& t : read_safetensors(path, nullptr)) file[t.name] = t.tensor;
  } catch (const v1::Error& e) {
    throw ConfigError("[trainer] init_weights: " + std::string(e.what()));
  }
  std::vector<v1::NamedTensor> targets = model.named_parameters();
  for (auto& b : model.named_buffers()) targets.push_back(b);
  std::set<std::string> used;
  torch::NoGradGuard no_grad;
  for (auto& t : targets) {
    auto it = file.find(t.name);
    if (it == file.end())
      throw ConfigError("[trainer] init_weights = \"" + path + "\": no tensor '" + t.name +
                        "' for " + label);
    if (it->second.sizes() != t.tensor.sizes())
      throw ConfigError("[trainer] init_weights = \"" + path + "\": tensor '" + t.name +
                        "' has shape " + c10::str(it->second.sizes()) + ", the model's has " +
                        c10::str(t.tensor.sizes()));
    if (it->second.is_floating_point() && !torch::isfinite(it->second).all().item<bool>()) {
      const int64_t nan = torch::isnan(it->second).sum().item<int64_t>();
      const int64_t inf = torch::isinf(it->second).sum().item<int64_t>();
      throw ConfigError("[trainer] init_weights = \"" + path + "\": tensor '" + t.name + "' holds " +
                        std::to_string(nan) + " NaN and " + std::to_string(inf) + " infinite value(s)");
    }
    t.tensor.copy_(it->second);
    used.insert(t.name);
  }
  for (const auto& [name, _] : file)
    if (!used.count(name))
      throw ConfigError("[trainer] init_weights = \"" + path + "\": tensor '" + name +
                        "' is not a parameter or buffer of " + label);
  log_info("init_weights: " + std::to_string(targets.size()) + " tensors loaded from " + path);
}

// [trainer] freeze: requires_grad off for every parameter whose name matches one of the
// patterns (fnmatch globs). A pattern that matches nothing is a ConfigError naming it, since a
// typo would otherwise silently train everything. Returns "k of n parameters" ("" = none).
std::string freeze_parameters(const v1::Options& trainer, v1::Model& model) {
  const auto& patterns = trainer.get_string_list("freeze");
  if (patterns.empty()) return "";
  const auto params = model.named_parameters();
  std::set<std::string> frozen;
  for (const auto& pat : patterns) {
    bool hit = false;
    for (const auto& p : params)
      if (fnmatch(pat.c_str(), p.name.c_str(), 0) == 0) {
        hit = true;
        frozen.insert(p.name);
      }
    if (!hit)
      throw ConfigError("[trainer] freeze: \"" + pat + "\" matches no parameter (names look like \"" +
                        (params.empty() ? std::string("?") : params.front().name) + "\")");
  }
  torch::NoGradGuard no_grad;
  int64_t n = 0, total = 0;
  for (auto& p : params) {
    total += p.tensor.numel();
    if (frozen.count(p.name)) {
      p.tensor.requires_grad_(false);
      n += p.tensor.numel();
    }
  }
  return std::to_string(frozen.size()) + " parameters frozen (" + std::to_string(n) + " of " +
         std::to_string(total) + " elements)";
}

// Exit code of a run that diverged: its weights became non-finite, or it skipped more than
// [trainer] max_skipped_fraction of its steps (distinct from 1, an error, and 2, bad input).
constexpr int kDivergedExit = 3;

// Non-finite values over a run: which kind (loss, gradients, weights), when first, and the last
// step that was wholly finite, for the diagnosis of a run that diverged. Every rank records the
// same thing: the loss is the all-reduced one and the gradient check is agreed by the ranks.
struct DivergenceWatch {
  int64_t steps = 0, skipped = 0;
  int64_t bad_loss = 0, first_bad_loss = 0;
  int64_t bad_grads = 0, first_bad_grads = 0;
  int64_t last_good = -1;          ///< last step with a finite loss and gradients (-1: none yet)
  int64_t weights_bad_after = -1;  ///< found non-finite after this step (-1: not found)

  void record(int64_t step, bool loss_finite, bool grads_finite) {
    ++steps;
    if (!loss_finite && bad_loss++ == 0) first_bad_loss = step;
    if (loss_finite && !grads_finite && bad_grads++ == 0) first_bad_grads = step;
    if (!grads_finite || !loss_finite) ++skipped;
    else last_good = step;
  }
  bool too_many_skipped(double max_fraction) const {
    return steps > 0 && static_cast<double>(skipped) > max_fraction * static_cast<double>(steps);
  }
  std::string diagnosis(double max_fraction, int64_t start_step) const {
    std::ostringstream os;
    os << "training diverged: ";
    if (weights_bad_after >= 0) os << "the weights are non-finite after step " << weights_bad_after << "; ";
    os << skipped << " of " << steps << " steps skipped ([trainer] max_skipped_fraction = "
       << max_fraction << ")";
    if (bad_loss > 0)
      os << "; non-finite loss at " << bad_loss << " step(s), first at step " << first_bad_loss;
    if (bad_grads > 0)
      os << "; non-finite gradients (with a finite loss) at " << bad_grads
         << " step(s), first at step " << first_bad_grads;
    if (last_good >= 0) os << "; last step with a finite loss and gradients: " << last_good;
    else os << "; no step of this run" << (start_step > 0 ? " (resumed at step " + std::to_string(start_step) + ")" : std::string())
            << " had a finite loss and gradients";
    os << ". Lower the learning rate, check the data and init_weights, or use fp32/bf16 where "
          "fp16 overflows";
    return os.str();
  }
};

// Whether every element of these (local) tensors is finite; the caller agrees over ranks.
bool all_finite(const std::vector<v1::NamedTensor>& tensors) {
  torch::NoGradGuard no_grad;
  for (const auto& t : tensors)
    if (t.tensor.defined() && t.tensor.is_floating_point() && !torch::isfinite(t.tensor).all().item<bool>())
      return false;
  return true;
}

// What a resume would silently change, checked against the checkpoint's metadata before any
// tensor is read: another optimizer is an error (its state would be dropped), another seed and
// an init_weights that resume overrides are warnings saying what the run does.
void check_resume(const nlohmann::json& meta, const JobConfig& job, const std::string& path,
                  uint64_t seed, bool from_restart, bool lead) {
  std::string saved_optimizer;
  for (const auto& p : meta.at("job").value("plugins", nlohmann::json::array()))
    if (p.value("role", std::string()) == "optimizer") saved_optimizer = p.value("component", std::string());
  if (!saved_optimizer.empty() && saved_optimizer != job.optimizer.plugin)
    throw ConfigError("[trainer] resume: checkpoint " + path + " was written with [optimizer] plugin = \"" +
                      saved_optimizer + "\", this run uses \"" + job.optimizer.plugin +
                      "\": its optimizer state (e.g. moments) would be dropped. Resume with the same "
                      "optimizer, or start a new run from its weights (`trainrun consolidate " + path +
                      " DIR`, then [trainer] init_weights = \"DIR/model.safetensors\")");
  if (!lead) return;
  const auto& ts = meta.at("trainer_state");
  if (ts.contains("seed") && ts.at("seed").get<uint64_t>() != seed)
    log_warn("resume: checkpoint " + path + " was written with [trainer] seed = " + ts.at("seed").dump() +
             ", this run uses " + std::to_string(seed) + ": the data order of the current epoch is "
             "drawn again from the new seed (samples of this epoch may repeat or be left out) and "
             "dropout streams differ; the run is not the continuation of the checkpointed one");
  if (!job.trainer.get_string("init_weights").empty() && !from_restart)
    log_warn("resume: [trainer] init_weights = \"" + job.trainer.get_string("init_weights") +
             "\" is ignored: the weights come from checkpoint " + path);
}

// The model's parameter count for the banner. A Linear layer whose weight a Precision replaced
// by a frozen quantized base holds packed bytes and quantization constants as parameters; it
// counts as its in x out weights, as PEFT's print_trainable_parameters counts a 4-bit weight.
int64_t count_model_parameters(v1::Model& model) {
  std::set<const void*> quant_state;
  int64_t n = 0;
  if (torch::nn::Module* root = model.module())
    for (const auto& item : root->named_modules("", false))
      if (auto l = std::dynamic_pointer_cast<v1::LinearImpl>(item.value()); l && l->base()) {
        n += l->options.in_features() * l->options.out_features();
        for (const auto& q : l->named_parameters(/*recurse=*/false))
          if (q.key() != "bias") quant_state.insert(q.value().unsafeGetTensorImpl());
      }
  for (const auto& p : model.named_parameters())
    if (!quant_state.count(p.tensor.unsafeGetTensorImpl())) n += p.tensor.numel();
  return n;
}

// A checkpoint directory that cannot be written is bad input found at the start, not at the
// first save (possibly hours later): create it and write and remove a probe file.
void check_checkpoint_dir_writable(const std::string& dir, int rank) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  bool ok = !ec;
  if (ok) {
    const fs::path probe = fs::path(dir) / (".write-test-rank-" + std::to_string(rank));
    std::ofstream f(probe);
    f << "trainrun\n";
    f.close();
    ok = f.good();
    std::error_code ignored;
    fs::remove(probe, ignored);
  }
  if (!ok)
    throw ConfigError("checkpoint directory " + dir + " is not writable (" +
                      (ec ? ec.message() : std::string("cannot create files in it")) +
                      "): fix its permissions or set the checkpoint callback's dir");
}

template <class T>
v1::StepMetricsSource* metrics_source(Slot<T>& slot) {
  return dynamic_cast<v1::StepMetricsSource*>(slot.obj.get());
}

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

// Batch as ABI 1.0-1.5 laid it out: a dataset built against such an SDK constructs only these
// fields in the caller's return slot, so the core must not receive it as a 1.6 Batch (whose
// appended tensors would be left unconstructed).
struct BatchAbi10 {
  at::Tensor input;
  at::Tensor target;
  int64_t num_samples = 0;
  int64_t num_targets = 0;
  int64_t num_tokens = 0;
};

// Dataset::batch of a dataset built against ABI < 1.6, through its own return layout. The
// virtual slot is the same (the interface is unchanged); only the returned struct is shorter,
// and both are returned through a caller-provided buffer (Itanium C++ ABI: non-trivial types).
v1::Batch legacy_batch(v1::Dataset& d, v1::Split split, const std::vector<int64_t>& idx) {
  using Fn = BatchAbi10 (v1::Dataset::*)(v1::Split, const std::vector<int64_t>&);
  const Fn fn = reinterpret_cast<Fn>(&v1::Dataset::batch);
  BatchAbi10 old = (d.*fn)(split, idx);
  v1::Batch b;
  b.input = std::move(old.input);
  b.target = std::move(old.target);
  b.num_samples = old.num_samples;
  b.num_targets = old.num_targets;
  b.num_tokens = old.num_tokens;
  return b;
}

// [trainer] activation_checkpointing: a checkpointer on every unit of the model, or on those
// named in activation_checkpointing_units. Returns "k of n units" for the banner ("" = off).
std::string install_activation_checkpointing(const v1::Options& trainer, Slot<v1::Model>& model) {
  const bool on = trainer.get_bool("activation_checkpointing");
  const auto& only = trainer.get_string_list("activation_checkpointing_units");
  if (!on) {
    if (!only.empty())
      throw ConfigError("[trainer] activation_checkpointing_units is set, but "
                        "activation_checkpointing = false; set activation_checkpointing = true");
    return "";
  }
  const std::vector<v1::Unit*> units = model.call("units", [](v1::Model& m) { return m.units(); });
  if (units.empty())
    throw ConfigError("[trainer] activation_checkpointing = true, but the model (" + model.label +
                      ") has no units: only a model that runs parts of its forward through "
                      "Unit::run(input, fn) can recompute them (e.g. gpt's blocks)");
  std::string names;
  for (const v1::Unit* u : units) names += (names.empty() ? "" : ", ") + u->name();
  for (const auto& want : only) {
    bool found = false;
    for (const v1::Unit* u : units) found = found || u->name() == want;
    if (!found)
      throw ConfigError("[trainer] activation_checkpointing_units: the model has no unit '" + want +
                        "'; its units are " + names);
  }
  size_t n = 0;
  for (v1::Unit* u : units) {
    if (!only.empty() && std::find(only.begin(), only.end(), u->name()) == only.end()) continue;
    v1::enable_activation_checkpointing(*u);
    ++n;
  }
  return std::to_string(n) + " of " + std::to_string(units.size()) + " units";
}

}  // namespace

v1::RunContext context_from_environment(const JobConfig& job) {
  const WorkerEnvironment env = detect_worker_environment();
  v1::RunContext ctx;
  ctx.rank = env.rank;
  ctx.world_size = env.world_size;
  ctx.local_rank = env.local_rank;
  ctx.local_world_size = env.local_world_size;
  const int64_t nproc = job.launch.get_int("nproc_per_node");
  const int64_t nnodes = job.launch.get_int("nnodes");
  if (!env.is_worker && nproc * nnodes > 1)
    throw ConfigError(job.file + ": [launch] asks for " + std::to_string(nproc * nnodes) +
                      " processes, but this process was not started by a launcher; run it "
                      "with `trainrun --config` (which launches them) or under mpiexec/srun");
  if (env.is_worker && env.world_size != nproc * nnodes && env.rank == 0)
    log_info(env.source + " started " + std::to_string(env.world_size) +
             " process(es); [launch] asks for " + std::to_string(nproc * nnodes) +
             " (nproc_per_node " + std::to_string(nproc) + " x nnodes " + std::to_string(nnodes) +
             "): the launcher's world size is used");
  ctx.seed = static_cast<uint64_t>(job.trainer.get_int("seed"));
  ctx.job_file = job.file;
  ctx.run_dir = run_dir_of(job);
  return ctx;
}

v1::TrainPlan make_plan(const v1::Options& trainer, int world_size, int64_t train_samples) {
  v1::TrainPlan plan;
  plan.global_batch_size = trainer.get_int("global_batch_size");
  const int64_t micro = trainer.get_int("micro_batch_size");
  const std::string error = batch_layout_error(plan.global_batch_size, micro, world_size);
  if (!error.empty()) throw ConfigError(error);
  const int64_t mb = micro > 0 ? micro : plan.global_batch_size / world_size;
  plan.micro_batch_size = mb;
  plan.accumulation_steps = plan.global_batch_size / (mb * world_size);
  DistributedSampler::Options so;
  so.num_samples = train_samples;
  so.global_batch_size = plan.global_batch_size;
  so.world_size = world_size;
  so.drop_last = trainer.get_bool("drop_last");
  plan.steps_per_epoch = DistributedSampler(so).steps_per_epoch();
  const int64_t max_steps = trainer.get_int("max_steps");
  const int64_t max_epochs = trainer.get_int("max_epochs");
  if (max_steps == 0 && max_epochs == 0)
    throw ConfigError("[trainer] set max_steps or max_epochs (both are 0)");
  plan.total_steps = max_steps > 0 ? max_steps : max_epochs * plan.steps_per_epoch;
  return plan;
}

// Each rank reads its CPU runtime back from the libraries and the kernel (thread pools, BLAS
// kernel, affinity), writes it to <run_dir>/runtime/rank-N.json, and the ranks all-gather the
// numbers so rank 0's banner shows every rank. Returns the banner lines (used on rank 0).
std::vector<std::string> report_runtime(Slot<v1::Accelerator>& accelerator, const v1::RunContext& ctx) {
  const v1::cpu::Readback rb = v1::cpu::read_back();
  const char* choice = std::getenv("TRAINRUN_BLAS_CHOICE");
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  {
    nlohmann::ordered_json j;
    j["rank"] = ctx.rank;
    j["local_rank"] = ctx.local_rank;
    j["local_world_size"] = ctx.local_world_size;
    j["intra_op_threads"] = rb.intra_op;
    j["inter_op_threads"] = rb.inter_op;
    j["blas"] = {{"openblas", rb.blas.openblas}, {"config", rb.blas.config},
                 {"corename", rb.blas.corename}, {"threads", rb.blas.threads},
                 {"choice", choice ? choice : ""}, {"OPENBLAS_CORETYPE", coretype ? coretype : ""}};
    j["affinity"] = rb.affinity;
    j["threads_total"] = rb.threads_total;
    j["threads_elsewhere"] = rb.threads_elsewhere;
    const fs::path dir = fs::path(ctx.run_dir) / "runtime";
    fs::create_directories(dir);
    std::ofstream f(dir / ("rank-" + std::to_string(ctx.rank) + ".json"));
    f << j.dump(2) << "\n";
  }
  constexpr int64_t kFields = 8;
  const int64_t first = rb.affinity.empty() ? -1 : rb.affinity.front();
  const int64_t last = rb.affinity.empty() ? -1 : rb.affinity.back();
  torch::Tensor mine = torch::tensor(
      {int64_t{rb.intra_op}, int64_t{rb.inter_op}, int64_t{rb.blas.threads},
       static_cast<int64_t>(rb.affinity.size()), first, last, int64_t{rb.threads_elsewhere},
       int64_t{rb.threads_total}},
      torch::kLong);
  torch::Tensor all = torch::empty({ctx.world_size * kFields}, torch::kLong);
  accelerator.call("all_gather (runtime report)", [&](v1::Accelerator& a) {
    a.communicator().all_gather(mine, all)->wait();
    return 0;
  });
  std::vector<std::string> lines;
  lines.push_back(libtorch_build_text() + " | " +
                  (rb.blas.openblas ? rb.blas.config : std::string("BLAS: not OpenBLAS")));
  lines.push_back("BLAS " + std::string(choice ? choice : ("kernel " + rb.blas.corename)));
  std::string ranks;
  const auto a = all.accessor<int64_t, 1>();
  const int shown = std::min(ctx.world_size, 8);
  for (int r = 0; r < shown; ++r) {
    const int64_t* v = &a[r * kFields];
    std::ostringstream os;
    os << "rank " << r << ": intra-op " << v[0] << ", inter-op " << v[1] << ", BLAS " << v[2]
       << ", CPU" << (v[3] == 1 ? " " : "s ");
    if (v[3] == v[5] - v[4] + 1) os << (v[3] == 1 ? std::to_string(v[4]) : std::to_string(v[4]) + "-" + std::to_string(v[5]));
    else os << v[3] << " of " << v[4] << "-" << v[5];
    if (v[6] > 0) os << " (" << v[6] << " of " << v[7] << " threads elsewhere)";
    ranks += (ranks.empty() ? "" : " | ") + os.str();
  }
  if (ctx.world_size > shown) ranks += " | ... (" + std::to_string(ctx.world_size - shown) + " more)";
  lines.push_back(ranks);
  return lines;
}

int train(const JobConfig& job, const Registry& registry) {
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  v1::RunContext ctx = context_from_environment(job);
  const bool lead = ctx.rank == 0;
  // Under trainrun's agent, run_dir was rotated before any worker started. Under mpiexec, srun
  // or torchrun nobody did it, and rank 0 must move an earlier run aside before any other rank
  // writes there. The ranks agree on that with a barrier of the accelerator's communicator,
  // right after it is built (before it, nothing but this create_directories touches run_dir):
  // it needs no shared identifier of the launch (which a marker file would, and which mpiexec
  // and srun do not give in a portable way), leaves no stale marker behind, and is bounded by
  // the collective timeout instead of a poll on a possibly shared file system.
  const bool rotate_here = !detect_worker_environment().run_dir_ready;
  // The process that prepares run_dir holds its lock for the whole run (run_dir.hpp).
  std::unique_ptr<RunDirLock> run_dir_lock;
  if (rotate_here && lead) run_dir_lock = RunDirLock::acquire(ctx.run_dir);
  fs::create_directories(ctx.run_dir);
  auto write_job = [&] {
    std::ofstream f(fs::path(ctx.run_dir) / "job.toml");
    f << "# resolved from " << job.file << " (every default filled in)\n" << job.resolved_toml;
    if (!f) throw v1::Error("cannot write " + (fs::path(ctx.run_dir) / "job.toml").string());
  };
  // job.toml goes in as early as possible, so a run that fails while building its components
  // still says what it was: at once when the agent has rotated run_dir or there is no other
  // rank, else after the accelerator exists (rotation, then the barrier below).
  const bool early = !rotate_here || ctx.world_size == 1;
  if (lead && early) {
    if (rotate_here) keep_previous_run(ctx.run_dir);
    write_job();
  }

  torch::manual_seed(ctx.seed);
  auto accelerator = build<v1::Accelerator>(registry, job.accelerator, ctx);
  if (lead && !early) {
    keep_previous_run(ctx.run_dir);
    write_job();
  }
  if (rotate_here && ctx.world_size > 1) {
    accelerator.call("barrier (run_dir ready)", [](v1::Accelerator& a) {
      a.communicator().barrier()->wait();
      return 0;
    });
  }
  const std::vector<std::string> runtime_lines = report_runtime(accelerator, ctx);
  auto dataset = build<v1::Dataset>(registry, job.data, ctx);
  ctx.data = dataset.call("info", [](v1::Dataset& d) { return d.info(); });
  // Re-seed so the model's initial weights depend on the seed alone, not on what the dataset
  // or accelerator drew while being built.
  torch::manual_seed(ctx.seed);
  // On a device (cuda) the mem_* metrics are the accelerator's allocator statistics (bytes held
  // by tensors on the device, as the CPU tracker counts host tensors); its peak is the peak since
  // the start (the Accelerator interface has no reset), the CPU tracker's the step's.
  const bool device_memory =
      !accelerator.call("device", [](v1::Accelerator& a) { return a.device(); }).is_cpu();
  auto memory_now = [&](bool peak) -> int64_t {
    if (!device_memory) return peak ? tracked_peak_bytes() : tracked_current_bytes();
    const v1::MemoryStats m =
        accelerator.call("memory_stats", [](v1::Accelerator& a) { return a.memory_stats(); });
    return peak ? m.peak_bytes : m.current_bytes;
  };
  // What the process holds before the model exists (libraries, dataset): mem_model_state_bytes
  // is measured from here.
  const int64_t mem_baseline = memory_now(false);
  auto model = build<v1::Model>(registry, job.model, ctx);
  const std::string init_weights = job.trainer.get_string("init_weights");
  if (!init_weights.empty()) {
    if (auto* d = dynamic_cast<v1::DeferredWeights*>(model.obj.get()))
      model.call("load_deferred_weights", [&](v1::Model&) { d->load_deferred_weights(); return 0; });
    load_initial_weights(*model.obj, init_weights, model.label);
  }
  auto precision = build<v1::Precision>(registry, job.precision, ctx);
  auto strategy = build<v1::Strategy>(registry, job.strategy, ctx);
  auto optimizer = build<v1::Optimizer>(registry, job.optimizer, ctx);
  std::vector<Slot<v1::Callback>> callbacks;
  for (const auto& c : job.callbacks) callbacks.push_back(build<v1::Callback>(registry, c, ctx));
  // Every run leaves metrics.jsonl, TensorBoard event files and report.html behind, listed or not. A listed
  // one replaces its default (so `plugin = "tensorboard"` with `enabled = false` turns it off).
  const std::pair<std::string, std::string> default_callbacks[] = {
      {"metrics", "metrics.jsonl"}, {"tensorboard", "TensorBoard event files"}, {"report", "report.html"}};
  for (const auto& [name, output] : default_callbacks) {
    const bool listed = std::any_of(job.callbacks.begin(), job.callbacks.end(),
                                    [&](const ComponentConfig& c) { return c.plugin == name; });
    if (listed) continue;
    if (const ComponentInfo* m = registry.find(v1::ComponentKind::Callback, name)) {
      std::map<std::string, v1::OptionValue> defaults;
      for (const auto& s : m->schema.specs()) defaults[s.name] = s.default_value;
      callbacks.push_back(Slot<v1::Callback>{
          registry.create<v1::Callback>(*m, v1::Options(defaults, "[[callbacks]] " + name + " (default)"), ctx),
          describe_component(*m)});
    } else {
      log_warn("no '" + name + "' callback plugin found: " + output + " will not be written");
    }
  }

  settle_deferred_weights(model, !init_weights.empty(), registry, job, precision, strategy);

  // Batch grew in ABI 1.6 (position_ids, segment_ids): batches of an older dataset are received
  // in their own layout; behind an older strategy (whose copies of a batch end before the new
  // fields) a model must not read them, and a batch that needs them is refused.
  const uint32_t data_abi = abi_minor_of(registry, job.data);
  const uint32_t strategy_abi = abi_minor_of(registry, job.strategy);
  auto* fields_reader = dynamic_cast<v1::BatchFieldsReader*>(model.obj.get());
  if (strategy_abi < 6)
    if (auto* reader = fields_reader)
      model.call("set_batch_fields_available", [&](v1::Model&) { reader->set_batch_fields_available(false); return 0; });
  auto get_batch = [&](v1::Split split, const std::vector<int64_t>& idx) {
    v1::Batch b = dataset.call("batch", [&](v1::Dataset& d) {
      return data_abi < 6 ? legacy_batch(d, split, idx) : d.batch(split, idx);
    });
    // A model that does not read the fields would let packed samples attend to each other.
    if (!fields_reader && (b.position_ids.defined() || b.segment_ids.defined()))
      throw ConfigError(dataset.label + " gives batches with position_ids/segment_ids (packing), which " +
                        model.label + " does not read (it is no BatchFieldsReader): turn packing off");
    if (strategy_abi < 6 && (b.position_ids.defined() || b.segment_ids.defined()))
      throw ConfigError(dataset.label + " gives batches with position_ids/segment_ids (packing), which " +
                        strategy.label + ", built against ABI 1." + std::to_string(strategy_abi) +
                        ", cannot pass on (ABI 1.6 added them): rebuild that plugin against this SDK");
    return b;
  };
  const int64_t train_samples = dataset.call("size", [](v1::Dataset& d) { return d.size(v1::Split::Train); });
  const int64_t eval_samples = dataset.call("size", [](v1::Dataset& d) { return d.size(v1::Split::Eval); });
  const v1::TrainPlan plan = make_plan(job.trainer, ctx.world_size, train_samples);

  precision.call("convert", [&](v1::Precision& p) { p.convert(*model.obj); return 0; });
  for (auto& cb : callbacks) cb.call("on_setup", [&](v1::Callback& c) { c.on_setup(*model.obj, ctx); return 0; });
  if (const std::string f = freeze_parameters(job.trainer, *model.obj); !f.empty() && lead)
    log_info("freeze: " + f);
  const int64_t n_params = model.call("count parameters", [](v1::Model& m) { return count_model_parameters(m); });
  // On the units as the callbacks left them, before a strategy hooks or shards them.
  const std::string checkpointed = install_activation_checkpointing(job.trainer, model);
  if (auto* shapes = dynamic_cast<v1::ParameterShapesAware*>(optimizer.obj.get())) {
    // Before the strategy shards anything: a sharded strategy hands the optimizer 1-D pieces.
    std::map<std::string, std::vector<int64_t>> by_name;
    for (const auto& p : model.call("named_parameters", [](v1::Model& m) { return m.named_parameters(); }))
      by_name[p.name] = p.tensor.sizes().vec();
    optimizer.call("set_parameter_shapes", [&](v1::Optimizer&) { shapes->set_parameter_shapes(by_name); return 0; });
  }
  if (auto* aware = dynamic_cast<v1::MemoryInputsAware*>(strategy.obj.get())) {
    const int64_t total = accelerator.call("memory_stats", [](v1::Accelerator& a) { return a.memory_stats(); }).total_bytes;
    const v1::MemoryInputs mi = memory_inputs(precision.obj.get(), optimizer.obj.get(), total,
                                              ctx.local_world_size, ctx.world_size);
    strategy.call("set_memory_inputs", [&](v1::Strategy&) { aware->set_memory_inputs(mi); return 0; });
  }
  strategy.call("setup", [&](v1::Strategy& s) { s.setup(*model.obj, *accelerator.obj, plan); return 0; });
  auto params = strategy.call("optimizer_parameters", [](v1::Strategy& s) { return s.optimizer_parameters(); });
  optimizer.call("init", [&](v1::Optimizer& o) { o.init(params, plan); return 0; });
  torch::manual_seed(rank_seed(ctx.seed, ctx.rank));
  int64_t skipped_steps_resumed = 0;
  std::vector<std::pair<std::string, v1::StepMetricsSource*>> metric_sources;
  if (auto* m = metrics_source(strategy)) metric_sources.push_back({strategy.label, m});
  if (auto* m = metrics_source(precision)) metric_sources.push_back({precision.label, m});
  if (auto* m = metrics_source(optimizer)) metric_sources.push_back({optimizer.label, m});

  // Checkpoints: the policy is a callback with the CheckpointPolicy capability (at most one);
  // the I/O is the core's (checkpoint.cpp), the pieces are the strategy's.
  v1::CheckpointPolicy* policy = nullptr;
  for (auto& cb : callbacks)
    if (auto* p = dynamic_cast<v1::CheckpointPolicy*>(cb.obj.get())) {
      if (policy != nullptr)
        throw ConfigError(job.file + ": two [[callbacks]] decide checkpoints (" + cb.label +
                          " and an earlier one); list one");
      policy = p;
    }
  const std::string ckpt_root = policy ? policy->checkpoint_settings().dir
                                       : (fs::path(ctx.run_dir) / "checkpoints").string();
  auto checkpointable = [&]() -> v1::CheckpointableStrategy& {
    auto* c = dynamic_cast<v1::CheckpointableStrategy*>(strategy.obj.get());
    if (c == nullptr)
      throw v1::NotSupportedError(strategy.label + " does not support checkpoints: it has no "
                                  "CheckpointableStrategy capability (ABI 1.4); drop the "
                                  "`checkpoint` callback and [trainer] resume, or use a "
                                  "strategy that has it");
    return *c;
  };
  // Components whose state travels beside the tensors (capability CheckpointState).
  auto state_holders = [&] {
    std::vector<std::pair<std::string, v1::CheckpointState*>> out;
    auto add = [&](const std::string& key, auto& slot) {
      if (auto* c = dynamic_cast<v1::CheckpointState*>(slot.obj.get())) out.push_back({key, c});
    };
    add("precision", precision);
    add("optimizer", optimizer);
    add("strategy", strategy);
    add("model", model);
    for (size_t i = 0; i < callbacks.size(); ++i) add("callbacks." + std::to_string(i), callbacks[i]);
    return out;
  };
  auto optimizer_pieces = [&] {
    auto& c = checkpointable();
    auto params = strategy.call("optimizer_parameter_pieces", [&](v1::Strategy&) { return c.optimizer_parameter_pieces(); });
    auto state = optimizer.call("state", [](v1::Optimizer& o) { return o.state(); });
    return optimizer_state_pieces(params, state);
  };
  int64_t start_step = 0;
  int64_t last_saved_step = -1;
  std::string resume = job.trainer.get_string("resume");
  // Before the first step, not at the first save: a job that cannot checkpoint says so at once.
  if (policy != nullptr || !resume.empty()) checkpointable();
  if (policy != nullptr) check_checkpoint_dir_writable(ckpt_root, ctx.rank);
  if (const char* restart = std::getenv("TRAINRUN_RESTART"); restart != nullptr && resume.empty()) {
    // An elastic restart ([launch] max_restarts): continue from the latest checkpoint if any.
    const bool any = fs::exists(fs::path(ckpt_root) / "latest");
    if (lead)
      log_info(std::string("restart ") + restart + ": " +
               (any ? "resuming from the latest checkpoint in " + ckpt_root
                    : "no checkpoint in " + ckpt_root + " yet, starting from step 0"));
    if (any) resume = "latest";
  }
  if (!resume.empty()) {
    const auto t0 = clock::now();
    const std::string path = resolve_checkpoint(resume, ckpt_root, lead);
    nlohmann::json meta;
    try {
      meta = verify_checkpoint(path);
    } catch (const CheckpointError& e) {
      // A damaged checkpoint is bad input (exit 2), and there may be an intact older one.
      throw v1::ConfigError(std::string("[trainer] resume = \"") + resume + "\": " + e.what() +
                            (resume == "latest-valid"
                                 ? std::string()
                                 : "; resume = \"latest-valid\" falls back to the newest checkpoint that verifies"));
    }
    check_resume(meta, job, path, ctx.seed, job.trainer.get_string("resume").empty(), lead);
    auto& c = checkpointable();
    auto model_pieces = strategy.call("model_checkpoint_pieces", [&](v1::Strategy&) { return c.model_checkpoint_pieces(); });
    load_checkpoint_pieces(path, meta, "model", model_pieces);
    auto opt_pieces = optimizer_pieces();
    load_checkpoint_pieces(path, meta, "optimizer", opt_pieces);
    strategy.call("after_checkpoint_load", [&](v1::Strategy&) { c.after_checkpoint_load(); return 0; });
    const auto& states = meta.at("component_state");
    for (auto& [key, holder] : state_holders()) {
      if (!states.contains(key)) {
        if (lead) log_warn("checkpoint " + path + " holds no state for the " + key + "; it starts fresh");
        continue;
      }
      holder->load_checkpoint_state(states.at(key).get<std::map<std::string, double>>());
    }
    // last_saved_step stays -1: a resumed run writes its own end checkpoint even at the step it
    // loaded (into its own checkpoint directory, which is how a checkpoint is converted to
    // another layout).
    start_step = meta.at("step").get<int64_t>();
    skipped_steps_resumed = meta.at("trainer_state").value("skipped_steps", int64_t{0});
    const bool rng = restore_rng_state(meta, ctx.rank, ctx.world_size);
    if (lead) {
      const int saved_world = meta.at("world_size").get<int>();
      log_info("resumed from " + path + " at step " + std::to_string(start_step) + " (written by " +
               meta.at("job").value("strategy", std::string("?")) + " at world size " +
               std::to_string(saved_world) + ") in " +
               std::to_string(std::chrono::duration<double>(clock::now() - t0).count()) + " s");
      if (!rng)
        log_info("the checkpoint's RNG states are per rank of world size " + std::to_string(saved_world) +
                 "; this run's ranks keep their seeded streams");
      if (meta.at("global_batch_size").get<int64_t>() != plan.global_batch_size)
        log_warn("checkpoint global_batch_size " + meta.at("global_batch_size").dump() +
                 " differs from this run's " + std::to_string(plan.global_batch_size) +
                 ": the data order continues from step " + std::to_string(start_step) + " of the new layout");
      if (meta.at("total_steps").get<int64_t>() != plan.total_steps)
        log_warn("checkpoint total_steps " + meta.at("total_steps").dump() + " differs from this run's " +
                 std::to_string(plan.total_steps) + ": a step-dependent LR schedule changes");
    }
    TR_CHECK_TYPED(ConfigError, start_step <= plan.total_steps, "[trainer] resume: the checkpoint is at step ",
                   start_step, ", past this run's ", plan.total_steps, " steps");
  }

  DistributedSampler::Options sampler_options;
  sampler_options.num_samples = train_samples;
  sampler_options.global_batch_size = plan.global_batch_size;
  sampler_options.world_size = ctx.world_size;
  sampler_options.rank = ctx.rank;
  sampler_options.seed = ctx.seed;
  sampler_options.drop_last = job.trainer.get_bool("drop_last");
  DistributedSampler sampler(sampler_options);

  const size_t n_units = model.call("units", [](v1::Model& m) { return m.units().size(); });
  if (lead) {
    std::cout << "trainrun " << TRAINRUN_VERSION << " | LibTorch " << TRAINRUN_BUILD_TORCH_VERSION
              << " | run_dir " << ctx.run_dir << "\n"
              << "  model       "
              << model.call("describe", [](v1::Model& m) { return m.describe(); }) << ", "
              << n_params << " parameters, " << (n_units ? n_units : 1) << " unit(s)\n"
              << "  data        " << job.data.plugin << ": " << train_samples << " train / "
              << eval_samples << " eval samples\n"
              << "  accelerator " << job.accelerator.plugin << ": "
              << accelerator.call("describe", [](v1::Accelerator& a) { return a.describe(); }) << "\n"
              << "  strategy " << job.strategy.plugin << " | precision " << job.precision.plugin
              << " | optimizer " << job.optimizer.plugin
              << (checkpointed.empty() ? "" : " | activation checkpointing " + checkpointed)
              << "\n";
    for (size_t i = 0; i < runtime_lines.size(); ++i)
      std::cout << (i ? "              " : "  runtime     ") << runtime_lines[i] << "\n";
    std::cout
              << "  batch: global " << plan.global_batch_size << " = micro "
              << plan.micro_batch_size << " x accumulation " << plan.accumulation_steps
              << " x world " << ctx.world_size << " | " << plan.total_steps << " steps ("
              << plan.steps_per_epoch << " per epoch";
    if (sampler.dropped_per_epoch())
      std::cout << ", last " << sampler.dropped_per_epoch() << " samples of each epoch skipped (drop_last)";
    if (sampler.padded_per_epoch())
      std::cout << ", " << sampler.padded_per_epoch() << " samples repeated to fill the last batch";
    std::cout << ")" << std::endl;
  }
  for (auto& cb : callbacks) cb.call("on_train_start", [&](v1::Callback& c) { c.on_train_start(plan); return 0; });

  g_stop_signal.store(0);
  open_control_channel();
  auto prev_int = std::signal(SIGINT, on_stop_signal);
  auto prev_term = std::signal(SIGTERM, on_stop_signal);

  v1::Communicator& comm = *accelerator.call(
      "communicator", [](v1::Accelerator& a) { return &a.communicator(); });
  // Sums of a few float64 figures over all ranks (counts and metrics), asynchronously so the
  // caller can overlap it with work; a world of one skips the communicator.
  auto sum_over_ranks = [&](torch::Tensor& t, const char* what) -> std::shared_ptr<v1::Work> {
    if (ctx.world_size == 1) return std::make_shared<v1::CompletedWork>();
    return accelerator.call(what, [&](v1::Accelerator&) { return comm.all_reduce(t); });
  };
  auto wait = [&](const std::shared_ptr<v1::Work>& w, const char* what) {
    accelerator.call(what, [&](v1::Accelerator&) { w->wait(); return 0; });
  };
  int64_t skipped_steps = skipped_steps_resumed;
  auto save_checkpoint_now = [&](int64_t done, const char* reason) {
    const auto t0 = clock::now();
    auto& c = checkpointable();
    control_message("saving " + std::to_string(done));
    // Test hook for the launcher's stop protocol: a save that takes this many seconds longer.
    if (const char* d = std::getenv("TRAINRUN_TEST_SAVE_DELAY_S"))
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(d)));
    CheckpointSaveRequest req;
    req.root = ckpt_root;
    req.step = done;
    req.steps_per_epoch = plan.steps_per_epoch;
    req.global_batch_size = plan.global_batch_size;
    req.total_steps = plan.total_steps;
    req.rank = ctx.rank;
    req.world_size = ctx.world_size;
    req.keep_last = policy ? policy->checkpoint_settings().keep_last : 0;
    req.reason = reason;
    nlohmann::json plugins = nlohmann::json::array();
    auto add_plugin = [&](const char* role, const ComponentConfig& cc) {
      plugins.push_back({{"role", role}, {"component", cc.plugin},
                         {"plugin", cc.info ? cc.info->plugin_name : ""},
                         {"version", cc.info ? cc.info->plugin_version : ""}});
    };
    add_plugin("model", job.model);
    add_plugin("data", job.data);
    add_plugin("strategy", job.strategy);
    add_plugin("accelerator", job.accelerator);
    add_plugin("precision", job.precision);
    add_plugin("optimizer", job.optimizer);
    for (const auto& cb : job.callbacks) add_plugin("callback", cb);
    req.job = {{"file", job.file}, {"strategy", job.strategy.plugin}, {"plugins", plugins},
               {"toml", job.resolved_toml}};
    req.trainer_state = {{"skipped_steps", skipped_steps}, {"seed", ctx.seed}};
    for (auto& [key, holder] : state_holders()) req.component_state[key] = holder->checkpoint_state();
    req.model = strategy.call("model_checkpoint_pieces", [&](v1::Strategy&) { return c.model_checkpoint_pieces(); });
    req.optimizer = optimizer_pieces();
    const std::string path = save_checkpoint(req, ctx.world_size > 1 ? &comm : nullptr);
    last_saved_step = done;
    control_message("saved " + std::to_string(done));
    if (policy) policy->on_checkpoint_saved(done, path);
    if (lead)
      log_info("checkpoint " + path + " (step " + std::to_string(done) + ", " + reason + ") written in " +
               std::to_string(std::chrono::duration<double>(clock::now() - t0).count()) + " s");
  };
  const int64_t stop_after = job.trainer.get_int("stop_after_steps");
  bool stopped_early = false;
  const double max_skipped_fraction = job.trainer.get_double("max_skipped_fraction");
  DivergenceWatch watch;
  bool diverged = false;
  // Collective: every rank calls it at the same point (decided from agreed figures).
  auto weights_finite_everywhere = [&] {
    torch::Tensor bad = torch::tensor({all_finite(params) ? 0.0 : 1.0}, torch::kDouble);
    wait(sum_over_ranks(bad, "all_reduce (weights finite)"), "wait (weights finite)");
    return bad.item<double>() == 0;
  };
  const double clip = job.trainer.get_double("gradient_clip_val");
  const bool clip_by_value = job.trainer.get_string("gradient_clip_algorithm") == "value";
  const int64_t log_every = job.trainer.get_int("log_every");
  const int64_t eval_every = job.trainer.get_int("eval_every");
  const int64_t eval_max_batches = job.trainer.get_int("eval_max_batches");
  const int64_t eval_bs = job.trainer.get_int("eval_batch_size") > 0
                              ? job.trainer.get_int("eval_batch_size")
                              : plan.micro_batch_size;

  auto evaluate = [&](int64_t step) {
    const auto t0 = clock::now();
    v1::EvalMetrics em;
    em.step = step;
    em.rank = ctx.rank;
    // [loss_sum, correct, samples, targets, has_accuracy], summed over ranks at the end.
    double totals[5] = {0, 0, 0, 0, 0};
    const EvalShard shard = eval_shard(eval_samples, eval_max_batches * eval_bs * ctx.world_size,
                                       eval_bs, ctx.world_size, ctx.rank);
    model.call("train", [](v1::Model& m) { m.train(false); return 0; });
    {
      torch::NoGradGuard no_grad;
      for (int64_t b = 0; b < shard.batches; ++b) {
        std::vector<int64_t> idx = shard.batch(b);
        // Every rank runs the same number of forwards (a sharded strategy's forward is a
        // collective); a rank whose share ran out evaluates sample 0 and discards the result.
        const bool filler = idx.empty();
        if (filler) idx = {0};
        v1::Batch batch = get_batch(v1::Split::Eval, idx);
        auto scope = precision.call("autocast", [](v1::Precision& p) { return p.autocast(); });
        v1::ModelOutput out = strategy.call("forward", [&](v1::Strategy& s) { return s.forward(batch); });
        scope.reset();
        if (filler) continue;
        totals[0] += out.loss_sum.item<double>();
        totals[2] += static_cast<double>(batch.num_samples);
        totals[3] += static_cast<double>(batch.num_targets);
        if (out.num_correct >= 0) totals[1] += static_cast<double>(out.num_correct), totals[4] = 1;
      }
    }
    torch::Tensor t = torch::from_blob(totals, {5}, torch::kDouble).clone();
    wait(sum_over_ranks(t, "all_reduce (evaluation metrics)"), "wait (evaluation metrics)");
    const double* r = t.data_ptr<double>();
    const double loss_sum = r[0];
    const int64_t correct = static_cast<int64_t>(std::llround(r[1]));
    em.samples = static_cast<int64_t>(std::llround(r[2]));
    em.targets = static_cast<int64_t>(std::llround(r[3]));
    const bool has_acc = r[4] > 0;
    model.call("train", [](v1::Model& m) { m.train(true); return 0; });
    em.loss = em.targets ? loss_sum / static_cast<double>(em.targets) : 0;
    em.accuracy = has_acc && em.targets ? static_cast<double>(correct) / em.targets : -1;
    em.time_s = std::chrono::duration<double>(clock::now() - t0).count();
    for (auto& cb : callbacks) cb.call("on_eval_end", [&](v1::Callback& c) { c.on_eval_end(em); return 0; });
    if (lead) {
      std::cout << "[eval step " << step << "] loss " << std::fixed << std::setprecision(4) << em.loss;
      if (em.accuracy >= 0) std::cout << " | accuracy " << std::setprecision(2) << 100 * em.accuracy << "%";
      std::cout << std::defaultfloat << " | " << em.samples << " samples | " << std::setprecision(3)
                << em.time_s << " s" << std::defaultfloat << std::setprecision(6) << std::endl;
    }
    return em;
  };

  model.call("train", [](v1::Model& m) { m.train(true); return 0; });
  // One step's micro-batches and this rank's [targets, tokens, samples] in them.
  struct StepBatches {
    std::vector<v1::Batch> micro;
    double local[3] = {0, 0, 0};
  };
  auto load_step = [&](int64_t s) {
    StepBatches sb;
    const std::vector<int64_t> mine = sampler.rank_batch(s / plan.steps_per_epoch, s % plan.steps_per_epoch);
    for (int64_t k = 0; k < plan.accumulation_steps; ++k) {
      std::vector<int64_t> idx(mine.begin() + k * plan.micro_batch_size,
                               mine.begin() + (k + 1) * plan.micro_batch_size);
      sb.micro.push_back(get_batch(v1::Split::Train, idx));
      sb.local[0] += static_cast<double>(sb.micro.back().num_targets);
      sb.local[1] += static_cast<double>(sb.micro.back().num_tokens);
      sb.local[2] += static_cast<double>(sb.micro.back().num_samples);
    }
    return sb;
  };
  StepBatches cur, next;
  bool next_counts_known = false;
  torch::Tensor next_counts;
  v1::EvalMetrics last_eval;
  int64_t step = start_step;
  double samples_done = 0, tokens_done = 0;
  const auto t_loop = clock::now();
  // Test hook for elastic restarts: TRAINRUN_TEST_SIGKILL_AT_STEP=N (1-based) makes rank
  // TRAINRUN_TEST_SIGKILL_RANK (default 0) kill itself with SIGKILL as step N starts, in the
  // first attempt only (not after a [launch] max_restarts restart).
  const char* kill_at_env = std::getenv("TRAINRUN_TEST_SIGKILL_AT_STEP");
  const int64_t kill_at = kill_at_env && !std::getenv("TRAINRUN_RESTART") ? std::atoll(kill_at_env) : -1;
  const char* kill_rank_env = std::getenv("TRAINRUN_TEST_SIGKILL_RANK");
  const int kill_rank = kill_rank_env ? std::atoi(kill_rank_env) : 0;
  // A run resumed at or past stop_after_steps has nothing to do (the check below runs at the end
  // of a step, which would be one step too late).
  if (stop_after > 0 && step >= stop_after && step < plan.total_steps) stopped_early = true;
  for (; step < plan.total_steps && !stopped_early; ++step) {
    if (step + 1 == kill_at && ctx.rank == kill_rank) {
      std::cerr << "test hook: rank " << ctx.rank << " SIGKILLs itself at step " << kill_at << std::endl;
      ::kill(::getpid(), SIGKILL);
    }
    const auto t0 = clock::now();
    reset_tracked_peak();
    const int64_t epoch = step / plan.steps_per_epoch;
    // The loss is normalised by the targets of the whole global batch, which only the ranks
    // together know. The step's counts normally arrived with the previous step's loss (one
    // all-reduce per step); the first step, or one after an interruption of that chain, sums
    // them on its own while the first micro-batch's forward runs.
    std::shared_ptr<v1::Work> counts_work;
    torch::Tensor counts;
    if (!next_counts_known) {
      cur = load_step(step);
      counts = torch::from_blob(cur.local, {3}, torch::kDouble).clone();
      counts_work = sum_over_ranks(counts, "all_reduce (global batch size)");
    } else {
      cur = std::move(next);
      counts = next_counts;
    }
    std::vector<v1::Batch>& micro = cur.micro;
    double global_targets = 0;
    double loss_sum = 0;
    for (int64_t k = 0; k < plan.accumulation_steps; ++k) {
      const bool last = k + 1 == plan.accumulation_steps;
      strategy.call("before_backward", [&](v1::Strategy& s) { s.before_backward(last); return 0; });
      auto scope = precision.call("autocast", [](v1::Precision& p) { return p.autocast(); });
      v1::ModelOutput out = strategy.call("forward", [&](v1::Strategy& s) { return s.forward(micro[k]); });
      scope.reset();
      TR_CHECK(out.loss_sum.defined() && out.loss_sum.numel() == 1,
               model.label, " returned no scalar loss_sum");
      if (k == 0) {
        if (counts_work) wait(counts_work, "wait (global batch size)");
        global_targets = counts.data_ptr<double>()[0];
        TR_CHECK(global_targets > 0, "step ", step + 1, ": the global batch has no targets");
      }
      // x world_size: data-parallel strategies average gradients over ranks, and the average of
      // the ranks' (loss_sum_r x W / targets) is the mean loss over the global batch.
      torch::Tensor loss = out.loss_sum.to(torch::kFloat) * (static_cast<double>(ctx.world_size) / global_targets);
      torch::Tensor scaled = precision.call("scale_loss", [&](v1::Precision& p) { return p.scale_loss(loss); });
      guarded(model.label, "backward", [&] { scaled.backward(); return 0; });
      loss_sum += out.loss_sum.item<double>();
    }
    strategy.call("finish_gradient_sync", [](v1::Strategy& s) { s.finish_gradient_sync(); return 0; });
    // [loss sum of this step, next step's targets, tokens, samples]: one all-reduce, issued
    // after the strategy's own collectives so that every rank issues them in the same order,
    // and waited for at the end of the step.
    const bool prefetch = step + 1 < plan.total_steps;
    if (prefetch) next = load_step(step + 1);
    // Two more figures ride along so that the ranks agree without another collective: whether
    // rank 0's checkpoint policy saves after this step, and whether any rank got SIGTERM/SIGINT.
    const double elapsed_loop = std::chrono::duration<double>(clock::now() - t_loop).count();
    const bool want_save = lead && policy != nullptr &&
                           policy->should_save(step + 1, elapsed_loop, v1::CheckpointReason::Step);
    torch::Tensor tail = torch::tensor({loss_sum, prefetch ? next.local[0] : 0.0,
                                        prefetch ? next.local[1] : 0.0, prefetch ? next.local[2] : 0.0,
                                        want_save ? 1.0 : 0.0, g_stop_signal.load() ? 1.0 : 0.0},
                                       torch::kDouble);
    auto tail_work = sum_over_ranks(tail, "all_reduce (step loss, next batch size)");
    std::vector<torch::Tensor> grads;
    for (auto& p : params)
      if (p.tensor.grad().defined()) grads.push_back(p.tensor.grad());
    const bool finite = precision.call("unscale_and_check", [&](v1::Precision& p) {
      return p.unscale_and_check(grads, comm);
    });
    double grad_norm = std::numeric_limits<double>::quiet_NaN();
    if (finite) {
      grad_norm = strategy.call("grad_norm", [](v1::Strategy& s) { return s.grad_norm(); });
      // The gradients are unscaled by now (unscale_and_check), so clip_val is in the units of
      // the true gradient; grad_norm is logged as it was before clipping (as Lightning does).
      if (clip > 0 && clip_by_value) {
        torch::NoGradGuard ng;
        for (auto& g : grads) g.clamp_(-clip, clip);
      } else if (clip > 0 && grad_norm > clip) {
        torch::NoGradGuard ng;
        const double factor = clip / (grad_norm + 1e-6);
        for (auto& g : grads) g.mul_(factor);
      }
      optimizer.call("step", [&](v1::Optimizer& o) { o.step(step); return 0; });
      strategy.call("after_optimizer_step", [](v1::Strategy& s) { s.after_optimizer_step(); return 0; });
    }
    // Parameters, gradients and optimizer state at rest (what ZeRO's formulas predict): the
    // gradients are still alive until zero_grad; the step's batches are included (small).
    const int64_t mem_model_state = memory_now(false);
    // The step's loss (all-reduced) tells a non-finite loss from overflowing gradients.
    wait(tail_work, "wait (step loss)");
    const bool loss_finite = std::isfinite(tail.data_ptr<double>()[0]);
    if (!finite) {
      ++skipped_steps;
      if (lead) {
        const double used = precision.call("loss_scale", [](v1::Precision& p) { return p.loss_scale(); });
        log_warn("step " + std::to_string(step + 1) + ": " +
                 (loss_finite ? "non-finite gradients" : "non-finite loss (" + std::to_string(tail.data_ptr<double>()[0] / global_targets) + ")") +
                 ", step skipped" +
                 (used != 1.0 ? " (loss scale " + fmt_scale(used) + (loss_finite ? "" : ", kept") + ")" : std::string()));
      }
    }
    // A non-finite loss is not an fp16 overflow of the gradients: a smaller scale cannot help,
    // so the scaler does not count the step at all.
    if (finite || loss_finite) precision.call("update", [&](v1::Precision& p) { p.update(!finite); return 0; });
    strategy.call("zero_grad", [](v1::Strategy& s) { s.zero_grad(); return 0; });
    watch.record(step + 1, loss_finite, finite);
    if (!loss_finite && !weights_finite_everywhere()) {
      watch.weights_bad_after = step;
      diverged = true;
    }

    next_counts_known = prefetch;
    if (prefetch) next_counts = tail.slice(0, 1, 4).clone();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    samples_done += counts.data_ptr<double>()[2];
    tokens_done += counts.data_ptr<double>()[1];
    v1::StepMetrics m;
    m.step = step + 1;
    m.epoch = epoch;
    m.rank = ctx.rank;
    m.loss = tail.data_ptr<double>()[0] / global_targets;
    m.lr = optimizer.call("lr", [&](v1::Optimizer& o) { return o.lr(step); });
    m.grad_norm = grad_norm;
    m.step_time_s = dt;
    m.elapsed_s = std::chrono::duration<double>(clock::now() - t_start).count();
    const double loop_s = std::chrono::duration<double>(clock::now() - t_loop).count();
    m.samples_per_s = samples_done / loop_s;
    m.tokens_per_s = tokens_done / loop_s;
    m.total_steps = plan.total_steps;
    const double scale = precision.call("loss_scale", [](v1::Precision& p) { return p.loss_scale(); });
    if (scale != 1.0) m.extra["loss_scale"] = scale;
    if (!finite) m.extra["skipped"] = 1;
    if (skipped_steps > 0) m.extra["skipped_steps"] = static_cast<double>(skipped_steps);
    if (mem_baseline >= 0) {
      m.extra["mem_peak_bytes"] = static_cast<double>(memory_now(true));
      m.extra["mem_current_bytes"] = static_cast<double>(memory_now(false));
      m.extra["mem_model_state_bytes"] = static_cast<double>(mem_model_state - mem_baseline);
    }
    for (auto& [label, source] : metric_sources)
      guarded(label, "add_step_metrics", [&] { source->add_step_metrics(m.extra); return 0; });
    for (auto& cb : callbacks) cb.call("on_step_end", [&](v1::Callback& c) { c.on_step_end(m); return 0; });
    if (lead && ((step + 1) % log_every == 0 || step + 1 == plan.total_steps)) {
      const double eta = loop_s / (step + 1) * (plan.total_steps - step - 1);
      std::cout << "[step " << step + 1 << "/" << plan.total_steps << "] epoch " << epoch
                << " | loss " << std::fixed << std::setprecision(4) << m.loss << std::defaultfloat
                << " | lr " << std::scientific << std::setprecision(3) << m.lr << std::defaultfloat
                << " | grad_norm " << std::setprecision(4) << grad_norm << " | "
                << std::setprecision(0) << std::fixed << m.samples_per_s << " samples/s";
      if (m.tokens_per_s > 0) std::cout << " | " << m.tokens_per_s << " tokens/s";
      if (scale != 1.0) std::cout << " | loss scale " << fmt_scale(scale);
      std::cout << std::defaultfloat << std::setprecision(6) << " | eta " << fmt_duration(eta)
                << std::endl;
    }
    if (eval_every > 0 && (step + 1) % eval_every == 0 && step + 1 < plan.total_steps) {
      last_eval = evaluate(step + 1);
    }
    // A signal is acted on at the end of a step, by every rank at the same step: the agreed
    // flag, or (one rank) the flag itself.
    const bool signalled = ctx.world_size > 1 ? tail.data_ptr<double>()[5] > 0 : g_stop_signal.load() != 0;
    const bool stop_here = stop_after > 0 && step + 1 >= stop_after && step + 1 < plan.total_steps;
    bool save = tail.data_ptr<double>()[4] > 0;
    if (signalled && policy != nullptr)
      save = save || policy->should_save(step + 1, elapsed_loop, v1::CheckpointReason::Signal);
    if (stop_here && policy != nullptr) save = true;
    if (save) save_checkpoint_now(step + 1, signalled ? "signal" : stop_here ? "stop_after_steps" : "step");
    if (diverged) {
      ++step;
      break;
    }
    if (signalled || stop_here) {
      if (!signalled) stopped_early = true;
      else g_stop_signal.store(g_stop_signal.load() ? g_stop_signal.load() : SIGTERM);
      ++step;
      break;
    }
  }
  const int stop_sig = g_stop_signal.load();
  std::signal(SIGINT, prev_int);
  std::signal(SIGTERM, prev_term);
  if (!diverged && !weights_finite_everywhere()) watch.weights_bad_after = step;
  diverged = diverged || watch.weights_bad_after >= 0 || watch.too_many_skipped(max_skipped_fraction);

  // state_dict_type = "sharded": every rank writes its own pieces, nothing is gathered. Each
  // file's metadata maps a tensor to its whole shape and the offset of its piece, so the files of
  // all ranks rebuild the model under any layout.
  auto save_sharded_model = [&]() -> bool {
    auto* source = dynamic_cast<v1::ShardedStateDictSource*>(strategy.obj.get());
    if (source == nullptr) {
      if (lead)
        log_warn("[trainer] state_dict_type = \"sharded\": strategy '" + job.strategy.plugin +
                 "' has no sharded state dict; writing the full one");
      return false;
    }
    auto pieces = strategy.call("sharded_state_dict", [&](v1::Strategy&) { return source->sharded_state_dict(); });
    nlohmann::json index = nlohmann::json::object();
    std::vector<v1::NamedTensor> tensors;
    for (auto& p : pieces) {
      index[p.name] = {{"shape", p.shape}, {"offset", p.offset}};
      tensors.push_back({p.name, p.data.contiguous()});
    }
    const fs::path dir = fs::path(ctx.run_dir) / "model-shards";
    fs::create_directories(dir);
    const std::string path = (dir / ("rank-" + std::to_string(ctx.rank) + "-of-" +
                                     std::to_string(ctx.world_size) + ".safetensors")).string();
    write_safetensors(path, tensors, {{"format", "pt"}, {"trainrun_step", std::to_string(step)},
                                      {"trainrun_strategy", job.strategy.plugin},
                                      {"trainrun_rank", std::to_string(ctx.rank)},
                                      {"trainrun_world_size", std::to_string(ctx.world_size)},
                                      {"trainrun_pieces", index.dump()}});
    if (lead) log_info("wrote " + dir.string() + "/rank-*-of-" + std::to_string(ctx.world_size) + ".safetensors");
    return true;
  };
  // Callbacks that want the gathered final state (capability v1::FinalStateDictConsumer).
  std::vector<std::pair<Slot<v1::Callback>*, v1::FinalStateDictConsumer*>> state_consumers;
  for (auto& cb : callbacks)
    if (auto* c = dynamic_cast<v1::FinalStateDictConsumer*>(cb.obj.get())) state_consumers.push_back({&cb, c});
  // A model may want it too (ABI 1.5: llama writes <run_dir>/hf/ from it).
  auto* model_consumer = dynamic_cast<v1::FinalStateDictConsumer*>(model.obj.get());
  std::vector<v1::NamedTensor> final_state;
  bool have_final_state = false;
  // Every rank asks (a sharded strategy gathers, which is a collective); rank 0 uses it.
  auto gather_final_state = [&](bool quiet) {
    if (have_final_state) return true;
    try {
      final_state = strategy.call("full_state_dict", [](v1::Strategy& s) { return s.full_state_dict(); });
    } catch (const v1::NotSupportedError& e) {
      if (lead && !quiet) log_warn(std::string("model.safetensors not written: ") + e.what());
      return false;
    }
    have_final_state = true;
    return true;
  };
  auto save_final_model = [&] {
    if (job.trainer.get_string("state_dict_type") == "sharded" && save_sharded_model()) return;
    if (!gather_final_state(false)) return;
    const std::vector<v1::NamedTensor>& state = final_state;
    if (!lead) return;
    const std::string path = (fs::path(ctx.run_dir) / "model.safetensors").string();
    write_safetensors(path, state, {{"format", "pt"}, {"trainrun_step", std::to_string(step)},
                                    {"trainrun_strategy", job.strategy.plugin}});
    log_info("wrote " + path);
  };
  v1::TrainSummary summary;
  summary.steps = step;
  summary.interrupted = stop_sig != 0 || stopped_early || diverged;
  if (!summary.interrupted && policy != nullptr && last_saved_step != step &&
      policy->should_save(step, std::chrono::duration<double>(clock::now() - t_loop).count(),
                          v1::CheckpointReason::End))
    save_checkpoint_now(step, "end");
  if (!summary.interrupted) {
    last_eval = evaluate(step);
    if (job.trainer.get_bool("save_final_model")) save_final_model();
    if ((!state_consumers.empty() || model_consumer) && gather_final_state(true) && lead) {
      if (model_consumer)
        model.call("on_final_state_dict", [&](v1::Model&) {
          model_consumer->on_final_state_dict(final_state);
          return 0;
        });
      for (auto& [slot, consumer] : state_consumers)
        slot->call("on_final_state_dict", [&, c = consumer](v1::Callback&) {
          c->on_final_state_dict(final_state);
          return 0;
        });
    }
    final_state.clear();
  }
  summary.elapsed_s = std::chrono::duration<double>(clock::now() - t_start).count();
  for (auto& cb : callbacks) cb.call("on_train_end", [&](v1::Callback& c) { c.on_train_end(summary); return 0; });

  if (diverged) {
    if (lead) {
      std::cout << std::flush;
      std::cerr << "trainrun: error: " << watch.diagnosis(max_skipped_fraction, start_step)
                << "; no final evaluation, no model written" << std::endl;
    }
    return kDivergedExit;
  }
  if (lead) {
    const double loop_s = std::chrono::duration<double>(clock::now() - t_loop).count();
    if (stopped_early && stop_sig == 0) {
      std::cout << "stopped after " << step << " of " << plan.total_steps
                << " steps ([trainer] stop_after_steps); no final evaluation" << std::endl;
      return 0;
    }
    if (summary.interrupted) {
      std::cout << "interrupted by signal " << stop_sig << " after " << step << " of "
                << plan.total_steps << " steps (" << std::fixed << std::setprecision(1)
                << summary.elapsed_s << " s); no final evaluation" << std::endl;
      return 130;
    }
    std::cout << "final eval: loss " << std::fixed << std::setprecision(4) << last_eval.loss;
    if (last_eval.accuracy >= 0)
      std::cout << ", accuracy " << std::setprecision(2) << 100 * last_eval.accuracy << "%";
    std::cout << " on " << last_eval.samples << " held-out samples after " << step << " steps, "
              << std::setprecision(1) << summary.elapsed_s << " s, " << std::setprecision(0)
              << samples_done / loop_s << " samples/s";
    if (tokens_done > 0) std::cout << ", " << tokens_done / loop_s << " tokens/s";
    std::cout << std::endl;
  }
  return stop_sig != 0 ? 130 : 0;
}

}  // namespace trainrun::core
