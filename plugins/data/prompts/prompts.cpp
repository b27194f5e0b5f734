// Dataset `prompts` (ABI 1.12, DataInfo::task "prompts"): the prompts an online objective (GRPO)
// generates from, read as TRL 1.16's GRPOTrainer reads its "prompt" column.
//
// Rows. JSONL, one object per line, with "prompt": a string (standard: tokenized with the
// tokenizer's special tokens, e.g. a BOS token, as TRL 1.16's GRPOTrainer calls its processing
// class on the text) or a non-empty list of {"role", "content"} messages (conversational:
// rendered with the chat template and its generation prompt, then tokenized without special
// tokens, as apply_chat_template(add_generation_prompt=True, tokenize=True); a row's "tools" and
// "chat_template_kwargs" reach the template, as TRL's trainer-wide tools and
// chat_template_kwargs do). Every other field travels with the prompt to the rewards
// (RewardSample::row), e.g. the reference answer an accuracy reward compares with.
//
// A prompt longer than max_prompt_length tokens is an error naming its row (overlong = "error",
// the default), or left out (overlong = "drop", counted at start). TRL would cut it from the
// left, which changes the question a reward checks the answer of.
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <array>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dataset_setup.hpp"
#include "preference_samples.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/plugin.hpp"
#include "trainrun/rollout.hpp"
#include <trainrun/json_depth.hpp>
#include <trainrun/log.hpp>

namespace trainrun::prompts {

using json = nlohmann::ordered_json;
using v1::Batch;
using v1::ConfigError;
using v1::Split;

// One prompt as read and tokenized.
struct Prompt {
  std::string where;  // FILE:LINE
  int64_t row_index = 0;
  std::string row;  // the record, compact JSON
  std::string text;
  std::vector<int64_t> ids;
  bool conversational = false;
};

namespace {

// EOS ids as transformers' generate() takes them: generation_config.json's eos_token_id, else
// config.json's (an int or a list), plus the tokenizer's eos_token.
std::vector<int64_t> generation_eos_ids(const std::string& dir, const text::Tokenizer& tok) {
  std::set<int64_t> out;
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::filesystem::path p = std::filesystem::path(dir) / name;
    std::ifstream f(p);
    if (!f) continue;
    json j;
    try {
      j = json::parse(f);
    } catch (const json::exception& e) {
      throw ConfigError(p.string() + ": not valid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("eos_token_id")) continue;
    const json& v = j["eos_token_id"];
    if (v.is_number_integer()) out.insert(v.get<int64_t>());
    for (const auto& e : v.is_array() ? v : json::array()) {
      if (!e.is_number_integer())
        throw ConfigError(p.string() + ": \"eos_token_id\" holds " + e.dump());
      out.insert(e.get<int64_t>());
    }
    break;
  }
  if (auto e = tok.eos_token_id()) out.insert(*e);
  return {out.begin(), out.end()};
}

}  // namespace

/// Prompt rows for GRPO; see the top of this file.
class PromptDataset final : public v1::Dataset, public v1::PromptSource {
 public:
  static void declare_options(v1::OptionSchema& s) {
    preference::declare_source_options(
        s,
        "JSONL files (or glob(3) patterns) of rows {\"prompt\": a string or a list of "
        "{\"role\", \"content\"} messages, any other fields}: the other fields reach the rewards "
        "(e.g. the reference answer of an accuracy reward)",
        "prompts", "conversational prompts");
    s.integer("max_prompt_length", 512,
              "tokens per prompt at most (after the chat template); a longer one is an error or "
              "left out (overlong)",
              1, 1 << 24);
    s.choice("overlong", "error", {"error", "drop"},
             "a prompt longer than max_prompt_length: an error naming its row, or left out "
             "(counted at start)");
    preference::declare_split_options(s, "prompts");
  }

  PromptDataset(const v1::Options& o, const v1::RunContext& ctx) {
    const std::string context = o.context();
    const preference::Sources sources = preference::read_sources(o);
    const std::string dir = o.get_string("tokenizer");
    tok_ = std::make_unique<text::Tokenizer>(text::Tokenizer::from_directory(dir));
    eos_ = generation_eos_ids(dir, *tok_);
    pad_ = tok_->pad_token_id().value_or(tok_->eos_token_id().value_or(0));
    const int64_t max_len = o.get_int("max_prompt_length");
    const bool drop = o.get_string("overlong") == "drop";

    std::unique_ptr<text::ChatTemplate> tmpl;
    std::vector<int64_t> kept[2];
    int64_t dropped = 0, longest = 0, conversational = 0;
    for (int k = 0; k < 2; ++k) {
      const auto& files = k == 0 ? sources.files : sources.eval_files;
      int64_t index = 0;
      preference::for_each_jsonl_line(files, context, [&](const json& rec, preference::Row r) {
        Prompt p = read_prompt(rec, r, o, dir, tmpl);
        p.row_index = index++;
        conversational += p.conversational ? 1 : 0;
        if (static_cast<int64_t>(p.ids.size()) > max_len) {
          TR_CHECK_TYPED(ConfigError, drop, p.where, ": the prompt has ", p.ids.size(),
                         " tokens, more than ", context, " max_prompt_length = ", max_len,
                         " (raise it, or overlong = \"drop\" leaves such prompts out)");
          ++dropped;
          return;
        }
        longest = std::max(longest, static_cast<int64_t>(p.ids.size()));
        kept[k].push_back(static_cast<int64_t>(prompts_.size()));
        prompts_.push_back(std::move(p));
      });
    }
    TR_CHECK_TYPED(ConfigError, !kept[0].empty(), context, ": no prompt is left to train on (",
                   dropped, " longer than max_prompt_length = ", max_len, ")");
    TR_CHECK_TYPED(ConfigError, sources.eval_files.empty() || !kept[1].empty(), context,
                   ": the files in eval_paths hold no prompt");
    members_ = preference::split_members(
        kept, sources, static_cast<uint64_t>(o.get_int("split_seed")), context, "prompt");
    info_.task = "prompts";
    info_.sample_shape = {longest};
    info_.vocab_size = tok_->vocab_size();
    if (ctx.rank == 0) {
      std::ostringstream os;
      os << prompts_.size() + static_cast<size_t>(dropped) << " prompts (" << conversational
         << " conversational";
      if (tmpl) os << ", template " << tmpl->origin();
      os << "), longest " << longest << " tokens; " << dropped << " longer than "
         << "max_prompt_length = " << max_len << " dropped; " << members_[0].size() << " train / "
         << members_[1].size() << " held out; EOS ids";
      for (int64_t e : eos_) os << " " << e;
      v1::Logger("prompts", ctx.rank).info(os.str());
    }
  }

