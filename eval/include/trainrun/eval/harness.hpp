#pragma once
// The evaluation harness of `trainrun eval`: tasks written in lm-evaluation-harness's YAML task
// format (EleutherAI lm-eval 0.4.13, lm_eval/config/task.py and api/task.py: ConfigurableTask),
// turned into the requests lm-eval makes of a model (loglikelihood, loglikelihood_rolling,
// generate_until), and the model's answers turned into lm-eval's per-sample metrics and
// aggregates, so that a results file reads like lm-eval's. The model side is LanguageModel,
// implemented by the CLI over a model plugin; this library does not use LibTorch.
//
// What a task may say (anything else is refused, naming the file and key): task, task_alias,
// tag, include (a YAML file relative to this one, overridden by this one), dataset_path (json or
// csv) with dataset_kwargs.data_files (split -> local file), training/validation/test_split,
// fewshot_split, fewshot_config (sampler default|first_n, split, doc_to_* overrides),
// doc_to_text/doc_to_target/doc_to_choice (a document field, a Jinja template rendered as
// lm-eval's StrictUndefined environment does, a list, an int), description, target_delimiter,
// fewshot_delimiter, num_fewshot, output_type (multiple_choice, loglikelihood,
// loglikelihood_rolling, generate_until), generation_kwargs (until, max_gen_toks,
// max_new_tokens, do_sample false, temperature 0), metric_list (acc, acc_norm, acc_bytes,
// exact_match, perplexity, word_perplexity, byte_perplexity, bits_per_byte; aggregation and
// higher_is_better; exact_match's ignore_case/ignore_punctuation/ignore_numbers/
// regexes_to_ignore), filter_list (regex, take_first, remove_whitespace, lowercase, uppercase),
// repeats 1, metadata (version). Python functions (`!function`) cannot be run and are refused.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace trainrun::eval {

using Json = nlohmann::ordered_json;

/// One request of a document to the model, and the model's answer. As lm-eval's Instance.
struct Request {
  enum class Type { loglikelihood, loglikelihood_rolling, generate_until };
  Type type = Type::loglikelihood;
  /// loglikelihood: the context and the continuation scored after it. loglikelihood_rolling: the
  /// whole text in `continuation`. generate_until: the prompt in `context`.
  std::string context, continuation;
  /// generate_until: stop strings (the EOS token's text is added by the model) and the new
  /// tokens at most (lm-eval's max_gen_toks, default 256).
  std::vector<std::string> until;
  int64_t max_gen_toks = 256;
  /// lm-eval's generation_kwargs as the task gave them (kept for the sample log).
  Json gen_kwargs = Json::object();

  // The answer, filled by LanguageModel.
  /// Sum of the continuation's token log-probabilities (natural log), float64.
  double loglikelihood = 0;
  /// Every continuation token is the arg-max of its position's logits.
  bool is_greedy = false;
  /// generate_until: the completion, cut before the first stop string.
  std::string text;
};

/// The model as the harness sees it (lm-eval's LM). Each call answers every request in place;
/// the order of the calls' requests is the tasks' order, documents in order.
class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual void loglikelihood(const std::vector<Request*>& requests) = 0;
  virtual void loglikelihood_rolling(const std::vector<Request*>& requests) = 0;
  virtual void generate_until(const std::vector<Request*>& requests) = 0;
};

/// What the command line overrides in every task.
struct TaskOptions {
  /// Overrides the tasks' num_fewshot (lm-eval's --num_fewshot).
  std::optional<int64_t> num_fewshot;
  /// The first N documents of each task (lm-eval's --limit with an integer).
  std::optional<int64_t> limit;
  /// Seed of the few-shot sampler (lm-eval's --fewshot_random_seed, default 1234): the same
  /// examples as lm-eval for each document.
  int64_t fewshot_seed = 1234;
};

struct TaskConfig;
struct DocRequests;

/// One task: its configuration, documents and, after run(), its per-document results.
class Task {
 public:
  /// Reads the YAML task file `file` and its data files. Throws v1::ConfigError naming the file
  /// and key (or data file and line) for anything it cannot read or does not support.
  static Task load(const std::filesystem::path& file, const TaskOptions& options);
  Task(Task&&) noexcept;
  Task& operator=(Task&&) noexcept;
  ~Task();

  const std::string& name() const;
  /// The requests of every document (after --limit), built as lm-eval builds them: few-shot
  /// context, then one request per choice (multiple choice) or one request. Throws
  /// v1::ConfigError for a template or field that does not work on a document, naming both.
  std::vector<DocRequests>& build();

  /// After the model answered build()'s requests: the filters, per-sample metrics and
  /// aggregates. `results` gets results[name] (lm-eval's "<metric>,<filter>" keys and
  /// "<metric>_stderr,<filter>"), and the task's versions, n-shot, higher_is_better, n-samples
  /// and config entries. `samples` (when given) gets one JSON object per document.
  void score(Json& results, std::vector<Json>* samples);

 private:
  Task();
  std::unique_ptr<TaskConfig> config_;
  std::unique_ptr<std::vector<DocRequests>> docs_;
};

/// One document's requests.
struct DocRequests {
  int64_t doc_id = 0;
  Json doc;
  /// doc_to_target and (tasks with doc_to_choice) doc_to_choice of the document, rendered once
  /// by build() for the requests and the metrics.
  Json target;
  std::vector<std::string> choices;
  std::vector<Request> requests;
};

/// The YAML task files a tasks path names: the file itself, or every *.yaml / *.yml file of a
/// directory (sorted by name, not recursive). Throws v1::ConfigError naming the path (and, for a
/// relative one that is not there, the working directory it was looked for in) when none is
/// there.
std::vector<std::filesystem::path> task_files(const std::filesystem::path& path);

/// Writes evaluate()'s results to `file` (indented JSON, as lm-eval's results file; none when
/// `file` is empty) and, when
/// `samples_dir` is not empty, each task's per-document objects of `samples` to
/// `samples_dir/samples_TASK.jsonl`; each file written whole to a temporary name, then renamed.
/// Creates the directories. Throws v1::ConfigError naming a file that cannot be written.
void write_results(const std::filesystem::path& file, const Json& results,
                   const std::filesystem::path& samples_dir = {}, const Json& samples = {});

/// Runs `tasks` on `lm`, lm-eval's evaluator: every task's requests built, the model asked once
/// per request type over all tasks, then scored. Returns {"results", "versions", "n-shot",
/// "higher_is_better", "n-samples", "config"} (the caller adds the model's description to
/// "config"); `samples` gets each task's per-document objects (keyed by task name).
Json evaluate(std::vector<Task>& tasks, LanguageModel& lm, Json* samples = nullptr);

/// Bytes of the whitespace UTF-8 `s` ends with, as Python's str.rstrip() strips it (Unicode
/// whitespace): lm-eval moves a context's trailing whitespace to its continuation.
size_t trailing_whitespace_bytes(const std::string& s);

/// Python's random.Random(seed).sample(range(n), k) (CPython 3.11 / 3.12: MT19937 seeded with
/// init_by_array, _randbelow by rejection, sample's pool or set branch): the indices lm-eval's
/// ContextSampler draws. Exposed for the unit tests.
class PythonRandom {
 public:
  explicit PythonRandom(uint64_t seed);
  std::vector<int64_t> sample(int64_t n, int64_t k);
  uint32_t genrand_uint32();

 private:
  uint32_t getrandbits(int k);
  int64_t randbelow(int64_t n);
  uint32_t mt_[624];
  int mti_ = 625;
};

}  // namespace trainrun::eval
