// Dataset `chat`: supervised fine-tuning on conversations, rendered with the model's own chat
// template (or a built-in), the prompt masked out of the loss, optionally packed.
//
// A sample is one conversation: input = its tokens but the last, target = its tokens but the
// first, with kIgnoreIndex where the target does not count (chat_samples.hpp says which do). A
// conversation of n tokens makes n - 1 predictions and fits when n - 1 <= max_seq_len (like the
// text dataset's block_size). With packing, a sample is a row of up to max_seq_len positions
// holding several conversations (first-fit decreasing by length), with position ids restarting
// at 0 for each and segment ids that keep attention inside each (Batch's ABI 1.6 fields).
// Batches are padded to their longest row (pad token, target ignored, a segment of its own).

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "chat_samples.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/plugin.hpp"
#include "trainrun/text/template_limits.hpp"
#include <trainrun/log.hpp>

namespace trainrun::chat {

using v1::Batch;
using v1::ConfigError;
using v1::DataInfo;
using v1::Split;

namespace {

std::vector<std::string> expand(const std::vector<std::string>& patterns, const std::string& context) {
  TR_CHECK_TYPED(ConfigError, !patterns.empty(), context, ": paths is required: list the JSONL/JSON files");
  return expand_paths(patterns, context, "paths");
}

TrainOn train_on_of(const std::string& s) {
  return s == "last" ? TrainOn::Last : s == "all" ? TrainOn::All : TrainOn::Assistant;
}

// Rows of sample indices: first-fit decreasing by predictions (n - 1), each row's samples in
// their original order. Deterministic for given lengths.
std::vector<std::vector<int64_t>> pack(const std::vector<int64_t>& members,
                                       const std::vector<ChatSample>& samples, int64_t capacity) {
  std::vector<int64_t> order = members;
  auto len = [&](int64_t i) { return static_cast<int64_t>(samples[i].ids.size()) - 1; };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return len(a) > len(b); });
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> room;
  for (int64_t i : order) {
    size_t r = 0;
    while (r < rows.size() && room[r] < len(i)) ++r;
    if (r == rows.size()) rows.emplace_back(), room.push_back(capacity);
    rows[r].push_back(i);
    room[r] -= len(i);
  }
  for (auto& row : rows) std::sort(row.begin(), row.end());
  return rows;
}

}  // namespace

class ChatDataset final : public v1::Dataset {
 public:
  static void declare_options(v1::OptionSchema& s) {
    s.add({"paths", v1::OptionType::StringList, std::monostate{}, /*required=*/true, {}, {}, {},
           "JSONL or JSON files (or glob(3) patterns) of conversations: OpenAI {\"messages\"}, "
           "ShareGPT {\"conversations\"} or Alpaca {\"instruction\", \"input\", \"output\"}"});
    s.required_string("tokenizer", "Hugging Face tokenizer directory (tokenizer.json, "
                                   "tokenizer_config.json), e.g. the model's own directory");
    s.string("chat_template", "", "\"\" = the tokenizer's own chat template; else a named template "
                                  "of the tokenizer, a built-in (chatml, llama3, llama2, mistral, "
                                  "alpaca) or a .jinja file");
    s.choice("train_on", "assistant", {"assistant", "last", "all"},
             "targets counted in the loss: every assistant turn with its end-of-turn/EOS tokens, "
             "the last assistant turn only, or every token");
    s.integer("max_seq_len", 2048, "positions per sample (a conversation of n tokens needs n - 1); "
                                   "the model's block_size / max_position_embeddings must cover it", 1, 1 << 20);
    s.choice("overlong", "drop", {"drop", "truncate", "error"},
             "a conversation longer than max_seq_len: left out, cut to max_seq_len + 1 tokens, or an "
             "error naming it (counts are printed at start)");
    s.boolean("packing", false, "pack several conversations into each max_seq_len row (position ids "
                                "restart per conversation, attention never crosses them)");
    s.real("validation_fraction", 0.0, "fraction of the conversations held out for evaluation", 0.0, 0.9);
    s.integer("split_seed", 0, "seed of the held-out choice (the same seed holds out the same conversations)", 0);
    text::declare_template_limits(s);
  }

