// Dataset `unpaired`: KTO's unpaired examples (prompt, completion, label: desirable or not),
// read and tokenized exactly as TRL 1.16's KTOTrainer does (_prepare_dataset), for the `kto`
// objective (DataInfo::task "unpaired-preference").
//
// Rows. JSONL in TRL's formats, every file of `paths` (likewise of `eval_paths`) of one kind:
//   unpaired  {"prompt", "completion", "label": true|false}, prompt and completion both strings
//             (standard) or both lists of {"role", "content"} messages (conversational), plus
//             "tools" and "chat_template_kwargs" as TRL reads them;
//   paired    {"prompt"?, "chosen", "rejected"} as the `preference` dataset reads them (an
//             implicit prompt extracted as TRL's extract_prompt), unpaired as TRL's
//             unpair_preference_dataset does: in chunks of 1000 pairs (datasets' map batch
//             size), the chunk's chosen completions (label true), then its rejected ones (false).
// Tokenization: the preference dataset's (TRL's DPO and KTO tokenize alike): standard rows get
// the EOS token's text appended to the completion unless it ends with it, prompt and
// prompt+completion are encoded with special tokens; conversational ones are rendered with the
// chat template (the prompt with the generation prompt); the completion starts where the two
// token sequences diverge. An example whose prompt alone fills max_length is dropped (TRL drops
// it); one whose completion keeps no counted target is dropped too (TRL would train on a
// zero log-probability), each counted in a warning.
//
// KL completions (TRL's add_kl_completion_ids): within each block of kl_block_size consecutive
// examples of a split (TRL: per_device_train_batch_size), example i is also scored with the
// completion of example i - 1, the block's first with the block's last completion. The pairing
// is a property of the example, not of the micro-batch, so precomputed reference values and any
// batch order agree with it; with micro_batch_size = kl_block_size and the examples in order a
// micro-batch's KL completions are exactly its own completions, TRL's recommendation.
//
// Batch of B examples (the contract with the `kto` objective, plugins/objectives):
//   rows 0..B-1    prompt + completion of the examples, in the order of the indices;
//   rows B..2B-1   prompt + KL completion of the same examples (absent when kl_block_size = 0);
// input = ids[:-1], target = ids[1:] where that token belongs to the completion, else
// kIgnoreIndex, right-padded (pad token, target ignored), then ONE MORE column whose target is
// kIgnoreIndex and whose input is the row's kind: 1 = desirable, 0 = undesirable, 2 = KL row.
// That column follows every token of every row, so under the causal mask it changes no
// log-probability; it is how the objective learns the labels. num_samples = num_targets = B
// (KTO's loss is a mean over the examples); num_tokens counts the real input positions of all
// rows, KL rows included (the marker column not).
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
#include "trainrun/interfaces.hpp"
#include "trainrun/plugin.hpp"
#include <trainrun/log.hpp>

