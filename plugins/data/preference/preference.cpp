// Dataset `preference`: prompt / chosen / rejected pairs for preference objectives (DPO and its
// kin), tokenized exactly as TRL 1.16's DPOTrainer does, or (trainer = "cpo" / "orpo") as its
// CPOTrainer and ORPOTrainer do (preference_samples.hpp).
//
// A sample is one pair. A batch of B pairs is 2B rows, TRL's concatenated layout: rows 0..B-1
// prompt+chosen, rows B..2B-1 prompt+rejected, pair i in row i and B + i. Each row holds
// input = ids[:-1], target = ids[1:] where that token belongs to the completion, else
// kIgnoreIndex; rows are right-padded (pad token, target ignored) to the longest. With trainer =
// "orpo" rows 2B..3B-1 repeat the chosen rows with their prompt tokens as targets (ORPOTrainer's
// NLL counts them). num_samples = num_targets = B (the loss unit of a paired objective is the
// pair); num_tokens counts the real input positions of the first 2B rows. With padding_free the
// same rows are packed into one (position_ids, segment_ids), which the model hands the objective
// as separate rows again.
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dataset_setup.hpp"
#include "preference_samples.hpp"
#include "reward_layout.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/plugin.hpp"
#include <trainrun/log.hpp>

namespace trainrun::preference {

using v1::Batch;
using v1::ConfigError;
using v1::Options;
using v1::Split;

namespace {

// What tokenizing the pairs kept and dropped, for rank 0's log.
struct Counts {
  Tally prompt_fills{"pair"}, no_target{"pair"}, same{"pair"}, diverged{"pair"}, too_long{"pair"},
      with_margin{"pair"}, without_margin{"pair"};
  int64_t conversational = 0, implicit = 0, prompt_tokens = 0, chosen_tokens = 0,
          rejected_tokens = 0;
};

}  // namespace

/// Preference pairs for paired objectives (DPO), TRL 1.16's tokenization and batch layout.
class PreferenceDataset final : public v1::Dataset, public v1::SampleValues {
 public:
  /// Options: files, tokenizer and template, TRL's max_length / truncation_mode, the held-out part.
  static void declare_options(v1::OptionSchema& s) {
    declare_source_options(
        s,
        "JSONL files (or glob(3) patterns) of preference pairs: {\"prompt\"?, \"chosen\", "
        "\"rejected\"}, all strings or all lists of {\"role\", \"content\"} messages; without "
        "\"prompt\" it is the start chosen and rejected share (TRL's extract_prompt)",
        "pairs", "conversational pairs");
    s.integer("max_length", 1024,
              "tokens of prompt + completion kept per sequence (TRL's max_length); 0 = no limit", 0,
              1 << 24);
    s.choice("truncation_mode", "keep_start", {"keep_start", "keep_end"},
             "a sequence longer than max_length keeps its first or its last max_length tokens; "
             "with keep_start a pair whose prompt alone fills max_length is dropped (as TRL)");
    s.integer("max_prompt_length", 0,
              "keep only the last max_prompt_length prompt tokens, before max_length applies "
              "(not in TRL 1.16); 0 = no limit",
              0, 1 << 24);
    declare_split_options(s, "pairs");
    s.boolean("padding_free", false,
              "pack each micro-batch's sequences into one row without padding (TRL's "
              "padding_free): positions restart per sequence and attention stays within it, the "
              "same numbers as padded rows; needs a model that supports packing (llama), not "
              "with trainer = \"reward\"");
    s.choice("trainer", "dpo", {"dpo", "cpo", "orpo", "reward"},
             "whose tokenization: TRL's DPOTrainer (dpo: EOS text appended to text rows, the "
             "prompt split at the common prefix); CPOTrainer (cpo, for simpo: BOS and EOS ids "
             "added, conversations rendered to text, each sequence split on its own); "
             "ORPOTrainer (orpo, for orpo: cpo's tokens plus each chosen row again with its "
             "prompt as targets, 3B rows); RewardTrainer (reward, for the reward objective: dpo's "
             "tokens as whole sequences without targets, a pair longer than max_length dropped, "
             "not cut)");
  }