  v1::DataInfo info() const override { return info_; }
  int64_t size(Split split) const override { return static_cast<int64_t>(members(split).size()); }

  /// The prompts right-padded, no target (the training loop does not read it; `trainrun check`
  /// may, for shapes).
  Batch batch(Split split, const std::vector<int64_t>& indices) override {
    int64_t T = 1;
    for (int64_t i : indices) T = std::max(T, static_cast<int64_t>(at(split, i).ids.size()));
    const int64_t B = static_cast<int64_t>(indices.size());
    torch::Tensor input = torch::full({B, T}, pad_, torch::kLong);
    auto in = input.accessor<int64_t, 2>();
    Batch b;
    for (int64_t r = 0; r < B; ++r) {
      const auto& ids = at(split, indices[static_cast<size_t>(r)]).ids;
      for (size_t t = 0; t < ids.size(); ++t) in[r][static_cast<int64_t>(t)] = ids[t];
      b.num_tokens += static_cast<int64_t>(ids.size());
    }
    b.input = input;
    b.target = torch::full({B, T}, v1::kIgnoreIndex, torch::kLong);
    b.num_samples = B;
    return b;
  }

  v1::PromptSample prompt(Split split, int64_t index) const override {
    const Prompt& p = at(split, index);
    return {p.ids, p.text, p.row, p.row_index};
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    return tok_->decode(std::vector<int32_t>(ids.begin(), ids.end()), /*skip_special_tokens=*/true);
  }
  std::vector<int64_t> eos_token_ids() const override { return eos_; }
  int64_t pad_token_id() const override { return pad_; }

 private:
  // A row's prompt, rendered and tokenized; the template is loaded at the first conversation.
  Prompt read_prompt(const json& rec, const preference::Row& r, const v1::Options& o,
                     const std::string& dir, std::unique_ptr<text::ChatTemplate>& tmpl) const {
    Prompt p;
    p.where = r.where();
    p.row = rec.dump();
    const auto it = rec.find("prompt");
    TR_CHECK_TYPED(ConfigError, it != rec.end(), p.where,
                   ": the row has no \"prompt\" (a string or a list of messages)");
    if (it->is_string()) {
      p.text = it->get<std::string>();
      TR_CHECK_TYPED(ConfigError, !p.text.empty(), p.where, ": \"prompt\" is empty");
    } else {
      preference::check_messages(*it, "prompt", p.where);
      preference::Row row = r;
      preference::read_chat_extras(rec, row);
      if (!tmpl) tmpl = preference::load_template_for(o, dir, p.where);
      text::ChatTemplateOptions opts;
      opts.tools = row.tools;
      opts.variables = row.template_kwargs;
      opts.add_generation_prompt = true;
      try {
        p.text = tmpl->apply(*it, opts).text;
      } catch (const std::exception& e) {
        throw ConfigError(p.where + ": chat template: " + e.what());
      }
      p.conversational = true;
    }
    const std::vector<int32_t> ids = tok_->encode(p.text, /*add_special_tokens=*/!p.conversational);
    p.ids.assign(ids.begin(), ids.end());
    TR_CHECK_TYPED(ConfigError, !p.ids.empty(), p.where, ": the prompt tokenizes to no token");
    return p;
  }

  const std::vector<int64_t>& members(Split s) const { return members_[s == Split::Train ? 0 : 1]; }
  const Prompt& at(Split split, int64_t i) const {
    return prompts_[static_cast<size_t>(preference::member_at(
        members(split), i, split == Split::Train ? "train" : "eval", "prompts"))];
  }

  std::unique_ptr<text::Tokenizer> tok_;
  std::vector<Prompt> prompts_;
  std::array<std::vector<int64_t>, 2> members_;
  std::vector<int64_t> eos_;
  int64_t pad_ = 0;
  v1::DataInfo info_;
};

/// The components of the "prompts" plugin.
extern const trainrun_component_v1 kComponents[] = {
    v1::component<v1::Dataset, PromptDataset>(
        "prompts",
        "Prompts for online RL (GRPO): strings or conversations rendered with the chat "
        "template; every other field reaches the rewards"),
};

}  // namespace trainrun::prompts