namespace trainrun::unpaired {

using json = nlohmann::ordered_json;
using v1::Batch;
using v1::ConfigError;
using v1::Split;

/// Values of the marker column (the last input column of every row), read by the `kto`
/// objective.
constexpr int64_t kUndesirable = 0, kDesirable = 1, kKlRow = 2;

namespace {

using preference::check_messages;
using preference::excerpt;

// What tokenizing the examples kept and dropped, for rank 0's log and the row width.
struct Counts {
  preference::Tally prompt_fills{"example"}, no_target{"example"}, diverged{"example"};
  int64_t conversational = 0, desirable = 0, prompt_tokens = 0, completion_tokens = 0,
          longest_prompt = 0, longest_completion = 0;
};

// TRL's datasets map() batch size: unpair_preference_dataset puts each chunk's chosen rows first.
constexpr size_t kUnpairChunk = 1000;

[[noreturn]] void bad(const std::string& where, const std::string& msg) {
  throw ConfigError(where + ": " + msg);
}

/// One example before tokenization.
struct Example {
  preference::Row row;  ///< prompt, and the completion as both chosen and rejected
  bool desirable = false;
};

// An unpaired row: {"prompt", "completion", "label"} (+ "tools", "chat_template_kwargs").
Example parse_unpaired(const json& rec, preference::Row r) {
  const std::string where = r.where();
  auto field = [&](const char* key) -> const json& {
    auto it = rec.find(key);
    if (it == rec.end()) bad(where, std::string("no \"") + key + "\" field");
    return *it;
  };
  const json& label = field("label");
  if (!label.is_boolean()) bad(where, "label must be true or false, got " + excerpt(label));
  const json& completion = field("completion");
  if (!completion.is_string() && !completion.is_array())
    bad(where, "completion must be a string or a list of {\"role\", \"content\"} messages, got " +
                   excerpt(completion));
  if (!rec.contains("prompt"))
    bad(where,
        "no \"prompt\" field (an unpaired row needs its prompt; only chosen/rejected pairs can "
        "leave it implicit)");
  const json& prompt = rec.at("prompt");
  r.conversational = completion.is_array();
  if (prompt.is_array() != r.conversational || !(prompt.is_string() || prompt.is_array()))
    bad(where, "prompt must be " +
                   std::string(r.conversational ? "a list of messages" : "a string") +
                   " like the completion, got " + excerpt(prompt));
  if (r.conversational) {
    check_messages(prompt, "prompt", where);
    check_messages(completion, "completion", where);
    preference::read_chat_extras(rec, r);
  } else if (completion.get_ref<const std::string&>().empty()) {
    bad(where, "completion is empty");
  }
  r.prompt = prompt;
  r.chosen = completion;
  r.rejected = completion;
  Example e;
  e.row = std::move(r);
  e.desirable = label.get<bool>();
  return e;
}

// The examples of `files`: unpaired rows as they are, or pairs unpaired as TRL does. `key` names
// the option (for errors). Every file holds rows of one kind, decided by the first row read.
std::vector<Example> read_examples(const std::vector<std::string>& files, const std::string& key,
                                   bool* paired_out) {
  std::vector<Example> out;
  int paired = -1;  // unknown until the first row
  std::string first_where;
  preference::for_each_jsonl_line(files, "unpaired", [&](const json& rec, preference::Row r) {
    const std::string where = r.where();
    if (!rec.is_object()) bad(where, "expected a JSON object, got " + std::string(rec.type_name()));
    const bool is_unpaired = rec.contains("completion") || rec.contains("label");
    const bool is_paired = rec.contains("chosen") || rec.contains("rejected");
    if (is_unpaired == is_paired)
      bad(where, is_paired ? "a row has either \"completion\" and \"label\" (unpaired) or "
                             "\"chosen\" and \"rejected\" (paired), not both"
                           : "no \"completion\"/\"label\" (unpaired) nor \"chosen\"/\"rejected\" "
                             "(paired) field");
    if (paired < 0) {
      paired = is_paired;
      first_where = where;
    } else if (paired != is_paired) {
      bad(where, std::string("a ") + (is_paired ? "paired" : "unpaired") + " row among " +
                     (paired ? "paired" : "unpaired") + " ones (the first, " + first_where +
                     ", decides for every file of " + key + ", as TRL decides for a dataset)");
    }
    if (!is_paired) out.push_back(parse_unpaired(rec, std::move(r)));
  });
  *paired_out = paired == 1;
  if (paired == 1) {
    // The preference dataset's reader: its checks, its implicit prompt (TRL's extract_prompt).
    const std::vector<preference::Row> pairs = preference::read_rows(files);
    for (size_t lo = 0; lo < pairs.size(); lo += kUnpairChunk) {
      const size_t hi = std::min(pairs.size(), lo + kUnpairChunk);
      for (bool desirable : {true, false})
        for (size_t i = lo; i < hi; ++i) {
          Example e;
          e.row = pairs[i];
          e.row.chosen = desirable ? pairs[i].chosen : pairs[i].rejected;
          e.row.rejected = e.row.chosen;
          e.desirable = desirable;
          out.push_back(std::move(e));
        }
    }
  }
  return out;
}

}  // namespace

/// A kept example: its tokens, label, and the example whose completion makes its KL row.
struct Tokenized {
  std::string where;
  std::vector<int32_t> prompt_ids, completion_ids;
  bool desirable = false;
  int64_t kl_source = -1;  ///< index into the dataset's examples
};

/// KTO's unpaired examples with their KL rows; see the top of this file.
class UnpairedDataset final : public v1::Dataset {
 public:
  /// Options: files, tokenizer and template, TRL's max_length, the KL blocks, the held-out part.
  static void declare_options(v1::OptionSchema& s) {
    preference::declare_source_options(
        s,
        "JSONL files (or glob(3) patterns): unpaired rows {\"prompt\", \"completion\", "
        "\"label\": true|false}, or preference pairs {\"prompt\"?, \"chosen\", \"rejected\"} "
        "unpaired as TRL does (chosen = desirable); strings or lists of messages",
        "examples", "conversational rows");
    s.integer("max_length", 1024,
              "tokens of prompt + completion kept per sequence, the first ones (TRL's "
              "max_length); an example whose prompt fills it is dropped; 0 = no limit",
              0, 1 << 24);
    s.integer("kl_block_size", 8,
              "KL rows: each example is also scored with the completion of the example before it "
              "within blocks of this many consecutive examples (TRL: per_device_train_batch_size, "
              "whose default is 8; set it to the micro-batch size); 0 = no KL rows (loss_type "
              "apo_zero_unpaired needs none)",
              0, 1 << 24);
    preference::declare_split_options(s, "examples");
  }

