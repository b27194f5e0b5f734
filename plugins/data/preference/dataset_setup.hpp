#pragma once
// What the `preference` and `unpaired` datasets do alike around their rows: the options naming
// their files and tokenizer, the chat template loaded only when a row needs it, the counts of
// rows dropped or noted, and the train / held-out split. The two read the same JSONL rows
// (preference_samples.hpp), so their options and messages should not drift apart. Without
// LibTorch, like preference_samples.hpp.
#include <trainrun/options.hpp>
#include <trainrun/text/chat_template.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "preference_samples.hpp"

namespace trainrun::preference {

/// Declares paths (with `paths_help`), eval_paths, tokenizer and chat_template, in that order.
/// `unit` names what the dataset's rows hold in the help ("pairs", "examples");
/// `conversational` starts chat_template's help ("conversational pairs").
void declare_source_options(v1::OptionSchema& s, const std::string& paths_help,
                            const std::string& unit, const std::string& conversational);

/// Declares validation_fraction and split_seed, `unit` as above.
void declare_split_options(v1::OptionSchema& s, const std::string& unit);

/// The files the options declared above name.
struct Sources {
  std::vector<std::string> files;       ///< paths, expanded
  std::vector<std::string> eval_files;  ///< eval_paths, expanded (empty when unset)
  double fraction = 0.0;                ///< validation_fraction
};

/// Reads paths, eval_paths and validation_fraction. Throws v1::ConfigError naming o.context()
/// for an empty paths, a pattern matching nothing, or eval_paths and validation_fraction both set.
Sources read_sources(const v1::Options& o);

/// The option chat_template of tokenizer directory `dir`, loaded for the conversational row at
/// `where` (FILE:LINE). Throws v1::ConfigError "CONTEXT: chat_template (WHERE is
/// conversational): ..." when it cannot be loaded.
std::unique_ptr<text::ChatTemplate> load_template_for(const v1::Options& o, const std::string& dir,
                                                      const std::string& where);

/// The chat template when a row of `parts` (row_of(item) gives an item's Row) is conversational,
/// else null: text-only data may use a tokenizer without one.
template <class Parts, class RowOf>
std::unique_ptr<text::ChatTemplate> template_if_needed(const Parts& parts, RowOf row_of,
                                                       const v1::Options& o,
                                                       const std::string& dir) {
  for (const auto& part : parts)
    for (const auto& item : part)
      if (const Row& r = row_of(item); r.conversational)
        return load_template_for(o, dir, r.where());
  return nullptr;
}

/// Counts of one kind of row, with the first one's FILE:LINE.
struct Tally {
  explicit Tally(std::string unit) : unit(std::move(unit)) {}
  std::string unit;  ///< what a row is: "pair", "example"
  int64_t n = 0;
  std::string first;
  void add(const std::string& where) {
    if (n++ == 0) first = where;
  }
  /// "N UNIT(s) <what>", plus " (first FILE:LINE)" when N > 0.
  std::string text(const std::string& what) const;
};

/// [train, held out]: the kept rows of the files of paths and of eval_paths (`kept`, indices into
/// the dataset's rows) when eval_paths is set; otherwise kept[0] split by chat::hold_out with
/// split_seed `seed`. Throws v1::ConfigError "CONTEXT: validation_fraction leaves no training
/// UNIT".
std::array<std::vector<int64_t>, 2> split_members(const std::vector<int64_t> (&kept)[2],
                                                  const Sources& sources, uint64_t seed,
                                                  const std::string& context,
                                                  const std::string& unit);

/// table[i] for the batch index i of split `split_name` ("train", "eval"). Throws v1::Error
/// "WHO: SPLIT index I out of range [0, N)" for an index outside the table.
int64_t member_at(const std::vector<int64_t>& table, int64_t i, const char* split_name,
                  const char* who);

}  // namespace trainrun::preference
