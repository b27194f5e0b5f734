// The objective (ABI 1.8, trainrun/objective.hpp): installed into the model in build, its
// reference model (the policy with adapters switched off, or the initial model's values
// precomputed once and cached in the run directory), the forward of every micro-batch as the
// objective sees it, and its metrics.
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <optional>
#include <sstream>
#include <vector>

#include "objective_task.hpp"
#include "run.hpp"
#include "trainrun/core/log.hpp"
#include "trainrun/core/safetensors.hpp"

namespace fs = std::filesystem;

namespace trainrun::core {

using v1::ConfigError;

namespace {

const char* split_name(v1::Split s) { return s == v1::Split::Train ? "train" : "eval"; }

// What decides the reference values: the resolved job's [model], [data], [objective] and
// [precision] tables, [trainer] seed (a randomly initialised model) and init_weights, and the
// model directory's weight files (sizes and times); a cache written under anything else is
// recomputed, not reused.
std::string reference_fingerprint(const std::string& resolved_toml) {
  std::istringstream in(resolved_toml);
  std::string line, kept, section;
  for (; std::getline(in, line);) {
    if (!line.empty() && line[0] == '[') section = line;
    const bool table = section == "[model]" || section == "[data]" || section == "[objective]" ||
                       section == "[precision]";
    const bool trainer_key = section == "[trainer]" &&
                             (line.rfind("seed ", 0) == 0 || line.rfind("init_weights ", 0) == 0);
    if (table || trainer_key) kept += line + "\n";
    if (section == "[model]" && line.rfind("path = ", 0) == 0 && line.size() > 9) {
      const std::string dir = line.substr(8, line.size() - 9);  // path = 'DIR'
      std::error_code ec;
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        if (e.path().extension() != ".safetensors" && e.path().filename() != "config.json")
          continue;
        const auto size = fs::file_size(e.path(), ec);
        const auto time = fs::last_write_time(e.path(), ec).time_since_epoch().count();
        files.push_back(e.path().filename().string() + ":" + std::to_string(size) + ":" +
                        std::to_string(time));
      }
      std::sort(files.begin(), files.end());
      for (const auto& f : files) kept += f + "\n";
    }
  }
  std::ostringstream os;
  os << std::hex << std::hash<std::string>{}(kept);
  return os.str();
}

// The cached reference values when `file` holds them for this job (same fingerprint, both
// splits of the right sizes and width); nothing otherwise, saying why on the lead rank.
std::optional<std::array<at::Tensor, 2>> read_reference_cache(const fs::path& file,
                                                              const std::string& fingerprint,
                                                              const int64_t sizes[2], int64_t width,
                                                              bool lead) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  std::map<std::string, std::string> meta;
  std::vector<v1::NamedTensor> tensors;
  try {
    tensors = read_safetensors(file.string(), &meta);
  } catch (const std::exception& e) {
    if (lead)
      log_warn("reference: " + file.string() + " is unreadable (" + e.what() + "); recomputing");
    return std::nullopt;
  }
  bool ok = meta["fingerprint"] == fingerprint && tensors.size() == 2;
  for (size_t k = 0; ok && k < 2; ++k)
    ok = tensors[k].name == split_name(k == 0 ? v1::Split::Train : v1::Split::Eval) &&
         tensors[k].tensor.dim() == 2 && tensors[k].tensor.size(0) == sizes[k] &&
         tensors[k].tensor.size(1) == width && tensors[k].tensor.scalar_type() == at::kDouble;
  if (!ok) {
    if (lead) log_info("reference: " + file.string() + " was written for another job; recomputing");
    return std::nullopt;
  }
  return std::array<at::Tensor, 2>{tensors[0].tensor, tensors[1].tensor};
}

}  // namespace

// What to change in [data] when an objective meets data of another task, for the shipped
// datasets' tasks; "" when there is nothing to suggest.
static std::string data_hint(const std::string& wanted, const std::string& given) {
  if (given != "preference" && given != "reward" && given != "unpaired-preference") return "";
  if (wanted == "reward")
    return " (the preference dataset lays pairs out for it with [data] plugin = \"preference\", "
           "trainer = \"reward\")";
  if (wanted == "preference")
    return " (the preference dataset lays pairs out for it with [data] plugin = \"preference\" "
           "and trainer = \"dpo\", \"cpo\" or \"orpo\", whichever TRL trainer's tokenization "
           "the objective follows)";
  if (wanted == "unpaired-preference")
    return " (use [data] plugin = \"unpaired\": it reads KTO's {prompt, completion, label} rows "
           "and also preference pairs, unpaired as TRL does)";
  return "";
}