  /// Reads, unpairs, tokenizes and checks every example; rank 0 logs what was kept and dropped.
  UnpairedDataset(const v1::Options& o, const v1::RunContext& ctx) {
    const std::string context = o.context();
    const preference::Sources sources = preference::read_sources(o);
    block_ = o.get_int("kl_block_size");
    TR_CHECK_TYPED(ConfigError, block_ != 1, context,
                   ": kl_block_size = 1 would score every example with its own completion (the "
                   "KL estimate would be the reward itself; TRL refuses a batch size of 1): use "
                   ">= 2, or 0 for no KL rows");
    const std::string dir = o.get_string("tokenizer");
    const text::Tokenizer tok = text::Tokenizer::from_directory(dir);
    limits_.max_length = o.get_int("max_length");
    pad_ = tok.pad_token_id().value_or(tok.eos_token_id().value_or(0));

    bool paired[2] = {false, false};
    const std::vector<Example> parts[2] = {
        read_examples(sources.files, "paths", &paired[0]),
        read_examples(sources.eval_files, "eval_paths", &paired[1])};
    TR_CHECK_TYPED(ConfigError, !parts[0].empty(), context, ": the files in paths hold no example");
    TR_CHECK_TYPED(ConfigError, sources.eval_files.empty() || !parts[1].empty(), context,
                   ": the files in eval_paths hold no example");
    const std::unique_ptr<text::ChatTemplate> tmpl = preference::template_if_needed(
        parts, [](const Example& e) -> const preference::Row& { return e.row; }, o, dir);

    Counts counts;
    std::vector<int64_t> kept[2];
    for (int k = 0; k < 2; ++k) kept[k] = keep(parts[k], tok, tmpl.get(), counts);
    TR_CHECK_TYPED(ConfigError, !kept[0].empty(), context, ": no example is left to train on (",
                   counts.prompt_fills.text("whose prompt fills max_length"), ", ",
                   counts.no_target.text("without a counted target after truncation"), ")");

    members_ = preference::split_members(
        kept, sources, static_cast<uint64_t>(o.get_int("split_seed")), context, "example");
    // TRL's add_kl_completion_ids: completions rotated by one within each block of each split.
    if (block_ > 0)
      for (const auto& m : members_)
        for (size_t lo = 0; lo < m.size(); lo += static_cast<size_t>(block_)) {
          const size_t hi = std::min(m.size(), lo + static_cast<size_t>(block_));
          for (size_t j = lo; j < hi; ++j)
            examples_[static_cast<size_t>(m[j])].kl_source = m[j == lo ? hi - 1 : j - 1];
        }

    info_.task = "unpaired-preference";
    // The widest row: a whole sequence (max_length tokens, or the longest prompt with the longest
    // completion, a KL row's bound) less one, plus the marker column.
    info_.sample_shape = {limits_.max_length > 0
                              ? limits_.max_length
                              : counts.longest_prompt + counts.longest_completion};
    info_.vocab_size = tok.vocab_size();
    if (ctx.rank == 0)
      log_summary(ctx, sources, paired[0] || paired[1], tmpl.get(),
                  parts[0].size() + parts[1].size(), counts);
  }