  ChatDataset(const v1::Options& o, const v1::RunContext& ctx) {
    const std::string context = o.context();
    const std::vector<std::string> files = expand(o.get_string_list("paths"), context);
    const std::string dir = o.get_string("tokenizer");
    const text::Tokenizer tok = text::Tokenizer::from_directory(dir);
    std::unique_ptr<text::ChatTemplate> tmpl;
    try {
      tmpl = std::make_unique<text::ChatTemplate>(
          text::load_chat_template(dir, o.get_string("chat_template"), text::template_limits(o)));
    } catch (const std::exception& e) {
      throw ConfigError(context + ": chat_template: " + e.what());
    }
    const TrainOn train_on = train_on_of(o.get_string("train_on"));
    max_len_ = o.get_int("max_seq_len");
    const std::string overlong = o.get_string("overlong");
    pad_ = tok.pad_token_id().value_or(tok.eos_token_id().value_or(0));

    const std::vector<Conversation> convs = read_conversations(files);
    TR_CHECK_TYPED(ConfigError, !convs.empty(), context, ": the files hold no conversation");
    int64_t dropped = 0, truncated = 0, empty = 0, tokens = 0, counted = 0;
    for (const auto& c : convs) {
      ChatSample s = render_sample(c, *tmpl, tok, train_on);
      const int64_t predictions = static_cast<int64_t>(s.ids.size()) - 1;
      if (predictions > max_len_) {
        TR_CHECK_TYPED(ConfigError, overlong != "error", c.where(), ": the conversation has ", s.ids.size(),
                       " tokens (", predictions, " predictions), more than max_seq_len = ", max_len_,
                       " (overlong = \"error\"; \"drop\" or \"truncate\" go on without it)");
        if (overlong == "drop") {
          ++dropped;
          continue;
        }
        ++truncated;
        s.ids.resize(static_cast<size_t>(max_len_ + 1));
        s.counted.resize(s.ids.size());
      }
      if (s.ids.size() < 2 || s.num_counted() == 0) {
        ++empty;
        continue;
      }
      tokens += static_cast<int64_t>(s.ids.size());
      counted += s.num_counted();
      samples_.push_back(std::move(s));
    }
    TR_CHECK_TYPED(ConfigError, !samples_.empty(), context, ": no conversation is left to train on (",
                   dropped, " longer than max_seq_len = ", max_len_, ", ", empty, " without a counted target)");

    // Held-out choice: a permutation from split_seed, the same on every standard library.
    std::vector<int64_t> all(samples_.size());
    std::iota(all.begin(), all.end(), 0);
    const auto [train, eval] =
        hold_out(all, o.get_double("validation_fraction"),
                 static_cast<uint64_t>(o.get_int("split_seed")), context, "conversation");
    packing_ = o.get_bool("packing");
    for (int k = 0; k < 2; ++k) {
      const std::vector<int64_t>& members = k == 0 ? train : eval;
      if (packing_) {
        rows_[k] = pack(members, samples_, max_len_);
      } else {
        for (int64_t i : members) rows_[k].push_back({i});
      }
    }

    info_.task = "language_modeling";
    info_.sample_shape = {max_len_};
    info_.vocab_size = tok.vocab_size();
    if (ctx.rank == 0) {
      std::ostringstream os;
      os << convs.size() << " conversations from " << files.size() << " file"
         << (files.size() == 1 ? "" : "s") << ", template " << tmpl->origin()
         << "; longer than max_seq_len = " << max_len_ << ": " << dropped << " dropped, "
         << truncated << " truncated; " << empty << " without a counted target dropped; "
         << train.size() << " train / " << eval.size() << " held out; " << counted << " of "
         << tokens << " tokens counted (train_on = " << o.get_string("train_on") << ")";
      if (packing_) {
        int64_t used = 0;
        for (int64_t i : train) used += static_cast<int64_t>(samples_[i].ids.size()) - 1;
        os << "; packing: " << rows_[0].size() << " rows, " << std::fixed << std::setprecision(1)
           << (rows_[0].empty() ? 0.0 : 100.0 * used / (static_cast<double>(rows_[0].size()) * max_len_))
           << "% filled";
      }
      v1::Logger("chat", ctx.rank).info(os.str());
    }
  }

  DataInfo info() const override { return info_; }
  int64_t size(Split split) const override { return static_cast<int64_t>(rows(split).size()); }

  Batch batch(Split split, const std::vector<int64_t>& indices) override {
    const auto& table = rows(split);
    int64_t T = 0;
    for (int64_t i : indices) {
      TR_CHECK(i >= 0 && i < static_cast<int64_t>(table.size()), "chat: ", split == Split::Train ? "train" : "eval",
               " index ", i, " out of range [0, ", table.size(), ")");
      int64_t len = 0;
      for (int64_t s : table[i]) len += static_cast<int64_t>(samples_[s].ids.size()) - 1;
      T = std::max(T, len);
    }
    const int64_t B = static_cast<int64_t>(indices.size());
    torch::Tensor input = torch::full({B, T}, static_cast<int64_t>(pad_), torch::kLong);
    torch::Tensor target = torch::full({B, T}, v1::kIgnoreIndex, torch::kLong);
    torch::Tensor pos = torch::zeros({B, T}, torch::kLong), seg = torch::zeros({B, T}, torch::kLong);
    auto in = input.accessor<int64_t, 2>(), tg = target.accessor<int64_t, 2>();
    auto ps = pos.accessor<int64_t, 2>(), sg = seg.accessor<int64_t, 2>();
    Batch b;
    for (int64_t r = 0; r < B; ++r) {
      int64_t t = 0, segment = 0;
      for (int64_t si : table[indices[r]]) {
        const ChatSample& s = samples_[si];
        for (size_t j = 0; j + 1 < s.ids.size(); ++j, ++t) {
          in[r][t] = s.ids[j];
          if (s.counted[j + 1]) tg[r][t] = s.ids[j + 1], ++b.num_targets;
          ps[r][t] = static_cast<int64_t>(j);
          sg[r][t] = segment;
        }
        ++segment;
      }
      b.num_tokens += t;
      // Padding: positions go on counting, in a segment of its own.
      for (int64_t p = 0; t < T; ++t, ++p) ps[r][t] = p, sg[r][t] = segment;
    }
    b.input = input;
    b.target = target;
    b.num_samples = B;
    if (packing_) b.position_ids = pos, b.segment_ids = seg;
    return b;
  }

 private:
  const std::vector<std::vector<int64_t>>& rows(Split s) const { return rows_[s == Split::Train ? 0 : 1]; }

  std::vector<ChatSample> samples_;
  std::vector<std::vector<int64_t>> rows_[2];  // [train, eval]: sample indices of each row
  int64_t max_len_ = 0;
  int32_t pad_ = 0;
  bool packing_ = false;
  DataInfo info_;
};

/// The components of the "chat" plugin.
extern const trainrun_component_v1 kComponents[] = {
    v1::component<v1::Dataset, ChatDataset>(
        "chat", "Chat/instruction SFT data (OpenAI messages, ShareGPT, Alpaca) rendered with a chat "
                "template, prompt masked out of the loss, optional packing"),
};

}  // namespace trainrun::chat