void check_objective_task(const JobConfig& job, const std::string& task,
                          const std::string& data_task) {
  if (task.empty()) {
    // The model's own loss is next-token cross-entropy over language-modelling targets.
    if (data_task == "preference")
      throw ConfigError(job.file + ": [data] " + job.data.plugin +
                        " gives preference pairs, which need an " +
                        "[objective] that compares them (plugin = \"dpo\", \"simpo\" or \"orpo\")");
    if (data_task == "unpaired-preference")
      throw ConfigError(job.file + ": [data] " + job.data.plugin +
                        " gives KTO's unpaired examples with their KL rows, which need " +
                        "[objective] plugin = \"kto\"");
    if (data_task == "prompts")
      throw ConfigError(job.file + ": [data] " + job.data.plugin +
                        " gives prompts without answers, which need an online [objective] that " +
                        "generates and scores completions (plugin = \"grpo\", with [[rewards]])");
    if (data_task == "reward")
      throw ConfigError(job.file + ": [data] " + job.data.plugin +
                        " gives pairs laid out for a reward model, which need [objective] " +
                        "plugin = \"reward\"");
    return;
  }
  if (task != data_task)
    throw ConfigError(job.file + ": [objective] " + job.objective.plugin + " trains on '" + task +
                      "' data, but [data] " + job.data.plugin + " gives '" + data_task + "' data" +
                      data_hint(task, data_task));
}

// In build, after the callbacks' on_setup (LoRA's adapters exist) and before Strategy::setup.
void Run::set_up_objective() {
  if (!parts_.objective.obj) {
    check_objective_task(job_, "", env_.ctx.data.task);
    return;
  }
  v1::Objective& obj = *parts_.objective.obj;
  const std::string task = parts_.objective.call("task", [](v1::Objective& o) { return o.task(); });
  check_objective_task(job_, task, env_.ctx.data.task);
  caps_.objective_model = dynamic_cast<v1::ObjectiveModel*>(parts_.model.obj.get());
  if (caps_.objective_model == nullptr)
    throw ConfigError(job_.file + ": [objective] " + job_.objective.plugin +
                      " needs a model that computes " +
                      "log-probabilities for objectives (ABI 1.8 ObjectiveModel); " +
                      parts_.model.label + " does not");
  const uint32_t wanted = parts_.objective.call(
      "wanted_statistics", [](v1::Objective& o) { return o.wanted_statistics(); });
  if (wanted & v1::Objective::kScores) {
    // TokenLogProbs::scores (ABI 1.9) exists only in what a SequenceClassifier model fills.
    auto* sc = dynamic_cast<v1::SequenceClassifier*>(parts_.model.obj.get());
    if (sc == nullptr || sc->num_labels() < 1)
      throw ConfigError(job_.file + ": [objective] " + job_.objective.plugin +
                        " scores whole sequences and needs a model with a sequence-" +
                        "classification head (ABI 1.9 SequenceClassifier); " + parts_.model.label +
                        (sc ? " has none this run: set [model] architecture = " +
                                  std::string("\"sequence_classification\"")
                            : std::string(" is not one")));
  }
  caps_.extremes = dynamic_cast<v1::ObjectiveExtremes*>(parts_.objective.obj.get());
  caps_.sample_values = dynamic_cast<v1::SampleValues*>(parts_.dataset.obj.get());
  for (auto& cb : parts_.callbacks)
    if (auto* s = dynamic_cast<v1::AdapterSwitch*>(cb.obj.get()); s && s->has_adapters())
      caps_.adapters = s;
  const int64_t width = parts_.objective.call("reference_width",
                                              [](v1::Objective& o) { return o.reference_width(); });
  const std::string mode = job_.trainer.get_string("reference_model");
  if (width > 0) {
    if (mode == "adapters_off" && caps_.adapters == nullptr)
      throw ConfigError(
          job_.file +
          ": [trainer] reference_model = \"adapters_off\" needs adapters (a [[callbacks]] " +
          "lora), and this job trains the whole model: use \"precomputed\" or \"auto\"");
    plan_->reference = mode == "precomputed" || caps_.adapters == nullptr
                           ? ReferenceMode::Precomputed
                           : ReferenceMode::AdaptersOff;
  }
  parts_.model.call("set_objective", [&](v1::Model&) {
    caps_.objective_model->set_objective(&obj);
    return 0;
  });
}

