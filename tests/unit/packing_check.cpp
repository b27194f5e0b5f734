// Packed batches (Batch's ABI 1.6 position_ids / segment_ids) give every sample the loss it gets
// alone (issue 22, done-when 3a): gpt, llama (Qwen3-style, GQA) and llama with Mistral's sliding
// window, on samples of different lengths with masked (-100) targets. Each sample's loss in the
// packed batch is the forward's loss_sum with every other target ignored; unpacked, the sample
// runs alone in a batch without the 1.6 fields. Without segment/position ids the packed losses
// must differ (the check can fail).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "models/llama/llama.hpp"
#include "test_options.hpp"
#include "trainrun/plugin.hpp"

namespace trainrun::models {
extern const trainrun_component_v1 kComponents[];
}

namespace {
using namespace trainrun;
using v1::Batch;

const int64_t kVocab = 64;
const std::vector<int64_t> kRows[] = {{7, 12, 3}, {9, 15}};  // sample lengths per packed row
const int64_t kT = 24;

struct Sample {
  torch::Tensor input, target;  // [n]
};

std::vector<Sample> make_samples() {
  torch::manual_seed(5);
  std::vector<Sample> out;
  for (const auto& row : kRows)
    for (int64_t n : row) {
      Sample s{torch::randint(kVocab, {n}, torch::kLong), torch::randint(kVocab, {n}, torch::kLong)};
      // The prompt part of a chat sample: the first third of the targets do not count.
      s.target.narrow(0, 0, n / 3).fill_(v1::kIgnoreIndex);
      out.push_back(s);
    }
  return out;
}

// The packed batch with only sample `only`'s targets counted (-1: all); fields = false leaves
// out position_ids and segment_ids (what a model that ignores them would see).
Batch packed(const std::vector<Sample>& samples, int only, bool fields) {
  Batch b;
  const int64_t B = 2;
  b.input = torch::zeros({B, kT}, torch::kLong);
  b.target = torch::full({B, kT}, v1::kIgnoreIndex, torch::kLong);
  b.position_ids = torch::zeros({B, kT}, torch::kLong);
  b.segment_ids = torch::zeros({B, kT}, torch::kLong);
  int k = 0;
  for (int64_t r = 0; r < B; ++r) {
    int64_t t = 0, seg = 0;
    for (int64_t n : kRows[r]) {
      b.input[r].narrow(0, t, n).copy_(samples[k].input);
      if (only < 0 || only == k) b.target[r].narrow(0, t, n).copy_(samples[k].target);
      b.position_ids[r].narrow(0, t, n).copy_(torch::arange(n));
      b.segment_ids[r].narrow(0, t, n).fill_(seg++);
      t += n, ++k;
    }
    b.position_ids[r].narrow(0, t, kT - t).copy_(torch::arange(kT - t));
    b.segment_ids[r].narrow(0, t, kT - t).fill_(seg);
  }
  if (!fields) b.position_ids = b.segment_ids = torch::Tensor();
  b.num_samples = B;
  b.num_targets = b.target.ne(v1::kIgnoreIndex).sum().item<int64_t>();
  return b;
}

Batch alone(const Sample& s) {
  Batch b;
  b.input = s.input.unsqueeze(0);
  b.target = s.target.unsqueeze(0);
  b.num_samples = 1;
  b.num_targets = s.target.ne(v1::kIgnoreIndex).sum().item<int64_t>();
  return b;
}

// Largest relative difference between each sample's packed and unpacked loss.
double compare(v1::Model& m, const std::string& label, bool fields) {
  torch::NoGradGuard ng;
  m.train(false);
  const std::vector<Sample> samples = make_samples();
  double worst = 0;
  for (int k = 0; k < static_cast<int>(samples.size()); ++k) {
    const double p = m.forward(packed(samples, k, fields)).loss_sum.item<double>();
    const double u = m.forward(alone(samples[k])).loss_sum.item<double>();
    worst = std::max(worst, std::abs(p - u) / std::max(std::abs(u), 1e-12));
  }
  // The whole packed batch's loss is the sum of the samples' losses.
  std::cout << label << (fields ? "" : " (without position/segment ids)") << ": max relative difference "
            << worst << " over " << samples.size() << " samples" << std::endl;
  return worst;
}

v1::RunContext lm_context() {
  v1::RunContext ctx;
  ctx.data.task = "language_modeling";
  ctx.data.sample_shape = {kT};
  ctx.data.vocab_size = kVocab;
  return ctx;
}

std::unique_ptr<v1::Model> gpt() {
  const trainrun_component_v1& c = models::kComponents[2];
  REQUIRE(std::string(c.name) == "gpt");
  v1::OptionSchema schema;
  c.declare_options(&schema);
  std::map<std::string, v1::OptionValue> values;
  for (const auto& spec : schema.specs()) values[spec.name] = spec.default_value;
  values["n_layer"] = int64_t(2), values["n_head"] = int64_t(2), values["n_embd"] = int64_t(32);
  values["block_size"] = kT;
  v1::Options o(values, "[model] (test)");
  const v1::RunContext ctx = lm_context();
  torch::manual_seed(1);
  return std::unique_ptr<v1::Model>(static_cast<v1::Model*>(c.create(&o, &ctx)));
}

std::unique_ptr<v1::Model> make_llama(const std::string& type, int64_t window) {
  std::map<std::string, v1::OptionValue> o = {
      {"model_type", type}, {"vocab_size", kVocab}, {"hidden_size", int64_t(32)},
      {"intermediate_size", int64_t(64)}, {"num_hidden_layers", int64_t(2)},
      {"num_attention_heads", int64_t(4)}, {"num_key_value_heads", int64_t(2)}, {"save_hf", false}};
  if (window > 0) o["sliding_window"] = window;
  torch::manual_seed(1);
  return std::make_unique<llama::LlamaModel>(test::make_options<llama::LlamaModel>(o), lm_context());
}

}  // namespace

TEST_CASE("gpt: packed losses equal unpacked") {
  auto m = gpt();
  CHECK(compare(*m, "gpt", true) <= 1e-5);
  CHECK(compare(*m, "gpt", false) > 1e-3);
}

TEST_CASE("llama (qwen3, GQA): packed losses equal unpacked") {
  auto m = make_llama("qwen3", 0);
  CHECK(compare(*m, "llama qwen3", true) <= 1e-5);
  CHECK(compare(*m, "llama qwen3", false) > 1e-3);
}

TEST_CASE("llama (mistral, sliding window 5): packed losses equal unpacked") {
  auto m = make_llama("mistral", 5);
  CHECK(compare(*m, "llama mistral window 5", true) <= 1e-5);
  CHECK(compare(*m, "llama mistral window 5", false) > 1e-3);
}

TEST_CASE("a model told the batch fields are unavailable ignores them") {
  auto m = gpt();
  auto* reader = dynamic_cast<v1::BatchFieldsReader*>(m.get());
  REQUIRE(reader != nullptr);
  reader->set_batch_fields_available(false);
  torch::NoGradGuard ng;
  m->train(false);
  const std::vector<Sample> samples = make_samples();
  const double with = m->forward(packed(samples, -1, true)).loss_sum.item<double>();
  const double without = m->forward(packed(samples, -1, false)).loss_sum.item<double>();
  CHECK(with == without);
}
