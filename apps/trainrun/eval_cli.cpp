// `trainrun eval` (eval_cli.hpp): lm-eval YAML tasks (eval/include/trainrun/eval/harness.hpp)
// answered by a model plugin's PaddedDecoder as lm-eval's HFLM answers them
// (eval/include/trainrun/eval/decoder_model.hpp), in one process on an HF directory.
#include "eval_cli.hpp"

#include <ATen/ATen.h>
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "command_line.hpp"
#include "generate_cli.hpp"
#include "trainrun/batch_generation.hpp"
#include "trainrun/error.hpp"
#include "trainrun/eval/decoder_model.hpp"
#include "trainrun/eval/harness.hpp"
#include "trainrun/generation.hpp"
#include "trainrun/runtime/cpu_runtime.hpp"
#include "trainrun/text/tokenizer.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace trainrun::app {
namespace {

using eval::Json;
using eval::Request;
using v1::ConfigError;

struct EvalArgs {
  std::string model_dir, adapter, output, log_samples, model_plugin = "llama";
  std::vector<std::string> tasks, plugin_paths;
  std::optional<int64_t> num_fewshot, limit, max_length;
  int64_t fewshot_seed = 1234, batch_size = 8, threads = 0;
  bool plain_base = false;
};

// lm-eval's results table (make_table): task, version, filter, n-shot, metric, value, stderr.
void print_table(const Json& results) {
  std::cout << "|Tasks|Version|Filter|n-shot|Metric| |Value| |Stderr|\n"
            << "|-----|-------|------|-----:|------|-|----:|-|-----:|\n";
  for (auto it = results["results"].begin(); it != results["results"].end(); ++it) {
    const std::string& task = it.key();
    const Json& v = results["versions"][task];
    const std::string version = v.is_null()     ? "N/A"
                                : v.is_string() ? v.get<std::string>()
                                                : v.dump();
    bool first = true;
    for (auto m = it.value().begin(); m != it.value().end(); ++m) {
      const std::string& key = m.key();
      if (key.find(',') == std::string::npos || key.find("_stderr,") != std::string::npos) continue;
      const size_t comma = key.find(',');
      const std::string metric = key.substr(0, comma), filter = key.substr(comma + 1);
      const Json& err = it.value()[metric + "_stderr," + filter];
      const bool hib = results["higher_is_better"][task].value(metric, true);
      std::ostringstream row;
      row << std::fixed << std::setprecision(4);
      row << "|" << (first ? task : "") << "|" << (first ? version : "") << "|" << filter << "|"
          << results["n-shot"][task].get<int64_t>() << "|" << metric << "|" << (hib ? "↑" : "↓")
          << "|" << m.value().get<double>() << "|±|";
      if (err.is_number())
        row << err.get<double>();
      else
        row << "N/A";
      std::cout << row.str() << "|\n";
      first = false;
    }
  }
  std::cout.flush();
}

int run_eval(const EvalArgs& a) {
  check_model_dir(a.model_dir);
  // Scoring is matmul-bound: OpenBLAS's pool on the usable cores and LibTorch's OpenMP pool at
  // one thread. With both pools at full size, or LibTorch's at full size and OpenBLAS's at one
  // (a training rank's plan, cpu_runtime.hpp), OpenMP's threads spin beside OpenBLAS's: on 2 cores
  // SmolLM2's perplexity requests took 25.9 s that way, 11.1 s at 1 + 1, 8.1 s at 1 + 2.
  const v1::cpu::CoreBudget cores = v1::cpu::available_cores();
  v1::cpu::apply(v1::cpu::plan_threads(1, a.threads > 0 ? a.threads : std::max(1, cores.usable),
                                       false, 0, 1, cores),
                 "eval");
  eval::TaskOptions opts;
  opts.num_fewshot = a.num_fewshot;
  opts.limit = a.limit;
  opts.fewshot_seed = a.fewshot_seed;
  std::vector<eval::Task> tasks;
  for (const std::string& t : a.tasks)
    for (const fs::path& f : eval::task_files(t)) tasks.push_back(eval::Task::load(f, opts));

  const text::Tokenizer tok = text::Tokenizer::from_directory(a.model_dir);
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel loaded = load_hf_model("trainrun eval", a.model_dir, a.model_plugin, a.plugin_paths,
                                     "language_modeling", {});
  auto* dec = dynamic_cast<v1::IncrementalDecoder*>(loaded.model.get());
  if (!dec)
    throw ConfigError(loaded.label +
                      " does not offer batched decoding (v1::PaddedDecoder), "
                      "which trainrun eval scores with");
  std::string base_note;
  const int merged =
      prepare_for_inference(loaded, a.adapter, {a.plain_base, a.plugin_paths, "eval"}, &base_note);
  std::cerr << "eval: " << describe_loaded(loaded, merged, a.adapter) << std::endl;
  if (!base_note.empty()) std::cerr << "eval: " << base_note << std::endl;
  const int64_t max_length = a.max_length.value_or(eval::model_max_length(a.model_dir));
  const std::unique_ptr<eval::DecoderLanguageModel> model =
      eval::make_decoder_language_model(tok, *dec, max_length, a.batch_size,
                                        eval::generation_eos_ids(a.model_dir, tok), loaded.label);
  eval::DecoderLanguageModel& lm = *model;

  at::NoGradGuard no_grad;
  const auto t1 = std::chrono::steady_clock::now();
  Json samples = Json::object();
  Json results = eval::evaluate(tasks, lm, a.log_samples.empty() ? nullptr : &samples);
  const auto t2 = std::chrono::steady_clock::now();
  const double eval_s = std::chrono::duration<double>(t2 - t1).count();
  results["config"] = Json{
      {"model", "trainrun"},
      {"model_args", "pretrained=" + a.model_dir + (a.adapter.empty() ? "" : ",peft=" + a.adapter)},
      {"model_plugin", loaded.label},
      {"batch_size", a.batch_size},
      {"max_length", max_length},
      {"limit", a.limit ? Json(*a.limit) : Json(nullptr)},
      {"fewshot_seed", a.fewshot_seed}};
  // lm-eval's run fields: the tokenizer's special tokens as [text, "id"], the EOS id, max length.
  auto special = [&](const std::optional<std::string>& t, const std::optional<int32_t>& id) {
    return t && id ? Json::array({*t, std::to_string(*id)}) : Json(nullptr);
  };
  results["tokenizer_pad_token"] = special(tok.pad_token(), tok.pad_token_id());
  results["tokenizer_eos_token"] = special(tok.eos_token(), tok.eos_token_id());
  results["tokenizer_bos_token"] = special(tok.bos_token(), tok.bos_token_id());
  results["eot_token_id"] = tok.eos_token_id() ? Json(*tok.eos_token_id()) : Json(nullptr);
  results["max_length"] = max_length;
  results["date"] =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  results["total_evaluation_time_seconds"] = std::to_string(eval_s);
  results["load_time_seconds"] = std::chrono::duration<double>(t1 - t0).count();

  if (!a.output.empty() || !a.log_samples.empty())
    eval::write_results(a.output.empty() ? fs::path() : fs::path(a.output), results, a.log_samples,
                        samples);
  print_table(results);
  std::cerr << "eval: " << tasks.size() << " tasks in " << std::fixed << std::setprecision(2)
            << eval_s << " s (" << lm.scored_tokens() << " tokens scored, " << lm.generated_tokens()
            << " generated)" << std::endl;
  return 0;
}

}  // namespace

