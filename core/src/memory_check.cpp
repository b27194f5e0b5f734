// MemoryInputs for strategies, and the ZeRO memory table of `trainrun check`.
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <functional>
#include <map>
#include <iomanip>
#include <sstream>

#include <trainrun/model/activation_memory.hpp>
#include <trainrun/model/expert_parallel.hpp>
#include <trainrun/precision/weight_storage.hpp>
#include <trainrun/runtime/memory.hpp>
#include <trainrun/strategy/memory_estimate.hpp>

#include "run/objective_task.hpp"
#include "run/setup.hpp"
#include "trainrun/core/memory.hpp"
#include "trainrun/core/run_dir.hpp"

namespace trainrun::core {

v1::MemoryInputs memory_inputs(const v1::Precision* precision, const v1::Optimizer* optimizer,
                               int64_t accelerator_total_bytes, int local_world_size,
                               int world_size) {
  v1::MemoryInputs mi;
  if (const auto* pb = dynamic_cast<const v1::PrecisionBytes*>(precision)) {
    mi.param_bytes = pb->param_bytes();
    mi.grad_bytes = pb->grad_bytes();
    mi.master_bytes = pb->master_bytes();
  }
  if (const auto* ob = dynamic_cast<const v1::OptimizerStateBytes*>(optimizer))
    mi.optimizer_bytes = ob->state_bytes_per_param();
  mi.local_world_size = std::max(1, local_world_size);
  mi.nnodes = std::max(1, world_size / mi.local_world_size);
  mi.memory_budget_bytes =
      accelerator_total_bytes > 0 ? accelerator_total_bytes / mi.local_world_size : -1;
  return mi;
}

namespace {

// Psi: trainable parameters, a tied tensor once. The largest unit bounds what stage 3 gathers
// at once; parameters outside every unit form one more group (the whole model without units).
// Frozen weights are held at their stored size (`stored`: a quantized base's bytes by parameter
// name, else `param_bytes` each); those outside every unit or shared by several stay whole on
// every rank at stage 3, as the sharded engine keeps them.
struct TrainableParameters {
  int64_t psi = 0, frozen = 0, largest_unit = 0;
  double frozen_bytes = 0, whole_frozen_bytes = 0;
  int64_t whole_frozen = 0;
  size_t units = 0;
  std::vector<at::Tensor> tensors;  ///< every parameter once, trained or frozen
};

// `skip`: parameters (whole-model names) the strategy will not see, left out of the units too
// (the experts under [parallel] ep).
TrainableParameters count_trainable(v1::Model& model, const std::string& label, double param_bytes,
                                    const std::map<std::string, int64_t>& stored,
                                    const std::function<bool(const std::string&)>& skip = {}) {
  TrainableParameters c;
  const auto units = guarded(label, "units", [&] { return model.units(); });
  const std::map<const void*, int> owner = v1::unit_of_each_parameter(units);
  for (const auto& p : guarded(label, "named_parameters", [&] { return model.named_parameters(); })) {
    const bool seen = std::any_of(c.tensors.begin(), c.tensors.end(),
                                  [&](const at::Tensor& t) { return t.is_same(p.tensor); });
    if (seen) continue;
    c.tensors.push_back(p.tensor);
    if (skip && skip(p.name)) continue;
    if (p.tensor.requires_grad()) {
      c.psi += p.tensor.numel();
      continue;
    }
    const auto planned = stored.find(p.name);
    const double bytes = planned != stored.end()
                             ? static_cast<double>(planned->second)
                             : param_bytes * static_cast<double>(p.tensor.numel());
    const auto it = owner.find(p.tensor.unsafeGetTensorImpl());
    if (it == owner.end() || it->second < 0) {
      c.whole_frozen += p.tensor.numel();
      c.whole_frozen_bytes += bytes;
    } else {
      c.frozen += p.tensor.numel();
      c.frozen_bytes += bytes;
    }
  }
  // Frozen weights are gathered with their unit at stage 3 like the trained ones.
  int64_t in_units = 0;
  for (v1::Unit* u : units) {
    int64_t n = 0;
    for (const auto& t : u->module().named_parameters())
      if (!skip || !skip(u->name() + "." + t.key())) n += t.value().numel();
    in_units += n;
    c.largest_unit = std::max(c.largest_unit, n);
  }
  // Parameters outside every unit form one more group, unless they are frozen (kept whole).
  const int64_t all = c.psi + c.frozen;
  c.largest_unit = std::max(c.largest_unit, all - std::min(all, in_units));
  c.units = units.size();
  return c;
}

// The zero strategy's own sizes when the job uses it (its option names follow DeepSpeed's):
// sets them in `in` and returns the line that says which were used.
std::string strategy_sizes(const ComponentConfig& strategy, const std::vector<at::Tensor>& weights,
                           v1::memory::ZeroEstimateInputs& in) {
  const v1::Options& so = strategy.options;
  auto opt_int = [&](const char* key) -> int64_t {
    if (!so.has(key)) return -1;
    const auto& v = so.values().at(key);
    return std::holds_alternative<int64_t>(v) ? std::get<int64_t>(v) : -1;
  };
  std::string sizes = "buffers: stage 3's gathered largest unit";
  if (opt_int("reduce_bucket_size") >= 0 || opt_int("prefetch_bucket_size") >= 0) {
    in.reduce_bucket_elems = std::max<int64_t>(0, opt_int("reduce_bucket_size"));
    in.prefetch_elems = std::max<int64_t>(0, opt_int("prefetch_bucket_size"));
    sizes += " and prefetch window, the reduce bucket ([strategy] reduce_bucket_size " +
             std::to_string(in.reduce_bucket_elems) + ", prefetch_bucket_size " +
             std::to_string(in.prefetch_elems) + " elements)";
  } else {
    sizes += " (strategy " + strategy.plugin + " sets no bucket sizes)";
  }
  if (const int64_t threshold = opt_int("param_persistence_threshold"); threshold > 0) {
    for (const auto& t : weights)
      if (t.numel() < threshold) in.persistent_params += t.numel();
    sizes += ", " + std::to_string(in.persistent_params) + " parameters persistent at stage 3";
  }
  return sizes;
}

}  // namespace

// The stage of the ZeRO estimate whose model state the job's strategy holds, or -1 when the
// job leaves it to the run ("auto", hybrid sharding, a strategy trainrun does not ship).
int zero_stage_of(const JobConfig& job) {
  const std::string& s = job.strategy.plugin;
  if (s == "single" || s == "ddp" || s == "ring") return 0;
  const auto& values = job.strategy.options.values();
  if (s == "zero") {
    auto it = values.find("stage");
    if (it != values.end() && std::holds_alternative<int64_t>(it->second)) {
      const int64_t stage = std::get<int64_t>(it->second);
      if (stage >= 0 && stage <= 3) return static_cast<int>(stage);
    }
    return -1;
  }
  if (s == "fsdp") {
    auto it = values.find("sharding_strategy");
    if (it == values.end() || !std::holds_alternative<std::string>(it->second)) return -1;
    const std::string& v = std::get<std::string>(it->second);
    if (v == "FULL_SHARD") return 3;
    if (v == "SHARD_GRAD_OP") return 2;
    if (v == "NO_SHARD") return 0;
  }
  return -1;
}

MemoryCheck check_memory(const JobConfig& job, const Registry& registry) {
  const int nproc = static_cast<int>(job.launch.get_int("nproc_per_node"));
  const int nnodes = static_cast<int>(job.launch.get_int("nnodes"));
  const int world = std::max(1, nproc * nnodes);
  // The model needs the dataset's DataInfo (input shape, classes, vocabulary); building the
  // dataset is the only honest source of it. Nothing that communicates or trains is built, and
  // run_dir is not created.
  v1::RunContext ctx;
  ctx.world_size = world;
  ctx.local_world_size = std::max(1, nproc);
  ctx.seed = static_cast<uint64_t>(job.trainer.get_int("seed"));
  ctx.job_file = job.file;
  ctx.run_dir = run_dir_of(job);
  auto dataset = registry.create<v1::Dataset>(*job.data.info, job.data.options, ctx);
  ctx.data = guarded(describe_component(*job.data.info), "info", [&] { return dataset->info(); });
  // The objective must train on the data's task: the run's own setup check, before any estimate.
  std::string task;
  if (!job.objective.plugin.empty()) {
    auto objective =
        registry.create<v1::Objective>(*job.objective.info, job.objective.options, ctx);
    task =
        guarded(describe_component(*job.objective.info), "task", [&] { return objective->task(); });
    if (auto* online = dynamic_cast<v1::OnlineObjective*>(objective.get()))
      check_online_job(job,
                       guarded(describe_component(*job.objective.info), "rollout_spec",
                               [&] { return online->rollout_spec(); }),
                       world);
  }
  check_objective_task(job, task, ctx.data.task);
  torch::manual_seed(ctx.seed);
  const std::string model_label = describe_component(*job.model.info);
  auto model = registry.create<v1::Model>(*job.model.info, job.model.options, ctx);
  auto precision = registry.create<v1::Precision>(*job.precision.info, job.precision.options, ctx);
  auto optimizer = registry.create<v1::Optimizer>(*job.optimizer.info, job.optimizer.options, ctx);
  // What the precision's convert() will store in another form (a quantized base), from shapes:
  // its layer selection is checked here as the run would check it.
  std::map<std::string, int64_t> stored;
  int64_t stored_weights = 0, stored_bytes = 0;
  std::string stored_format;
  if (const auto* plan = dynamic_cast<const v1::WeightStoragePlan*>(precision.get()))
    for (const auto& w : guarded(describe_component(*job.precision.info), "plan_weight_storage",
                                 [&] { return plan->plan_weight_storage(*model); })) {
      stored[w.module + ".weight"] = w.bytes;
      stored_weights += w.numel;
      stored_bytes += w.bytes;
      stored_format = w.format;
    }
  // What the run trains, as its setup leaves it: adapters (lora: an AdapterSwitch) freeze the base
  // and add their own parameters, then [trainer] freeze applies; only the trainable parameters
  // get gradients and optimizer state. Other callbacks are only constructed (they do nothing yet).
  std::vector<std::unique_ptr<v1::Callback>> adapters;
  for (const auto& c : job.callbacks) {
    auto cb = registry.create<v1::Callback>(*c.info, c.options, ctx);
    if (dynamic_cast<v1::AdapterSwitch*>(cb.get()) == nullptr) continue;
    guarded(describe_component(*c.info), "on_setup", [&] {
      cb->on_setup(*model, ctx);
      return 0;
    });
    adapters.push_back(std::move(cb));
  }
  freeze_parameters(job.trainer, *model);

  // [parallel] ep: the experts are split over ep ranks and never seen by the strategy; the
  // ZeRO table counts the rest.
  const int64_t ep = job.parallel.get_int("ep");
  int64_t expert_psi = 0, expert_frozen = 0;
  auto* em = dynamic_cast<v1::ExpertParallelModel*>(model.get());
  const v1::MemoryInputs mi =
      memory_inputs(precision.get(), optimizer.get(), v1::memory::physical_memory_bytes(), nproc, world);
  TrainableParameters counted = count_trainable(
      *model, model_label, mi.param_bytes, stored,
      em != nullptr && ep > 1 ? std::function<bool(const std::string&)>([em](const std::string& n) {
        return em->is_expert_parameter(n);
      })
                              : std::function<bool(const std::string&)>());
  if (ep > 1) {
    // What the run's setup checks (experts.cpp), before anything is launched.
    const std::string at = job.file + ": [parallel] ep = " + std::to_string(ep);
    if (em == nullptr)
      throw v1::ConfigError(
          at + ": model plugin '" + job.model.plugin +
          "' cannot split experts (it has no ExpertParallelModel capability, ABI 1.14)");
    if (em->num_experts() == 0)
      throw v1::ConfigError(at +
                            ": the model has no mixture-of-experts layer (expert parallelism "
                            "splits experts; drop [parallel] or set ep = 1)");
    if (em->num_experts() % ep != 0)
      throw v1::ConfigError(at + " does not divide the model's " +
                            std::to_string(em->num_experts()) + " experts per layer");
  }
  if (em != nullptr && em->num_experts() > 0) {
    for (const auto& p :
         guarded(model_label, "named_parameters", [&] { return model->named_parameters(); }))
      if (em->is_expert_parameter(p.name))
        (p.tensor.requires_grad() ? expert_psi : expert_frozen) += p.tensor.numel();
  }
  const int64_t psi = counted.psi, largest = counted.largest_unit;

  v1::memory::ZeroEstimateInputs in = v1::memory::zero_inputs(mi, psi, world);
  in.largest_unit_params = largest;
  in.frozen_params = counted.frozen;
  in.frozen_bytes = counted.frozen_bytes;
  in.whole_frozen_bytes = counted.whole_frozen_bytes;
  const std::string sizes = strategy_sizes(job.strategy, counted.tensors, in);
  const v1::Options& so = job.strategy.options;
  const auto stages = v1::memory::estimate_zero(in);
  int64_t budget = mi.memory_budget_bytes;
  std::string budget_source = "physical RAM / " + std::to_string(mi.local_world_size) + " local rank(s)";
  if (so.has("memory_budget_gb") && std::holds_alternative<double>(so.values().at("memory_budget_gb")) &&
      so.get_double("memory_budget_gb") > 0) {
    budget = static_cast<int64_t>(so.get_double("memory_budget_gb") * 1e9);
    budget_source = "[strategy] memory_budget_gb";
  }

  std::vector<std::string> lines;
  std::ostringstream os;
  const int64_t frozen = counted.frozen + counted.whole_frozen;
  os << "model " << job.model.plugin << ": " << psi << " trainable parameters"
     << (frozen > 0 ? " (+" + std::to_string(frozen) +
                          " frozen: weights only, no gradients or optimizer state" +
                          (counted.whole_frozen > 0
                               ? "; " + std::to_string(counted.whole_frozen) +
                                     " of them outside the units or tied, whole on every rank"
                               : std::string()) +
                          ")"
                    : std::string())
     << ", largest unit " << largest << " (" << std::max<size_t>(1, counted.units)
     << " unit(s)); world " << world << " = " << nnodes << " node(s) x " << nproc << " process(es)";
  lines.push_back(os.str());
  os.str("");
  os << "bytes per parameter: params " << mi.param_bytes << ", grads " << mi.grad_bytes
     << ", master " << mi.master_bytes << " (precision " << job.precision.plugin
     << (dynamic_cast<const v1::PrecisionBytes*>(precision.get()) ? ""
         : stored_weights > 0 ? ", fp32 beside the stored weights"
                              : ", assumed fp32")
     << "), optimizer state " << in.optimizer_bytes << " (" << job.optimizer.plugin
     << (mi.optimizer_bytes < 0 ? ", unknown: Adam's 8 assumed" : "") << ")";
  lines.push_back(os.str());
  if (stored_weights > 0) {
    os.str("");
    os.precision(3);
    os << "stored weights: " << stored.size() << " Linear weight(s) as " << stored_format << ", "
       << stored_weights << " weights in "
       << v1::memory::format_bytes(static_cast<double>(stored_bytes)) << " ("
       << 8.0 * static_cast<double>(stored_bytes) / static_cast<double>(stored_weights)
       << " bits each; " << job.precision.plugin << ")";
    lines.push_back(os.str());
    // convert() quantizes whole full-precision weights: every rank reads them all first.
    const double all_weights =
        static_cast<double>(psi + counted.frozen + counted.whole_frozen) * mi.param_bytes;
    os.str("");
    os << "loading: " << job.precision.plugin << " converts whole weights, so each rank first "
       << "holds the model at full precision with its stored form, about "
       << v1::memory::format_bytes(all_weights + static_cast<double>(stored_bytes))
       << " before training (not in the table)";
    lines.push_back(os.str());
  }
  lines.push_back(sizes);
  if (expert_psi + expert_frozen > 0) {
    const double per_trained =
        mi.param_bytes + mi.grad_bytes + mi.master_bytes + in.optimizer_bytes;
    const double whole = static_cast<double>(expert_psi) * per_trained +
                         static_cast<double>(expert_frozen) * mi.param_bytes;
    os.str("");
    os << "experts: " << expert_psi + expert_frozen << " parameters (" << expert_psi
       << " trainable), " << v1::memory::format_bytes(whole)
       << " of parameters, gradients and optimizer state";
    if (ep > 1)
      os << "; split over [parallel] ep = " << ep << ": "
         << v1::memory::format_bytes(whole / static_cast<double>(ep)) << " per rank ("
         << static_cast<int64_t>(whole / static_cast<double>(ep)) << " bytes), besides the table";
    else
      os << " per rank, inside the table ([parallel] ep splits them)";
    lines.push_back(os.str());
  }
  // The model's estimate of one micro-batch's activations (v1::ActivationMemory), for the
  // peak column: a sequence model's rows are [data] sample_shape's first dimension long.
  double activations = -1;
  if (const auto* am = dynamic_cast<const v1::ActivationMemory*>(model.get())) {
    v1::ActivationShape shape;
    const int64_t micro = job.trainer.get_int("micro_batch_size");
    shape.micro_batch_size =
        micro > 0 ? micro : std::max<int64_t>(1, job.trainer.get_int("global_batch_size") / world);
    shape.seq_len = ctx.data.sample_shape.empty() ? 0 : ctx.data.sample_shape.front();
    const std::string& pp = job.precision.plugin;
    shape.bytes_per_element =
        pp.find("bf16") != std::string::npos || pp.find("fp16") != std::string::npos ? 2 : 4;
    shape.checkpointing = job.trainer.get_bool("activation_checkpointing");
    activations =
        guarded(model_label, "activation_bytes", [&] { return am->activation_bytes(shape); });
    os.str("");
    os << "activations: " << v1::memory::format_bytes(activations) << " per micro-batch of "
       << shape.micro_batch_size << " rows x " << shape.seq_len
       << " tokens, every row at its longest (shorter rows hold less; "
       << (shape.bytes_per_element == 2 ? "16-bit autocast, with the weights' 16-bit copies"
                                        : "fp32")
       << (shape.checkpointing ? ", checkpointed" : "")
       << "; the model's estimate), in the peak column";
    lines.push_back(os.str());
  }
  const int held = zero_stage_of(job);
  const auto table = v1::memory::format_zero_table(stages, budget, activations);
  for (size_t i = 0; i < table.size(); ++i)
    lines.push_back(table[i] + (i > 0 && static_cast<int>(i) - 1 == held
                                    ? "   <- what strategy " + job.strategy.plugin + " holds"
                                    : ""));
  if (budget > 0)
    lines.push_back("budget per rank " + v1::memory::format_bytes(static_cast<double>(budget)) +
                    " (" + budget_source + ")");
  lines.push_back("per rank, after Rajbhandari et al., ZeRO (SC20), sec. 3.1 and 5; 1 MiB = 2^20 bytes");
  MemoryCheck out;
  out.stages = stages;
  out.activation_bytes = activations;
  out.trainable_params = psi;
  out.world_size = world;
  out.lines = std::move(lines);
  out.model = guarded(model_label, "describe", [&] { return model->describe(); });
  return out;
}

std::vector<std::string> check_memory_lines(const JobConfig& job, const Registry& registry) {
  return check_memory(job, registry).lines;
}

}  // namespace trainrun::core