  /// Reads, tokenizes and checks every pair; rank 0 logs what was kept and dropped.
  PreferenceDataset(const Options& o, const v1::RunContext& ctx) {
    const std::string context = o.context();
    const Sources sources = read_sources(o);
    const std::string dir = o.get_string("tokenizer");
    const text::Tokenizer tok = text::Tokenizer::from_directory(dir);
    limits_.max_length = o.get_int("max_length");
    limits_.keep_end = o.get_string("truncation_mode") == "keep_end";
    limits_.max_prompt_length = o.get_int("max_prompt_length");
    pad_ = tok.pad_token_id().value_or(tok.eos_token_id().value_or(0));
    const std::string trainer = o.get_string("trainer");
    const bool cpo = trainer == "cpo" || trainer == "orpo";
    reward_ = trainer == "reward";
    TR_CHECK_TYPED(ConfigError, !reward_ || (!limits_.keep_end && limits_.max_prompt_length == 0),
                   context,
                   ": trainer = \"reward\" drops a pair longer than max_length, as TRL's "
                   "RewardTrainer does, and cuts nothing: leave truncation_mode and "
                   "max_prompt_length unset");
    chosen_prompt_rows_ = trainer == "orpo";
    padding_free_ = o.get_bool("padding_free");
    TR_CHECK_TYPED(ConfigError, !reward_ || !padding_free_, context,
                   ": padding_free packs sequences whose log-probabilities an objective sums; a "
                   "reward model reads one score per row (trainer = \"reward\"): leave it unset");
    TR_CHECK_TYPED(ConfigError, !cpo || !limits_.keep_end, context, ": trainer = \"", trainer,
                   "\" takes truncation_mode = \"keep_start\" only (TRL's CPOTrainer and "
                   "ORPOTrainer cut the end of the completion)");

    const std::vector<Row> rows[2] = {read_rows(sources.files), read_rows(sources.eval_files)};
    TR_CHECK_TYPED(ConfigError, !rows[0].empty(), context, ": the files in paths hold no pair");
    TR_CHECK_TYPED(ConfigError, sources.eval_files.empty() || !rows[1].empty(), context,
                   ": the files in eval_paths hold no pair");
    const std::unique_ptr<text::ChatTemplate> tmpl = template_if_needed(
        rows, [](const Row& r) -> const Row& { return r; }, o, dir);

    Counts counts;
    std::vector<int64_t> kept[2];
    for (int k = 0; k < 2; ++k) kept[k] = keep(rows[k], cpo, tok, tmpl.get(), counts);
    TR_CHECK_TYPED(ConfigError, !kept[0].empty(), context, ": no pair is left to train on (",
                   counts.prompt_fills.text("whose prompt fills max_length"), ", ",
                   counts.no_target.text("without a counted target after truncation"), ", ",
                   counts.too_long.text("longer than max_length"), ")");

    // TRL's RewardTrainer subtracts a "margin" column when its data has one; a file where only
    // some rows have it would leave the others' loss undefined.
    margins_ = reward_ && counts.with_margin.n > 0;
    TR_CHECK_TYPED(ConfigError, !margins_ || counts.without_margin.n == 0, context, ": ",
                   counts.with_margin.text("with a \"margin\""), " but ",
                   counts.without_margin.text("without one"),
                   ": give every pair a margin, or none");
    members_ = split_members(kept, sources, static_cast<uint64_t>(o.get_int("split_seed")), context,
                             "pair");

    info_.task = reward_ ? "reward" : "preference";
    info_.sample_shape = {limits_.max_length > 0 ? limits_.max_length : longest_};
    info_.vocab_size = tok.vocab_size();
    if (ctx.rank == 0)
      log_summary(o, ctx, sources, trainer, tmpl.get(), rows[0].size() + rows[1].size(), counts);
  }