  v1::DataInfo info() const override { return info_; }
  int64_t size(Split split) const override { return static_cast<int64_t>(members(split).size()); }

  /// B examples -> B rows (+ B KL rows), plus the marker column; see the top of this file.
  Batch batch(Split split, const std::vector<int64_t>& indices) override {
    const auto& table = members(split);
    std::vector<preference::Sequence> seqs;
    std::vector<int64_t> kinds;
    const size_t B = indices.size();
    seqs.reserve(2 * B);
    for (int pass = 0; pass < (block_ > 0 ? 2 : 1); ++pass)
      for (int64_t i : indices) {
        const Tokenized& e = examples_[static_cast<size_t>(
            preference::member_at(table, i, split == Split::Train ? "train" : "eval", "unpaired"))];
        preference::Pair p;
        p.prompt_ids = e.prompt_ids;
        p.chosen_ids = pass == 0 ? e.completion_ids
                                 : examples_[static_cast<size_t>(e.kl_source)].completion_ids;
        seqs.push_back(preference::make_sequence(p, /*rejected=*/false, limits_));
        kinds.push_back(pass == 1 ? kKlRow : e.desirable ? kDesirable : kUndesirable);
      }
    const int64_t rows = static_cast<int64_t>(seqs.size());
    int64_t longest = 0;
    for (const auto& s : seqs) longest = std::max(longest, static_cast<int64_t>(s.ids.size()) - 1);
    const int64_t W = longest + 1;  // + the marker column
    std::vector<int64_t> input(static_cast<size_t>(rows * W), pad_);
    std::vector<int64_t> target(static_cast<size_t>(rows * W), v1::kIgnoreIndex);
    int64_t tokens = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const preference::Sequence& s = seqs[static_cast<size_t>(r)];
      for (size_t t = 0; t + 1 < s.ids.size(); ++t) {
        input[static_cast<size_t>(r * W) + t] = s.ids[t];
        if (t + 1 >= s.completion_begin) target[static_cast<size_t>(r * W) + t] = s.ids[t + 1];
      }
      if (s.ids.size() > 1) tokens += static_cast<int64_t>(s.ids.size()) - 1;
      input[static_cast<size_t>(r * W + W - 1)] = kinds[static_cast<size_t>(r)];
    }
    Batch b;
    b.input = torch::from_blob(input.data(), {rows, W}, torch::kLong).clone();
    b.target = torch::from_blob(target.data(), {rows, W}, torch::kLong).clone();
    b.num_samples = static_cast<int64_t>(B);
    b.num_targets = b.num_samples;
    b.num_tokens = tokens;
    return b;
  }

 private:
  const std::vector<int64_t>& members(Split s) const { return members_[s == Split::Train ? 0 : 1]; }

