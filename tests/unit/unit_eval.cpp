// The evaluation harness without a model (eval/include/trainrun/eval/harness.hpp): Python's
// random.sample as lm-eval's few-shot sampler draws, task files and their errors, and the
// metrics of answers given by a fake model. The cross-check against lm-eval itself, with a
// model, is tests/e2e/eval_lm_eval.py.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <filesystem>
#include <fstream>

#include "trainrun/error.hpp"
#include "trainrun/eval/decoder_model.hpp"
#include "trainrun/eval/harness.hpp"

namespace fs = std::filesystem;
using trainrun::eval::Json;
using trainrun::eval::PythonRandom;
using trainrun::eval::Request;
namespace eval = trainrun::eval;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("unit_eval_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return path / name;
  }
};

// Answers every loglikelihood request with minus the continuation's length (so the shortest
// choice wins acc, and acc_norm sees -1 per character for every choice: the first wins), and
// every generation with "Answer: 42".
struct FakeModel : trainrun::eval::LanguageModel {
  void loglikelihood(const std::vector<Request*>& rs) override {
    for (Request* r : rs) {
      r->loglikelihood = -static_cast<double>(r->continuation.size());
      r->is_greedy = r->continuation.size() < 4;
    }
  }
  void loglikelihood_rolling(const std::vector<Request*>& rs) override {
    for (Request* r : rs) r->loglikelihood = -2.0 * static_cast<double>(r->continuation.size());
  }
  void generate_until(const std::vector<Request*>& rs) override {
    for (Request* r : rs) r->text = " Answer: 42";
  }
};

}  // namespace

TEST_CASE("PythonRandom draws what CPython 3.11's random.Random(seed).sample draws") {
  // Reference: python3 -c "import random; r = random.Random(1234); print(r.sample(range(50), 5),
  // r.sample(range(50), 4))" and the other seeds below, on Debian 12's CPython 3.11.2.
  PythonRandom r(1234);
  CHECK(r.sample(50, 5) == std::vector<int64_t>{49, 28, 7, 0, 5});
  CHECK(r.sample(50, 4) == std::vector<int64_t>{37, 2, 42, 44});
  CHECK(PythonRandom(1234).sample(10, 4) == std::vector<int64_t>{7, 1, 0, 9});
  // k > 5 and a population above the set size: the rejection branch.
  CHECK(PythonRandom(0).sample(100, 8) == std::vector<int64_t>{49, 97, 53, 5, 33, 65, 62, 51});
  // A seed over 32 bits is two key words.
  CHECK(PythonRandom((uint64_t{1} << 40) + 7).sample(3, 3) == std::vector<int64_t>{2, 1, 0});
  PythonRandom g(1234);
  CHECK(g.genrand_uint32() == 4150886329u);
  CHECK(g.genrand_uint32() == 3342196574u);
  CHECK_THROWS_AS(PythonRandom(1).sample(3, 4), std::invalid_argument);
}

TEST_CASE("trailing whitespace as str.rstrip() sees it") {
  CHECK(trainrun::eval::trailing_whitespace_bytes("Answer: ") == 1);
  CHECK(trainrun::eval::trailing_whitespace_bytes("a\n\t ") == 3);
  CHECK(trainrun::eval::trailing_whitespace_bytes("a\xc2\xa0") == 2);      // U+00A0
  CHECK(trainrun::eval::trailing_whitespace_bytes("a\xe3\x80\x80") == 3);  // U+3000
  CHECK(trainrun::eval::trailing_whitespace_bytes("caf\xc3\xa9") == 0);
  CHECK(trainrun::eval::trailing_whitespace_bytes("") == 0);
}