int run_eval_command(int argc, char** argv) {
  EvalArgs a;
  int64_t num_fewshot = -1, limit = -1, max_length = -1;
  po::options_description opts("trainrun eval options");
  opts.add_options()("help,h", "show this help")(
      "model", po::value(&a.model_dir),
      "Hugging Face model directory (config.json, safetensors, tokenizer files)")(
      "adapter", po::value(&a.adapter),
      "PEFT LoRA adapter directory, merged into the weights in memory")(
      "plain-base", po::bool_switch(&a.plain_base),
      "QLoRA adapters: merge into the full-precision base instead of the quantized one")(
      "tasks", po::value(&a.tasks)->composing(),
      "lm-eval YAML task file, or a directory of them (repeatable)")(
      "num-fewshot", po::value(&num_fewshot), "few-shot examples per document, for every task")(
      "limit", po::value(&limit), "evaluate the first N documents of each task")(
      "fewshot-seed", po::value(&a.fewshot_seed),
      "seed of the few-shot sampler (lm-eval's default 1234)")(
      "batch-size", po::value(&a.batch_size), "requests per forward pass (default 8)")(
      "max-length", po::value(&max_length),
      "tokens per input at most (default: config.json's max_position_embeddings)")(
      "output", po::value(&a.output), "results JSON, shaped like lm-eval's")(
      "log-samples", po::value(&a.log_samples),
      "directory for samples_<task>.jsonl: each document's requests, answers and metrics")(
      "threads", po::value(&a.threads),
      "BLAS threads (default: the usable cores; LibTorch's own pool runs one)")(
      "model-plugin", po::value(&a.model_plugin),
      "model component to load the directory with (default llama)")(
      "plugin-path", po::value(&a.plugin_paths)->composing(),
      "plugin directory or file, searched first (repeatable)");
  po::variables_map vm;
  if (const auto done = parse_command_line(
          argc, argv, "eval",
          "usage: trainrun eval --model DIR --tasks TASK.yaml|DIR [--tasks ...] [--num-fewshot N] "
          "[--limit N] [--output results.json] [--log-samples DIR]",
          opts, vm))
    return *done;
  if (a.model_dir.empty()) return command_error("eval", "--model DIR is required");
  if (a.tasks.empty()) return command_error("eval", "--tasks TASK.yaml|DIR is required");
  if (vm.count("num-fewshot")) {
    if (num_fewshot < 0) return command_error("eval", "--num-fewshot must be 0 or more");
    a.num_fewshot = num_fewshot;
  }
  if (vm.count("limit")) {
    if (limit < 1) return command_error("eval", "--limit must be at least 1");
    a.limit = limit;
  }
  if (vm.count("max-length")) {
    if (max_length < 2) return command_error("eval", "--max-length must be at least 2");
    a.max_length = max_length;
  }
  if (a.batch_size < 1) return command_error("eval", "--batch-size must be at least 1");
  return run_model_command("eval", [&] { return run_eval(a); });
}

}  // namespace trainrun::app