  v1::DataInfo info() const override { return info_; }
  int64_t size(Split split) const override { return static_cast<int64_t>(members(split).size()); }

  /// "margin" with trainer = "reward" when the pairs have one (the reward objective reads it).
  std::vector<std::string> sample_value_names() const override {
    return margins_ ? std::vector<std::string>{"margin"} : std::vector<std::string>{};
  }
  at::Tensor sample_values(Split split, const std::vector<int64_t>& indices) const override {
    std::vector<double> v;
    for (int64_t i : indices) v.push_back(pair_at(split, i).margin.value_or(0.0));
    return torch::tensor(v, torch::kDouble).unsqueeze(1);
  }

  /// B pairs -> 2B rows (chosen rows, then rejected rows), see the top of this file.
  Batch batch(Split split, const std::vector<int64_t>& indices) override {
    std::vector<const Pair*> chosen;
    chosen.reserve(indices.size());
    for (int64_t i : indices) chosen.push_back(&pair_at(split, i));
    Collated c = reward_ ? collate_sequences(chosen, pad_, v1::kIgnoreIndex)
                         : collate(chosen, limits_, pad_, v1::kIgnoreIndex, chosen_prompt_rows_);
    if (padding_free_) c = packed(c);
    auto tensor = [&c](std::vector<int64_t>& v) {
      return torch::from_blob(v.data(), {c.rows, c.width}, torch::kLong).clone();
    };
    Batch b;
    b.input = tensor(c.input);
    b.target = tensor(c.target);
    if (padding_free_) b.position_ids = tensor(c.positions), b.segment_ids = tensor(c.segments);
    b.num_samples = static_cast<int64_t>(indices.size());
    b.num_targets = b.num_samples;
    b.num_tokens = c.num_tokens;
    return b;
  }

 private:
  const std::vector<int64_t>& members(Split s) const { return members_[s == Split::Train ? 0 : 1]; }
  const Pair& pair_at(Split s, int64_t i) const {
    return pairs_[static_cast<size_t>(
        member_at(members(s), i, s == Split::Train ? "train" : "eval", "preference"))];
  }

  // Tokenizes `rows` and appends the pairs that train to pairs_; returns their indices.
  std::vector<int64_t> keep(const std::vector<Row>& rows, bool cpo, const text::Tokenizer& tok,
                            const text::ChatTemplate* tmpl, Counts& c) {
    std::vector<int64_t> kept;
    for (const Row& r : rows) {
      c.conversational += r.conversational;
      c.implicit += r.implicit_prompt;
      Pair p = cpo ? tokenize_row_cpo(r, tok, tmpl) : tokenize_row(r, tok, tmpl);
      p.margin = r.margin;
      (r.margin ? c.with_margin : c.without_margin).add(r.where());
      if (p.prompt_diverged) c.diverged.add(p.where);
      clip_prompt(p, limits_);
      if (reward_ && limits_.max_length > 0 && longest_sequence(p) > limits_.max_length) {
        c.too_long.add(p.where);
        continue;
      }
      const Verdict v = reward_ ? Verdict::Keep : verdict(p, limits_);
      if (v == Verdict::PromptFillsMaxLength) {
        c.prompt_fills.add(p.where);
        continue;
      }
      if (v == Verdict::NoCountedTarget) {
        c.no_target.add(p.where);
        continue;
      }
      if (p.chosen_ids == p.rejected_ids) c.same.add(p.where);
      c.prompt_tokens += static_cast<int64_t>(p.prompt_ids.size());
      c.chosen_tokens += static_cast<int64_t>(p.chosen_ids.size());
      c.rejected_tokens += static_cast<int64_t>(p.rejected_ids.size());
      longest_ = std::max(longest_, static_cast<int64_t>(std::max(
                                        p.prompt_of(false).size() + p.chosen_ids.size(),
                                        p.prompt_of(true).size() + p.rejected_ids.size())));
      kept.push_back(static_cast<int64_t>(pairs_.size()));
      pairs_.push_back(std::move(p));
    }
    return kept;
  }