TEST_CASE("a multiple-choice task: prompts, few-shot examples and metrics") {
  TempDir d;
  d.write("test.jsonl",
          "{\"q\": \"Two plus two\", \"choices\": [\"four\", \"five\", \"no\"], \"label\": 0}\n"
          "{\"q\": \"Sky colour\", \"choices\": [\"blue\", \"red\"], \"label\": 1}\n");
  d.write("train.jsonl", "{\"q\": \"One\", \"choices\": [\"a\", \"b\"], \"label\": 1}\n");
  const fs::path yaml = d.write("mc.yaml",
                                "task: mc\n"
                                "dataset_path: json\n"
                                "dataset_kwargs:\n  data_files:\n    test: test.jsonl\n"
                                "    train: train.jsonl\n"
                                "test_split: test\nfewshot_split: train\nnum_fewshot: 1\n"
                                "output_type: multiple_choice\n"
                                "doc_to_text: \"Q: {{q}}\\nA:\"\n"
                                "doc_to_choice: choices\ndoc_to_target: label\n"
                                "description: \"Answer.\\n\\n\"\n"
                                "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
                                "  - metric: exact_match\n"
                                "metadata:\n  version: 2.0\n");
  std::vector<trainrun::eval::Task> tasks;
  tasks.push_back(trainrun::eval::Task::load(yaml, {}));
  FakeModel lm;
  Json samples = Json::object();
  const Json r = trainrun::eval::evaluate(tasks, lm, &samples);
  const Json& s0 = samples["mc"][0];
  // description, the one example with its answer, then the document.
  CHECK(s0["arguments"]["gen_args_0"]["arg_0"] == "Answer.\n\nQ: One\nA: b\n\nQ: Two plus two\nA:");
  CHECK(s0["arguments"]["gen_args_1"]["arg_1"] == " five");
  // doc 0: lls -5, -5, -3 -> acc picks "no" (wrong); acc_norm -5/4, -5/4, -3/2 -> the first
  // of the tie, "four" (right). doc 1: lls -5, -4 -> acc "red" (right); acc_norm -5/4, -4/3 ->
  // "blue" (wrong).
  CHECK(r["results"]["mc"]["acc,none"].get<double>() == doctest::Approx(0.5));
  CHECK(r["results"]["mc"]["acc_norm,none"].get<double>() == doctest::Approx(0.5));
  CHECK(samples["mc"][0]["acc"] == 0.0);
  CHECK(samples["mc"][0]["acc_norm"] == 1.0);
  // exact_match: the gold continuation is greedy (shorter than 4 bytes): " four" no, " red" no.
  CHECK(r["results"]["mc"]["exact_match,none"].get<double>() == doctest::Approx(0.0));
  CHECK(r["results"]["mc"]["acc_stderr,none"].get<double>() == doctest::Approx(0.5));
  CHECK(r["versions"]["mc"] == 2.0);
  CHECK(r["n-shot"]["mc"] == 1);
  CHECK(r["n-samples"]["mc"]["effective"] == 2);
}

TEST_CASE("generate-until with a regex filter, and rolling perplexity") {
  TempDir d;
  d.write("g.jsonl", "{\"q\": \"x\", \"a\": \"42\"}\n{\"q\": \"y\", \"a\": \"41\"}\n");
  d.write("p.jsonl", "{\"text\": \"one two  three\"}\n");
  const fs::path g = d.write("g.yaml",
                             "task: gen\ndataset_path: json\n"
                             "dataset_kwargs: {data_files: {test: g.jsonl}}\ntest_split: test\n"
                             "output_type: generate_until\ndoc_to_text: \"{{q}}\"\n"
                             "doc_to_target: \"{{a}}\"\n"
                             "filter_list:\n  - name: num\n    filter:\n"
                             "      - {function: regex, regex_pattern: \"(\\\\d+)\"}\n"
                             "      - {function: take_first}\n"
                             "metric_list:\n  - metric: exact_match\n");
  const fs::path p = d.write("p.yaml",
                             "task: ppl\ndataset_path: json\n"
                             "dataset_kwargs: {data_files: {test: p.jsonl}}\ntest_split: test\n"
                             "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\n"
                             "doc_to_target: \"{{text}}\"\n");
  std::vector<trainrun::eval::Task> tasks;
  tasks.push_back(trainrun::eval::Task::load(g, {}));
  tasks.push_back(trainrun::eval::Task::load(p, {}));
  FakeModel lm;
  const Json r = trainrun::eval::evaluate(tasks, lm);
  CHECK(r["results"]["gen"]["exact_match,num"].get<double>() == doctest::Approx(0.5));
  // 14 bytes, 3 words (re.split on runs of whitespace), log-likelihood -28.
  CHECK(r["results"]["ppl"]["word_perplexity,none"].get<double>() ==
        doctest::Approx(std::exp(28.0 / 3)));
  CHECK(r["results"]["ppl"]["byte_perplexity,none"].get<double>() ==
        doctest::Approx(std::exp(2.0)));
  CHECK(r["results"]["ppl"]["bits_per_byte,none"].get<double>() ==
        doctest::Approx(2.0 / std::log(2.0)));
  CHECK(r["results"]["ppl"]["bits_per_byte_stderr,none"] == "N/A");
}