  // Tokenizes `part` and appends the examples that train to examples_; returns their indices.
  std::vector<int64_t> keep(const std::vector<Example>& part, const text::Tokenizer& tok,
                            const text::ChatTemplate* tmpl, Counts& c) {
    std::vector<int64_t> kept;
    for (const Example& e : part) {
      c.conversational += e.row.conversational;
      const preference::Pair p = preference::tokenize_row(e.row, tok, tmpl);
      if (p.prompt_diverged) c.diverged.add(p.where);
      const preference::Verdict v = preference::verdict(p, limits_);
      if (v == preference::Verdict::PromptFillsMaxLength) {
        c.prompt_fills.add(p.where);
        continue;
      }
      if (v == preference::Verdict::NoCountedTarget) {
        c.no_target.add(p.where);
        continue;
      }
      Tokenized t;
      t.where = p.where;
      t.prompt_ids = p.prompt_ids;
      t.completion_ids = p.chosen_ids;
      t.desirable = e.desirable;
      c.desirable += e.desirable;
      c.prompt_tokens += static_cast<int64_t>(t.prompt_ids.size());
      c.completion_tokens += static_cast<int64_t>(t.completion_ids.size());
      c.longest_prompt = std::max(c.longest_prompt, static_cast<int64_t>(t.prompt_ids.size()));
      c.longest_completion =
          std::max(c.longest_completion, static_cast<int64_t>(t.completion_ids.size()));
      kept.push_back(static_cast<int64_t>(examples_.size()));
      examples_.push_back(std::move(t));
    }
    return kept;
  }

  // Rank 0's account of the `total` examples: what was kept, dropped and held out.
  void log_summary(const v1::RunContext& ctx, const preference::Sources& sources, bool paired,
                   const text::ChatTemplate* tmpl, size_t total, const Counts& c) const {
    const v1::Logger log("unpaired", ctx.rank);
    const int64_t n_kept = static_cast<int64_t>(examples_.size());
    const size_t n_files = sources.files.size() + sources.eval_files.size();
    std::ostringstream os;
    os << total << " examples from " << n_files << " file" << (n_files == 1 ? "" : "s")
       << (paired ? " (preference pairs unpaired: chosen = desirable)" : "") << " ("
       << c.conversational << " conversational"
       << (tmpl ? ", template " + tmpl->origin() : std::string()) << "); kept " << n_kept << ": "
       << c.desirable << " desirable, " << n_kept - c.desirable << " undesirable; "
       << members_[0].size() << " train / " << members_[1].size() << " held out"
       << (sources.eval_files.empty() ? "" : " (eval_paths)") << "; tokens: " << c.prompt_tokens
       << " prompt, " << c.completion_tokens << " completion (max_length = "
       << (limits_.max_length > 0 ? std::to_string(limits_.max_length) : std::string("none"))
       << "); KL rows: "
       << (block_ > 0 ? "completions rotated within blocks of " + std::to_string(block_)
                      : std::string("none (kl_block_size = 0)"));
    if (c.diverged.n)
      os << "; " << c.diverged.text("whose tokenized prompt is not a prefix of prompt+completion")
         << ": the completion starts where the two diverge, as in TRL";
    log.info(os.str());
    if (c.prompt_fills.n)
      log.warn(c.prompt_fills.text("dropped") +
               ": the prompt leaves no room for the completion within max_length = " +
               std::to_string(limits_.max_length) + ", as TRL drops them");
    if (c.no_target.n)
      log.warn(c.no_target.text("dropped") +
               ": the completion keeps no counted target after truncation (TRL would keep "
               "them with a log-probability of 0)");
    if (!members_[0].empty()) {
      int64_t d = 0;
      for (int64_t i : members_[0]) d += examples_[static_cast<size_t>(i)].desirable;
      const int64_t u = static_cast<int64_t>(members_[0].size()) - d;
      if (d == 0 || u == 0)
        log.warn(std::string("every training example is ") +
                 (d == 0 ? "undesirable" : "desirable") +
                 ": KTO then only pushes the rewards one way (rewards/margins is not logged)");
    }
  }

  std::vector<Tokenized> examples_;              // every kept example, train and held-out
  std::array<std::vector<int64_t>, 2> members_;  // [train, eval]: indices into examples_
  preference::Limits limits_;  // max_length, keep_start (KTOConfig has no other mode)
  int64_t block_ = 8;
  int32_t pad_ = 0;
  v1::DataInfo info_;
};

/// The components of the "unpaired" plugin.
extern const trainrun_component_v1 kComponents[] = {
    v1::component<v1::Dataset, UnpairedDataset>(
        "unpaired",
        "KTO's unpaired examples (prompt, completion, desirable or not; or preference pairs "
        "unpaired), tokenized as TRL's KTOTrainer; batches with their KL rows"),
};

}  // namespace trainrun::unpaired