  // Rank 0's account of the `read` pairs: what was kept, dropped and held out.
  void log_summary(const Options& o, const v1::RunContext& ctx, const Sources& sources,
                   const std::string& trainer, const text::ChatTemplate* tmpl, size_t read,
                   const Counts& c) const {
    const v1::Logger log("preference", ctx.rank);
    const size_t n_files = sources.files.size() + sources.eval_files.size();
    std::ostringstream os;
    os << read << " pairs (" << trainer << " tokenization) from " << n_files << " file"
       << (n_files == 1 ? "" : "s") << " (" << c.conversational << " conversational"
       << (tmpl ? ", template " + tmpl->origin() : std::string()) << "; " << c.implicit
       << " with an implicit prompt); dropped: "
       << (reward_ ? c.too_long.text("longer than max_length")
                   : c.prompt_fills.text("whose prompt fills max_length") + ", " +
                         c.no_target.text(
                             "without a counted chosen or rejected target after truncation"))
       << "; " << members_[0].size() << " train / " << members_[1].size() << " held out"
       << (sources.eval_files.empty() ? "" : " (eval_paths)") << "; tokens: " << c.prompt_tokens
       << " prompt, " << c.chosen_tokens << " chosen, " << c.rejected_tokens
       << " rejected; longest pair " << longest_ << " tokens (max_length = "
       << (limits_.max_length > 0 ? std::to_string(limits_.max_length) : std::string("none"));
    if (!reward_) os << ", " << o.get_string("truncation_mode");
    if (limits_.max_prompt_length > 0) os << ", max_prompt_length = " << limits_.max_prompt_length;
    os << ")";
    if (margins_) os << "; per-pair margins (the reward loss subtracts them)";
    if (padding_free_) os << "; padding-free batches";
    if (c.diverged.n && !reward_)  // where DPO splits a sequence; a reward model reads it whole
      os << "; " << c.diverged.text("whose tokenized prompt is not a prefix of prompt+completion")
         << ": the completion starts where the two diverge, as in TRL";
    log.info(os.str());
    if (c.same.n)
      log.warn(c.same.text("whose chosen equals its rejected (as tokens)") +
               ": kept, though such a pair teaches nothing");
    if (c.prompt_fills.n)
      log.warn(c.prompt_fills.text("dropped") +
               ": the prompt leaves no room for the completion within max_length = " +
               std::to_string(limits_.max_length) +
               " (truncation_mode = keep_start), as TRL drops them");
    if (c.too_long.n)
      log.warn(c.too_long.text("dropped") + ": a sequence is longer than max_length = " +
               std::to_string(limits_.max_length) + " (as TRL's RewardTrainer drops them)");
    if (c.no_target.n)
      log.warn(c.no_target.text("dropped") +
               ": chosen or rejected keeps no counted target after truncation");
  }

  std::vector<Pair> pairs_;                      // every kept pair, train and held-out
  std::array<std::vector<int64_t>, 2> members_;  // [train, eval]: indices into pairs_
  Limits limits_;
  int32_t pad_ = 0;
  bool reward_ = false;              // trainer = "reward": whole sequences (reward_layout.hpp)
  bool chosen_prompt_rows_ = false;  // trainer = "orpo": 3B rows, see the top of this file
  bool margins_ = false;             // trainer = "reward" and the pairs have a "margin"
  bool padding_free_ = false;        // the rows packed into one (preference_samples.hpp packed)
  int64_t longest_ = 0;              // tokens of the longest kept prompt + completion
  v1::DataInfo info_;
};

/// The components of the "preference" plugin.
extern const trainrun_component_v1 kComponents[] = {
    v1::component<v1::Dataset, PreferenceDataset>(
        "preference",
        "Preference pairs (prompt, chosen, rejected; text or chat) for DPO-style "
        "objectives, tokenized as TRL's DPOTrainer (or CPOTrainer / ORPOTrainer: trainer); "
        "batches of 2B rows"),
};

}  // namespace trainrun::preference