TEST_CASE("bad task files name the file and what is wrong") {
  TempDir d;
  d.write("t.jsonl", "{\"q\": \"x\"}\n");
  auto err = [&](const std::string& body) {
    const fs::path y = d.write("bad.yaml",
                               "task: bad\ndataset_path: json\n"
                               "dataset_kwargs: {data_files: {test: t.jsonl}}\n"
                               "test_split: test\n" +
                                   body);
    try {
      std::vector<trainrun::eval::Task> tasks;
      tasks.push_back(trainrun::eval::Task::load(y, {}));
      FakeModel lm;
      trainrun::eval::evaluate(tasks, lm);
    } catch (const trainrun::v1::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string unknown_type = err("output_type: ranking\n");
  CHECK(unknown_type.find("bad.yaml") != std::string::npos);
  CHECK(unknown_type.find("output_type `ranking`") != std::string::npos);
  CHECK(err("output_type: generate_until\ndoc_to_text: q\ndoc_to_target: q\n"
            "metric_list:\n  - metric: bleu\n")
            .find("unknown metric `bleu`") != std::string::npos);
  CHECK(err("output_type: generate_until\ndoc_to_text: \"{{question}}\"\ndoc_to_target: q\n")
            .find("refers to `question`, which the document does not have (its fields: q)") !=
        std::string::npos);
  CHECK(err("output_type: generate_until\ndoc_to_text: !function utils.doc_to_text\n")
            .find("cannot be run by trainrun eval") != std::string::npos);
  CHECK(err("output_type: generate_until\nprocess_results: x\n").find("`process_results`") !=
        std::string::npos);
  CHECK_THROWS_AS(trainrun::eval::task_files(d.path / "missing"), trainrun::v1::ConfigError);
}

// ShardedLanguageModel at world sizes 1-4, the ranks as threads whose sum is a rendezvous:
// every request answered exactly once (by the rank whose share holds it), every answer on every
// rank afterwards, texts byte for byte (UTF-8, NUL and 0xFF bytes included).
namespace {

struct Answering : eval::LanguageModel {
  std::vector<std::string> seen;
  void loglikelihood(const std::vector<eval::Request*>& rs) override {
    for (auto* r : rs) {
      seen.push_back(r->context);
      r->loglikelihood = -0.5 - static_cast<double>(r->context.size());
      r->is_greedy = r->context.size() % 2 == 0;
    }
  }
  void loglikelihood_rolling(const std::vector<eval::Request*>& rs) override {
    for (auto* r : rs) {
      seen.push_back(r->continuation);
      r->loglikelihood = -1e-7 * static_cast<double>(r->continuation.size());
    }
  }
  void generate_until(const std::vector<eval::Request*>& rs) override {
    for (auto* r : rs) {
      seen.push_back(r->context);
      r->text = r->context.empty() ? std::string() : r->context + std::string("\0\xff\xc3\xa9", 4);
    }
  }
};

// Element-wise sums over `world` threads: each adds its vector, the last one in publishes.
class Rendezvous {
 public:
  explicit Rendezvous(int world) : world_(world) {}
  void sum(std::vector<double>& v) {
    std::unique_lock<std::mutex> lk(mu_);
    const int64_t round = round_;
    if (acc_.empty()) acc_.assign(v.size(), 0.0);
    CHECK(acc_.size() == v.size());
    for (size_t i = 0; i < v.size(); ++i) acc_[i] += v[i];
    if (++arrived_ == world_) {
      result_ = acc_;
      acc_.clear();
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return round_ != round; });
    }
    v = result_;
  }

 private:
  int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<double> acc_, result_;
  int arrived_ = 0;
  int64_t round_ = 0;
};

void ask(eval::LanguageModel& lm, eval::Request::Type type, const std::vector<eval::Request*>& rs) {
  if (type == eval::Request::Type::loglikelihood)
    lm.loglikelihood(rs);
  else if (type == eval::Request::Type::loglikelihood_rolling)
    lm.loglikelihood_rolling(rs);
  else
    lm.generate_until(rs);
}

std::vector<eval::Request> requests(eval::Request::Type type, int n) {
  std::vector<eval::Request> out;
  for (int i = 0; i < n; ++i) {
    eval::Request r;
    r.type = type;
    r.context = std::string(static_cast<size_t>(1 + (i * 37) % 23), 'a' + i % 26);
    if (i % 5 == 3) r.context.clear();
    r.continuation = std::string(static_cast<size_t>(i % 7 == 0 ? 300 : 3), 'x');
    out.push_back(r);
  }
  return out;
}

}  // namespace