// ReferenceMode::Precomputed: the initial model's reference values for every sample of both
// splits, before any step (and before resume loads trained weights), each sample on one rank,
// then summed over ranks so every rank holds the whole table; cached in <run_dir>/reference/
// (a folder the next run's rotation leaves in place) and reused when the job's model, data,
// objective and precision tables are the same.
void Run::prepare_reference() {
  if (plan_->reference != ReferenceMode::Precomputed) return;
  const int64_t width = parts_.objective.obj->reference_width();
  const fs::path file = fs::path(env_.ctx.run_dir) / "reference" / "logps.safetensors";
  const std::string fingerprint = reference_fingerprint(job_.resolved_toml);
  const int64_t sizes[2] = {plan_->train_samples, plan_->eval_samples};
  std::optional<std::array<at::Tensor, 2>> cached =
      read_reference_cache(file, fingerprint, sizes, width, env_.lead);
  // Computing is collective: every rank reuses the cache or none does (a node without the file,
  // where run_dir is not shared, computes with the others).
  if (env_.ctx.world_size > 1) {
    at::Tensor have = torch::tensor({cached ? 1.0 : 0.0}, torch::kDouble);
    wait(sum_over_ranks(have, "all_reduce (reference cache)"), "wait (reference cache)");
    if (have.item<double>() < env_.ctx.world_size) cached.reset();
  }
  if (cached) {
    progress_.reference[0] = (*cached)[0];
    progress_.reference[1] = (*cached)[1];
    if (env_.lead)
      log_info("reference: the initial model's values for " + std::to_string(sizes[0]) + " + " +
               std::to_string(sizes[1]) + " samples reused from " + file.string());
    return;
  }
  const auto t0 = Clock::now();
  const int world = env_.ctx.world_size, rank = env_.ctx.rank;
  parts_.model.call("train", [](v1::Model& m) {
    m.train(false);
    return 0;
  });
  for (int k = 0; k < 2; ++k) {
    const v1::Split split = k == 0 ? v1::Split::Train : v1::Split::Eval;
    const int64_t n = sizes[k];
    const int64_t mb = k == 0 ? plan_->steps().micro_batch_size : plan_->eval_batch_size;
    at::Tensor table = torch::zeros({n, width}, torch::kDouble);
    // Sample i on rank i % world; every rank runs the same number of forwards (a sharded
    // strategy's forward is a collective), a rank out of samples a filler whose result is dropped.
    std::vector<int64_t> mine;
    for (int64_t i = rank; i < n; i += world) mine.push_back(i);
    const int64_t per_rank = (n + world - 1) / world;
    const int64_t batches = (per_rank + mb - 1) / mb;
    for (int64_t b = 0; b < batches; ++b) {
      const int64_t lo = std::min<int64_t>(b * mb, static_cast<int64_t>(mine.size()));
      const int64_t hi = std::min<int64_t>(lo + mb, static_cast<int64_t>(mine.size()));
      std::vector<int64_t> idx(mine.begin() + lo, mine.begin() + hi);
      const bool filler = idx.empty();
      if (filler) idx = {0};
      const v1::Batch batch = get_batch(split, idx);
      v1::ObjectiveForward f;
      f.split = split;
      f.pass = v1::ObjectivePass::Reference;
      f.indices = idx;
      f.filler = filler;
      parts_.objective.call("begin_forward", [&](v1::Objective& o) {
        o.begin_forward(f);
        return 0;
      });
      {
        torch::NoGradGuard no_grad;
        auto scope =
            parts_.precision.call("autocast", [](v1::Precision& p) { return p.autocast(); });
        parts_.strategy.call("forward", [&](v1::Strategy& s) { return s.forward(batch); });
      }
      const at::Tensor ref = parts_.objective.call(
          "take_reference", [](v1::Objective& o) { return o.take_reference(); });
      TR_CHECK(
          ref.dim() == 2 && ref.size(0) == static_cast<int64_t>(idx.size()) && ref.size(1) == width,
          parts_.objective.label, ": take_reference() gave shape ", ref.sizes(), " for ",
          idx.size(), " samples (reference_width ", width, ")");
      if (filler) continue;
      table.index_copy_(0, torch::tensor(idx, torch::kLong), ref.to(torch::kDouble).cpu());
    }
    // Each row was filled by exactly one rank (zeros elsewhere): the sum is the table.
    if (world > 1)
      wait(sum_over_ranks(table, "all_reduce (reference values)"), "wait (reference values)");
    progress_.reference[k] = table;
  }
  parts_.model.call("train", [](v1::Model& m) {
    m.train(true);
    return 0;
  });
  // The objective's figures of these passes are not the run's.
  parts_.objective.obj->take_metrics(v1::Split::Train);
  parts_.objective.obj->take_metrics(v1::Split::Eval);
  if (caps_.extremes != nullptr)
    for (v1::Split sp : {v1::Split::Train, v1::Split::Eval}) caps_.extremes->take_extremes(sp);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (env_.lead) {
    fs::create_directories(file.parent_path());
    const std::string tmp = file.string() + ".tmp";
    write_safetensors(tmp, {{"train", progress_.reference[0]}, {"eval", progress_.reference[1]}},
                      {{"fingerprint", fingerprint}, {"objective", job_.objective.plugin}});
    fs::rename(tmp, file);
    std::ostringstream os;
    os << "reference: the initial model's values for " << sizes[0] << " train + " << sizes[1]
       << " eval samples computed in " << std::fixed << std::setprecision(1) << secs
       << " s, kept in " << file.string();
    log_info(os.str());
  }
}

