// The options, template, counts and split the preference and unpaired datasets share (see
// dataset_setup.hpp).
#include "dataset_setup.hpp"

#include <trainrun/error.hpp>
#include <trainrun/text/template_limits.hpp>

#include <chat_samples.hpp>

namespace trainrun::preference {

using v1::ConfigError;

void declare_source_options(v1::OptionSchema& s, const std::string& paths_help,
                            const std::string& unit, const std::string& conversational) {
  s.add({"paths",
         v1::OptionType::StringList,
         std::monostate{},
         /*required=*/true,
         {},
         {},
         {},
         paths_help});
  s.string_list("eval_paths", {},
                "held-out " + unit + " from these files instead of a validation_fraction of paths");
  s.required_string("tokenizer",
                    "Hugging Face tokenizer directory (tokenizer.json, "
                    "tokenizer_config.json), e.g. the model's own directory");
  s.string("chat_template", "",
           conversational +
               ": \"\" = the tokenizer's own chat template; else a named template of the "
               "tokenizer, a built-in (chatml, llama3, llama2, mistral, alpaca) or a .jinja file");
  text::declare_template_limits(s);
}

void declare_split_options(v1::OptionSchema& s, const std::string& unit) {
  s.real("validation_fraction", 0.0, "fraction of the " + unit + " held out for evaluation", 0.0,
         0.9);
  s.integer("split_seed", 0,
            "seed of the held-out choice (the same seed holds out the same " + unit + ")", 0);
}

Sources read_sources(const v1::Options& o) {
  const std::string context = o.context();
  Sources s;
  s.files = expand_paths(o.get_string_list("paths"), context, "paths");
  const std::vector<std::string>& eval_patterns = o.get_string_list("eval_paths");
  s.fraction = o.get_double("validation_fraction");
  TR_CHECK_TYPED(ConfigError, eval_patterns.empty() || s.fraction == 0.0, context,
                 ": set eval_paths or validation_fraction, not both");
  if (!eval_patterns.empty()) s.eval_files = expand_paths(eval_patterns, context, "eval_paths");
  return s;
}

std::unique_ptr<text::ChatTemplate> load_template_for(const v1::Options& o, const std::string& dir,
                                                      const std::string& where) {
  try {
    return std::make_unique<text::ChatTemplate>(
        text::load_chat_template(dir, o.get_string("chat_template"), text::template_limits(o)));
  } catch (const std::exception& e) {
    throw ConfigError(o.context() + ": chat_template (" + where +
                      " is conversational): " + e.what());
  }
}

std::string Tally::text(const std::string& what) const {
  return std::to_string(n) + " " + unit + (n == 1 ? " " : "s ") + what +
         (n ? " (first " + first + ")" : "");
}

std::array<std::vector<int64_t>, 2> split_members(const std::vector<int64_t> (&kept)[2],
                                                  const Sources& sources, uint64_t seed,
                                                  const std::string& context,
                                                  const std::string& unit) {
  if (!sources.eval_files.empty()) return {kept[0], kept[1]};
  return chat::hold_out(kept[0], sources.fraction, seed, context, unit);
}

int64_t member_at(const std::vector<int64_t>& table, int64_t i, const char* split_name,
                  const char* who) {
  TR_CHECK(i >= 0 && i < static_cast<int64_t>(table.size()), who, ": ", split_name, " index ", i,
           " out of range [0, ", table.size(), ")");
  return table[static_cast<size_t>(i)];
}

}  // namespace trainrun::preference