TEST_CASE("ShardedLanguageModel: every request answered once, every answer on every rank") {
  for (int world = 1; world <= 4; ++world)
    for (auto type :
         {eval::Request::Type::loglikelihood, eval::Request::Type::loglikelihood_rolling,
          eval::Request::Type::generate_until}) {
      CAPTURE(world);
      CAPTURE(static_cast<int>(type));
      const int n = 41;
      std::vector<std::vector<eval::Request>> per_rank(static_cast<size_t>(world),
                                                       requests(type, n));
      std::vector<Answering> inner(static_cast<size_t>(world));
      std::vector<int64_t> answered(static_cast<size_t>(world), 0);
      Rendezvous rv(world);
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
          std::vector<eval::Request*> ptrs;
          for (auto& q : per_rank[static_cast<size_t>(r)]) ptrs.push_back(&q);
          eval::ShardedLanguageModel lm(inner[static_cast<size_t>(r)], r, world,
                                        [&](std::vector<double>& v) { rv.sum(v); });
          ask(lm, type, ptrs);
          answered[static_cast<size_t>(r)] = lm.answered();
        });
      for (auto& t : threads) t.join();
      int64_t total = 0;
      for (int r = 0; r < world; ++r) {
        total += answered[static_cast<size_t>(r)];
        CHECK(answered[static_cast<size_t>(r)] > 0);
      }
      CHECK(total == n);
      Answering whole;
      std::vector<eval::Request> want = requests(type, n);
      std::vector<eval::Request*> ptrs;
      for (auto& q : want) ptrs.push_back(&q);
      ask(whole, type, ptrs);
      for (int r = 0; r < world; ++r)
        for (int i = 0; i < n; ++i) {
          const eval::Request& got = per_rank[static_cast<size_t>(r)][static_cast<size_t>(i)];
          CHECK(got.loglikelihood == want[static_cast<size_t>(i)].loglikelihood);
          CHECK(got.is_greedy == want[static_cast<size_t>(i)].is_greedy);
          CHECK(got.text == want[static_cast<size_t>(i)].text);
        }
    }
}
