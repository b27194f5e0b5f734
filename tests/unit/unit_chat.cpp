// Unit tests of the `chat` dataset's batches: masks, positions and segments of packed rows equal
// the same conversations unpacked; the held-out split is fixed by split_seed.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/plugin.hpp"

namespace trainrun::chat {
extern const trainrun_component_v1 kComponents[];
}

namespace {
using namespace trainrun;
namespace fs = std::filesystem;
using Overrides = std::map<std::string, v1::OptionValue>;

// Twelve conversations of different lengths, some multi-turn, with a system prompt in some.
fs::path write_conversations() {
  const fs::path dir = fs::temp_directory_path() / ("trainrun_unit_chat_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream f(dir / "c.jsonl");
  for (int i = 0; i < 12; ++i) {
    std::string msgs = i % 3 == 0 ? R"({"role": "system", "content": "Be brief."},)" : "";
    for (int t = 0; t <= i % 3; ++t)
      msgs += std::string(t ? "," : "") + R"({"role": "user", "content": "question )" + std::to_string(i) +
              std::string(static_cast<size_t>(i * 3), 'x') + R"("}, {"role": "assistant", "content": "answer )" +
              std::to_string(t) + std::string(static_cast<size_t>(i * 2), 'y') + R"("})";
    f << R"({"messages": [)" << msgs << "]}\n";
  }
  return dir / "c.jsonl";
}

std::unique_ptr<v1::Dataset> make(const Overrides& overrides) {
  const trainrun_component_v1& c = chat::kComponents[0];
  v1::OptionSchema schema;
  c.declare_options(&schema);
  std::map<std::string, v1::OptionValue> values;
  for (const auto& spec : schema.specs()) values[spec.name] = spec.default_value;
  static const fs::path file = write_conversations();
  values["paths"] = std::vector<std::string>{file.string()};
  values["tokenizer"] = std::string(TRAINRUN_TOKENIZER_FIXTURES) + "/qwen3";
  values["max_seq_len"] = int64_t(256);
  for (const auto& [k, v] : overrides) values[k] = v;
  v1::Options o(values, "[data] (test)");
  v1::RunContext ctx;
  ctx.rank = 1;  // quiet
  return std::unique_ptr<v1::Dataset>(static_cast<v1::Dataset*>(c.create(&o, &ctx)));
}

std::vector<int64_t> all(v1::Dataset& d, v1::Split s) {
  std::vector<int64_t> idx(static_cast<size_t>(d.size(s)));
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
  return idx;
}

// (input, target) of every conversation, as rows of a batch without padding.
std::vector<std::pair<torch::Tensor, torch::Tensor>> samples_of(const v1::Batch& b) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> out;
  for (int64_t r = 0; r < b.input.size(0); ++r) {
    const torch::Tensor seg = b.segment_ids.defined() ? b.segment_ids[r] : torch::zeros({b.input.size(1)}, torch::kLong);
    const torch::Tensor pos = b.position_ids.defined() ? b.position_ids[r] : torch::arange(b.input.size(1));
    int64_t t = 0;
    const int64_t T = b.input.size(1);
    while (t < T) {
      int64_t e = t;
      while (e < T && seg[e].item<int64_t>() == seg[t].item<int64_t>()) ++e;
      // Positions restart at 0 for each segment and count up.
      CHECK(torch::equal(pos.narrow(0, t, e - t), torch::arange(e - t)));
      out.push_back({b.input[r].narrow(0, t, e - t), b.target[r].narrow(0, t, e - t)});
      t = e;
    }
  }
  return out;
}
}  // namespace

TEST_CASE("unpacked batches: -100 where a target does not count, counts as the Batch says") {
  auto d = make({});
  const v1::Batch b = d->batch(v1::Split::Train, all(*d, v1::Split::Train));
  CHECK_FALSE(b.position_ids.defined());
  CHECK_FALSE(b.segment_ids.defined());
  CHECK(b.num_samples == 12);
  CHECK(b.num_targets == b.target.ne(v1::kIgnoreIndex).sum().item<int64_t>());
  CHECK(b.num_targets > 0);
  CHECK(b.num_targets < b.num_tokens);  // the prompts are masked
  // Every row's targets are the next inputs wherever they count.
  const torch::Tensor next = b.input.narrow(1, 1, b.input.size(1) - 1);
  const torch::Tensor tgt = b.target.narrow(1, 0, b.input.size(1) - 1);
  const torch::Tensor m = tgt.ne(v1::kIgnoreIndex);
  CHECK(torch::equal(tgt.masked_select(m), next.masked_select(m)));
}

TEST_CASE("packed rows hold the same conversations, positions restarting, targets unchanged") {
  auto packed = make({{"packing", true}, {"max_seq_len", int64_t(96)}, {"overlong", std::string("drop")}});
  auto plain96 = make({{"max_seq_len", int64_t(96)}});
  const v1::Batch p = packed->batch(v1::Split::Train, all(*packed, v1::Split::Train));
  const v1::Batch u = plain96->batch(v1::Split::Train, all(*plain96, v1::Split::Train));
  REQUIRE(p.segment_ids.defined());
  CHECK(packed->size(v1::Split::Train) < plain96->size(v1::Split::Train));
  CHECK(p.input.size(1) <= 96);
  CHECK(p.num_targets == u.num_targets);
  CHECK(p.num_tokens == u.num_tokens);
  // Each conversation of the unpacked batch (without its padding) is one segment of a packed row.
  auto packed_samples = samples_of(p);
  int found = 0;
  for (int64_t r = 0; r < u.input.size(0); ++r) {
    bool match = false;
    for (const auto& [in, tg] : packed_samples) {
      const int64_t len = in.size(0);
      if (len > u.input.size(1)) continue;
      if (torch::equal(in, u.input[r].narrow(0, 0, len)) && torch::equal(tg, u.target[r].narrow(0, 0, len)) &&
          (len == u.input.size(1) || u.target[r].narrow(0, len, u.input.size(1) - len).eq(v1::kIgnoreIndex).all().item<bool>()))
        match = true;
    }
    found += match;
  }
  CHECK(found == u.input.size(0));
}

TEST_CASE("the held-out split is fixed by split_seed") {
  auto a = make({{"validation_fraction", 0.25}, {"split_seed", int64_t(3)}});
  auto b = make({{"validation_fraction", 0.25}, {"split_seed", int64_t(3)}});
  auto c = make({{"validation_fraction", 0.25}, {"split_seed", int64_t(4)}});
  CHECK(a->size(v1::Split::Eval) == 3);
  CHECK(a->size(v1::Split::Train) == 9);
  const auto ea = a->batch(v1::Split::Eval, all(*a, v1::Split::Eval));
  const auto eb = b->batch(v1::Split::Eval, all(*b, v1::Split::Eval));
  const auto ec = c->batch(v1::Split::Eval, all(*c, v1::Split::Eval));
  CHECK(torch::equal(ea.input, eb.input));
  CHECK_FALSE((ea.input.sizes() == ec.input.sizes() && torch::equal(ea.input, ec.input)));
}
