// The [eval] tasks of a run (issue 49): lm-eval YAML tasks (eval/include/trainrun/eval/
// harness.hpp) scored by the model being trained whenever the run evaluates ([trainer]
// eval_every, eval_on_start, the end), after the held-out loss. The model answers through its
// KV-cache decoder (decoder_model.hpp) with its parameters whole on every rank (a sharding
// strategy gathers them, as for a rollout) and its adapters active; each rank answers a share of
// the requests and the answers are summed over the ranks, so every rank computes the same
// metrics. Rank 0 writes <run_dir>/eval/step-<N>/results.json (shaped like lm-eval's) and the
// sample logs; the aggregates go to the callbacks as EvalMetrics::extra["tasks/<task>/<metric>,
// <filter>"] (metrics.jsonl, TensorBoard, the report).
#include <torch/types.h>
#include <torch/utils.h>

#include <trainrun/generation.hpp>

#include <filesystem>
#include <iomanip>
#include <iostream>
#include <cmath>
#include <sstream>

#include "run.hpp"
#include "trainrun/eval/decoder_model.hpp"
#include "trainrun/eval/harness.hpp"
#include "trainrun/text/tokenizer.hpp"

namespace fs = std::filesystem;

namespace trainrun::core {

struct EvalTasks {
  std::vector<eval::Task> tasks;
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::unique_ptr<eval::DecoderLanguageModel> model;
  int64_t max_length = 0, batch_size = 0;
  bool log_samples = true;
};

void Run::set_up_eval_tasks() {
  const v1::Options& o = job_.eval;
  const std::vector<std::string>& files = o.get_string_list("tasks");
  if (files.empty()) return;
  const std::string where = job_.file + ": [eval]";
  auto* decoder = dynamic_cast<v1::IncrementalDecoder*>(parts_.model.obj.get());
  if (decoder == nullptr || dynamic_cast<v1::PaddedDecoder*>(parts_.model.obj.get()) == nullptr)
    throw v1::ConfigError(where +
                          " tasks are scored with the model's batched KV-cache decoding, "
                          "and " +
                          parts_.model.label +
                          " has none (ABI 1.10 PaddedDecoder); the llama plugin has it");
  const std::string model_dir =
      job_.model.options.has("path") ? job_.model.options.get_string("path") : std::string();
  std::string tok_dir = o.get_string("tokenizer");
  if (tok_dir.empty()) tok_dir = model_dir;
  if (tok_dir.empty())
    throw v1::ConfigError(where +
                          " tokenizer: the model has no [model] path to read "
                          "tokenizer.json from; name its directory");
  auto t = std::make_shared<EvalTasks>();
  eval::TaskOptions opts;
  if (o.get_int("num_fewshot") >= 0) opts.num_fewshot = o.get_int("num_fewshot");
  if (o.get_int("limit") > 0) opts.limit = o.get_int("limit");
  opts.fewshot_seed = o.get_int("fewshot_seed");
  try {
    for (const std::string& f : files)
      for (const fs::path& p : eval::task_files(f)) t->tasks.push_back(eval::Task::load(p, opts));
    t->tokenizer = std::make_unique<text::Tokenizer>(text::Tokenizer::from_directory(tok_dir));
    t->max_length = o.get_int("max_length");
    if (t->max_length == 0) {
      if (model_dir.empty() || !fs::is_regular_file(fs::path(model_dir) / "config.json"))
        throw v1::ConfigError(
            "max_length: 0 reads [model] path's config.json, which there is "
            "not; give the tokens per input");
      t->max_length = eval::model_max_length(model_dir);
    }
    t->batch_size = o.get_int("batch_size");
    t->log_samples = o.get_bool("log_samples");
    t->model = eval::make_decoder_language_model(
        *t->tokenizer, *decoder, t->max_length, t->batch_size,
        eval::generation_eos_ids(model_dir.empty() ? tok_dir : model_dir, *t->tokenizer),
        parts_.model.label);
  } catch (const v1::ConfigError& e) {
    throw v1::ConfigError(where + " " + e.what());
  }
  eval_tasks_ = std::move(t);
}

void Run::evaluate_tasks(int64_t step, v1::EvalMetrics& em) {
  if (!eval_tasks_) return;
  EvalTasks& et = *eval_tasks_;
  const auto t0 = Clock::now();
  eval::Json results, samples = eval::Json::object();
  std::vector<int64_t> per_rank;  // requests each rank answered
  std::vector<double> busy;       // seconds each rank spent answering them
  {
    const std::unique_ptr<v1::Scope> scope = whole_parameters("[eval] tasks are scored");
    parts_.model.call("train", [](v1::Model& m) {
      m.train(false);
      return 0;
    });
    torch::NoGradGuard no_grad;
    eval::ShardedLanguageModel lm(
        *et.model, env_.ctx.rank, env_.ctx.world_size, [&](std::vector<double>& v) {
          at::Tensor x = torch::tensor(v, torch::kDouble);
          wait(sum_over_ranks(x, "all_reduce (eval tasks)"), "wait (eval tasks)");
          const double* p = x.data_ptr<double>();
          std::copy(p, p + v.size(), v.begin());
        });
    results = parts_.model.call("eval tasks", [&](v1::Model&) {
      return eval::evaluate(et.tasks, lm, et.log_samples ? &samples : nullptr);
    });
    parts_.model.call("train", [](v1::Model& m) {
      m.train(true);
      return 0;
    });
    // [requests answered, seconds answering] per rank
    const size_t W = static_cast<size_t>(env_.ctx.world_size),
                 me = static_cast<size_t>(env_.ctx.rank);
    std::vector<double> counts(2 * W, 0.0);
    counts[me] = static_cast<double>(lm.answered());
    counts[W + me] = lm.busy_seconds();
    at::Tensor x = torch::tensor(counts, torch::kDouble);
    wait(sum_over_ranks(x, "all_reduce (eval tasks)"), "wait (eval tasks)");
    for (size_t r = 0; r < W; ++r) {
      per_rank.push_back(
          static_cast<int64_t>(std::llround(x[static_cast<int64_t>(r)].item<double>())));
      busy.push_back(x[static_cast<int64_t>(W + r)].item<double>());
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // lm-eval's "<metric>,<filter>" aggregates, stderr left out.
  std::ostringstream line;
  line << std::fixed << std::setprecision(4);
  for (auto it = results["results"].begin(); it != results["results"].end(); ++it)
    for (auto m = it.value().begin(); m != it.value().end(); ++m) {
      const std::string& key = m.key();
      if (key.find(',') == std::string::npos || key.find("_stderr,") != std::string::npos ||
          !m.value().is_number())
        continue;
      const double v = m.value().get<double>();
      em.extra["tasks/" + it.key() + "/" + key] = v;
      line << " | " << it.key() << " " << key << " " << v;
    }
  if (!env_.lead) return;
  results["config"] = eval::Json{{"model", "trainrun"},
                                 {"job", job_.file},
                                 {"step", step},
                                 {"model_plugin", parts_.model.label},
                                 {"strategy", parts_.strategy.label},
                                 {"world_size", env_.ctx.world_size},
                                 {"requests_per_rank", per_rank},
                                 {"answer_seconds_per_rank", busy},
                                 {"batch_size", et.batch_size},
                                 {"max_length", et.max_length}};
  results["max_length"] = et.max_length;
  results["total_evaluation_time_seconds"] = std::to_string(seconds);
  const fs::path dir = fs::path(env_.ctx.run_dir) / "eval" / ("step-" + std::to_string(step));
  eval::write_results(dir / "results.json", results, et.log_samples ? dir : fs::path(), samples);
  const std::string scores = line.str();
  std::cout << "[eval tasks step " << step << "]" << (scores.empty() ? "" : scores.substr(2))
            << " | " << std::setprecision(3) << seconds << " s -> " << dir.string()
            << std::defaultfloat << std::setprecision(6) << std::endl;
}

}  // namespace trainrun::core