// One micro-batch through the strategy as the objective sees it: its reference pass first where
// it needs one (adapters off, no grad), then the policy pass. Without an objective: the plain
// forward. Autocast as the precision says, for both passes.
v1::ModelOutput Run::objective_forward(v1::Split split, const v1::Batch& batch,
                                       const std::vector<int64_t>& indices, bool filler) {
  auto forward = [&] {
    auto scope = parts_.precision.call("autocast", [](v1::Precision& p) { return p.autocast(); });
    return parts_.strategy.call("forward", [&](v1::Strategy& s) { return s.forward(batch); });
  };
  if (!parts_.objective.obj) return forward();
  v1::ObjectiveForward f;
  f.split = split;
  f.indices = indices;
  f.filler = filler;
  if (v1::SampleValues* values = caps_.sample_values) {  // ABI 1.10: e.g. a reward margin
    f.sample_value_names = parts_.dataset.call(
        "sample_value_names", [&](v1::Dataset&) { return values->sample_value_names(); });
    if (!f.sample_value_names.empty())
      f.sample_values = parts_.dataset.call(
          "sample_values", [&](v1::Dataset&) { return values->sample_values(split, indices); });
  }
  if (plan_->reference == ReferenceMode::AdaptersOff) {
    f.pass = v1::ObjectivePass::Reference;
    parts_.objective.call("begin_forward", [&](v1::Objective& o) {
      o.begin_forward(f);
      return 0;
    });
    {
      torch::NoGradGuard no_grad;
      caps_.adapters->set_adapters_enabled(false);
      try {
        forward();
      } catch (...) {
        caps_.adapters->set_adapters_enabled(true);
        throw;
      }
      caps_.adapters->set_adapters_enabled(true);
    }
    f.reference = parts_.objective.call("take_reference",
                                        [](v1::Objective& o) { return o.take_reference(); });
  } else if (plan_->reference == ReferenceMode::Precomputed) {
    const at::Tensor& table = progress_.reference[split == v1::Split::Train ? 0 : 1];
    f.reference = table.index_select(0, torch::tensor(indices, torch::kLong));
  }
  f.pass = v1::ObjectivePass::Policy;
  if (env_.ctx.world_size > 1) f.comm = parts_.comm;  // ABI 1.9: collectives in compute()
  parts_.objective.call("begin_forward", [&](v1::Objective& o) {
    o.begin_forward(f);
    return 0;
  });
  return forward();
}

// The objective's figures since the last call, sorted by name so every rank lists them alike.
std::vector<v1::ObjectiveMetric> Run::objective_metrics(v1::Split split) {
  if (!parts_.objective.obj) return {};
  auto m = parts_.objective.call("take_metrics",
                                 [&](v1::Objective& o) { return o.take_metrics(split); });
  if (caps_.extremes != nullptr) {
    // Minimum (maximum) over the ranks per micro-batch, then the mean over the micro-batches,
    // handed on as a metric of the lead rank alone (the tail sums every rank's sum and count).
    auto ex = parts_.objective.call(
        "take_extremes", [&](v1::Objective&) { return caps_.extremes->take_extremes(split); });
    std::sort(ex.begin(), ex.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    std::vector<double> flat;
    for (const auto& e : ex)
      for (double v : e.values) flat.push_back(e.maximum ? -v : v);
    at::Tensor t = torch::tensor(flat, torch::kDouble);
    if (env_.ctx.world_size > 1 && !flat.empty()) {
      v1::AllReduceOptions opts;
      opts.op = v1::ReduceOp::Min;
      wait(parts_.comm->all_reduce(t, opts), "wait (objective minima and maxima)");
    }
    const double* r = t.data_ptr<double>();
    size_t at = 0;
    for (const auto& e : ex) {
      double sum = 0;
      int64_t n = 0;
      for (size_t i = 0; i < e.values.size(); ++i, ++at)
        if (std::isfinite(r[at])) sum += e.maximum ? -r[at] : r[at], ++n;
      m.push_back({e.name, env_.lead ? sum : 0.0, env_.lead ? static_cast<double>(n) : 0.0});
    }
  }
  std::sort(m.begin(), m.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return m;
}

}  // namespace trainrun::core
