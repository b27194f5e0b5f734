#pragma once
// The `preference` dataset without LibTorch: reading preference pairs (JSONL rows of prompt /
// chosen / rejected), tokenizing them as TRL 1.16's DPOTrainer does (_prepare_dataset) or as its
// CPOTrainer and ORPOTrainer do (their shared tokenize_row), and laying pairs out as next-token
// rows as its DataCollatorForPreference does. preference.cpp turns the rows into tensors;
// tests/tools/preference_dump.cpp prints them for comparison with TRL itself
// (tests/e2e/preference_data_ref.py).
#include <chat_samples.hpp>
#include <trainrun/text/chat_template.hpp>
#include <trainrun/text/tokenizer.hpp>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace trainrun::preference {

/// One preference row as read, the prompt already extracted when the row had none.
struct Row {
  std::string file;
  int64_t line = 0;           ///< 1-based line of the JSONL file
  std::string where() const;  ///< "FILE:LINE"
  /// Messages ([{role, content}, ...]) in prompt/chosen/rejected; otherwise three strings.
  bool conversational = false;
  /// The row had no "prompt": it was taken from the start chosen and rejected share.
  bool implicit_prompt = false;
  nlohmann::ordered_json prompt, chosen, rejected;
  /// Conversational rows: the row's "tools" (null when absent) and "chat_template_kwargs"
  /// (an object, empty when absent), passed to the chat template as TRL does.
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  /// The row's "margin" (a number), when it has one: TRL RewardTrainer's per-pair margin.
  std::optional<double> margin;
};

/// glob(3)-expands `patterns` (option `key` of the table `context`) into files. Throws
/// v1::ConfigError for an empty list, a pattern matching nothing, or a folder.
std::vector<std::string> expand_paths(const std::vector<std::string>& patterns,
                                      const std::string& context, const std::string& key);

/// A short rendering of a JSON value for error messages (at most 60 characters).
std::string excerpt(const nlohmann::ordered_json& v);

/// Throws v1::ConfigError "WHERE: ..." naming `field` and the message's index unless `list` is a
/// non-empty list of {"role", "content"} objects whose role is system, user, assistant or tool
/// (the chat dataset's roles) and whose content is a string (null only for an assistant).
void check_messages(const nlohmann::ordered_json& list, const std::string& field,
                    const std::string& where);

/// A conversational row's "tools" (a list, or a JSON string holding one) and
/// "chat_template_kwargs" (an object) from `rec` into r.tools / r.template_kwargs, as TRL reads
/// them; absent or null leaves the defaults. Throws v1::ConfigError naming r.where() and the field.
void read_chat_extras(const nlohmann::ordered_json& rec, Row& r);

/// Calls f(record, row) for every non-blank line of the JSONL `files`, in order, with row.file
/// and row.line set. Throws v1::ConfigError "`who`: cannot open FILE" for an unreadable file and
/// "FILE:LINE: ..." for a line that is not JSON or is nested too deeply (v1::kMaxJsonDepth).
void for_each_jsonl_line(const std::vector<std::string>& files, const std::string& who,
                         const std::function<void(const nlohmann::ordered_json&, Row)>& f);

/// Reads JSONL `files` (one object per line, blank lines skipped). A row holds "chosen" and
/// "rejected", and optionally "prompt": all three strings (standard) or all three non-empty lists
/// of {"role", "content"} messages (conversational). Without "prompt" the prompt is extracted as
/// TRL's extract_prompt does: the longest shared start (characters, or whole messages) up to the
/// first difference, one space before it moved to the completions; when one completion is a
/// prefix of the other, everything but the shorter one's last character or message. Throws
/// v1::ConfigError naming FILE:LINE and the field for: malformed JSON, a missing or mistyped
/// field, fields of mixed kinds, an empty completion, an implicit prompt that is empty.
std::vector<Row> read_rows(const std::vector<std::string>& files);

/// A tokenized pair, as TRL's DPOTrainer stores it: prompt + chosen_ids is the tokenized
/// prompt+chosen text, likewise for rejected.
struct Pair {
  std::string where;  ///< "FILE:LINE" of the row
  std::vector<int32_t> prompt_ids, chosen_ids, rejected_ids;
  /// The tokenized prompt alone was longer than the shared start it keeps (its end tokenizes
  /// differently, or renders differently, once a completion follows).
  bool prompt_diverged = false;
  /// CPO/ORPO tokenization only: the rejected sequence's own prompt, set when it differs from
  /// prompt_ids (TRL's CPOTrainer splits each sequence on its own, so the two prompts can differ
  /// in their last token or by one token in length); unset: both sequences start with prompt_ids.
  std::optional<std::vector<int32_t>> rejected_prompt_ids;
  /// The prompt the chosen (false) or rejected (true) sequence starts with.
  const std::vector<int32_t>& prompt_of(bool rejected) const {
    return rejected && rejected_prompt_ids ? *rejected_prompt_ids : prompt_ids;
  }
  std::optional<double> margin;  ///< Row::margin
};

/// Tokenizes `row` as TRL 1.16's DPOTrainer: standard rows get the EOS token's text appended to
/// chosen and rejected unless they end with it, and prompt, prompt+chosen and prompt+rejected
/// are encoded with special tokens (BOS where the tokenizer adds one); conversational rows are
/// rendered with `tmpl` (the prompt with the generation prompt, prompt+completion without) and
/// encoded without special tokens. The prompt is the shortest common start of the prompt's ids
/// with each of the other two; chosen_ids/rejected_ids are the rest. `tmpl` may be null when the
/// row is standard. Throws v1::ConfigError naming row.where() for a template error or a tokenizer
/// without an EOS token (standard rows).
Pair tokenize_row(const Row& row, const text::Tokenizer& tok, const text::ChatTemplate* tmpl);

/// Tokenizes `row` as TRL 1.16's CPOTrainer and ORPOTrainer (their identical tokenize_row, after
/// maybe_apply_chat_template): conversational rows are first rendered to text with `tmpl` (the
/// prompt with the generation prompt, or continuing its last message when that is the
/// assistant's; the prompt text cut to the characters it shares with both rendered
/// conversations; the row's "tools" are not passed, as TRL passes none) and then handled as
/// standard rows. Each sequence is `tok(prompt + completion)` without special tokens, split where
/// `tok(prompt)` ends, or one token earlier when `tok(prompt)` is not its prefix, each sequence on
/// its own (Pair::rejected_prompt_ids); the BOS id is put before a prompt that does not start with
/// it (when the tokenizer has one) and the EOS id after a completion that does not end with it,
/// so ChatML completions end in "<|im_end|>\n<|im_end|>". Throws v1::ConfigError naming
/// row.where() for a template error, a prompt whose last message is a system message, a
/// tokenizer without an EOS token, or chosen and rejected prompts that differ by more than their
/// last token (TRL refuses those rows too).
Pair tokenize_row_cpo(const Row& row, const text::Tokenizer& tok, const text::ChatTemplate* tmpl);

/// How pairs are cut (DPOConfig's max_length and truncation_mode, plus max_prompt_length).
struct Limits {
  int64_t max_length = 1024;      ///< tokens of prompt + completion kept; 0: no limit
  bool keep_end = false;          ///< keep the last max_length tokens, not the first
  int64_t max_prompt_length = 0;  ///< prompt tokens kept (the last ones); 0: no limit
};

/// Keeps the last `limits.max_prompt_length` tokens of the prompt (both prompts of a CPO/ORPO pair)
/// (when set). Not in TRL 1.16; applied before everything else, the max_length drop included.
void clip_prompt(Pair& pair, const Limits& limits);

/// One of a pair's two training sequences after truncation: prompt + completion ids, the
/// completion being ids[completion_begin:] (always a suffix).
struct Sequence {
  std::vector<int32_t> ids;
  size_t completion_begin = 0;
  /// Next-token targets the loss counts: positions t with t + 1 >= completion_begin.
  int64_t counted_targets() const;
};

/// pair.prompt_of(rejected) + (rejected ? rejected_ids : chosen_ids), cut to limits.max_length as
/// TRL's collator does (keep_start: the first max_length tokens; keep_end: the last). keep_start is
/// also CPOTrainer's cut (the completion to max_length - prompt tokens).
Sequence make_sequence(const Pair& pair, bool rejected, const Limits& limits);

/// Whether a pair trains, and if not why.
enum class Verdict {
  Keep,
  PromptFillsMaxLength,  ///< keep_start and a prompt alone has >= max_length tokens (DPOTrainer
                         ///< drops it; CPOTrainer would train on an empty completion, a NaN)
  NoCountedTarget,       ///< chosen or rejected keeps no counted target after truncation
};

/// The verdict on `pair` (after clip_prompt) under `limits`.
Verdict verdict(const Pair& pair, const Limits& limits);

/// Pairs laid out as one batch, row-major [rows, width] with rows = 2 * pairs: rows 0..B-1 are
/// prompt+chosen, rows B..2B-1 prompt+rejected in the same order. input = ids[:-1], target =
/// ids[1:] where that token is a completion token, else `ignore_index`; right-padded with `pad`
/// (target ignored) to width = the longest row's ids minus one. With chosen_prompt_rows (the
/// ORPO layout) rows = 3 * pairs: rows 2B..3B-1 repeat the chosen rows' input with the targets
/// of their prompt tokens instead (every prompt token but the first), since ORPOTrainer's NLL
/// counts the prompt of the chosen sequence too and a row carries one set of targets.
struct Collated {
  int64_t rows = 0, width = 0;
  std::vector<int64_t> input, target;
  int64_t num_tokens = 0;        ///< real (non-pad) input positions of the first 2B rows
  std::vector<int64_t> lengths;  ///< real input positions of each row (collate only)
  /// Packed (padding_free) only: [rows, width] position within the sequence and its index.
  std::vector<int64_t> positions, segments;
};

/// Lays out `pairs` (pointers into the caller's pairs) as above.
Collated collate(const std::vector<const Pair*>& pairs, const Limits& limits, int32_t pad,
                 int64_t ignore_index, bool chosen_prompt_rows = false);

/// The padding-free layout of `padded` (from collate): its rows' real positions concatenated in
/// row order into one row of width = the sum of the lengths, with positions restarting at 0 for
/// each sequence and segment k for the sequence of padded row k (TRL's padding_free; the model
/// keeps the sequences apart and hands the objective one row per sequence again). num_tokens is
/// unchanged.
Collated packed(const Collated& padded);

}  // namespace trainrun::preference
