// The "keyword-reward" reward: the fraction of `keywords` a completion contains, minus `penalty`
// per banned word it contains; NaN (no reward) for an empty completion when skip_empty is set.
// Matching is ASCII case-insensitive unless case_sensitive; with whole_words a keyword counts
// only between non-alphanumeric characters.
#include <trainrun/trainrun.hpp>

#include <cctype>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace tr = trainrun::v1;

class KeywordReward : public tr::Reward {
 public:
  static void declare_options(tr::OptionSchema& schema) {
    schema.string_list("keywords", {}, "words a good completion contains; at least one");
    schema.string_list("banned", {}, "words that cost `penalty` each when present");
    schema.real("penalty", 1.0, "subtracted once per banned word present", 0.0);
    schema.boolean("case_sensitive", false, "match with case (default: ASCII case-insensitive)");
    schema.boolean("whole_words", true, "a keyword counts only as a whole word");
    schema.boolean("skip_empty", false, "an empty completion gets no reward (NaN) instead of 0");
  }

  KeywordReward(const tr::Options& o, const tr::RunContext&)
      : keywords_(o.get_string_list("keywords")),
        banned_(o.get_string_list("banned")),
        penalty_(o.get_double("penalty")),
        case_sensitive_(o.get_bool("case_sensitive")),
        whole_words_(o.get_bool("whole_words")),
        skip_empty_(o.get_bool("skip_empty")) {
    // Refused here, so `trainrun check` reports it before anything runs (exit 2).
    if (keywords_.empty())
      throw tr::ConfigError(o.context() + ": option 'keywords' needs at least one word");
    for (const auto& w : keywords_)
      if (w.empty()) throw tr::ConfigError(o.context() + ": option 'keywords' has an empty word");
  }

  std::vector<double> score(const std::vector<tr::RewardSample>& samples) override {
    std::vector<double> out;
    out.reserve(samples.size());
    for (const auto& s : samples) {
      if (skip_empty_ && s.completion.empty()) {
        out.push_back(std::numeric_limits<double>::quiet_NaN());
        continue;
      }
      const std::string text = fold(s.completion);
      double found = 0;
      for (const auto& w : keywords_) found += contains(text, fold(w));
      double reward = found / static_cast<double>(keywords_.size());
      for (const auto& w : banned_)
        if (contains(text, fold(w))) reward -= penalty_;
      out.push_back(reward);
    }
    return out;
  }

 private:
  std::string fold(std::string s) const {
    if (!case_sensitive_)
      for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  bool contains(const std::string& text, const std::string& word) const {
    const auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
    for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
      if (!whole_words_) return true;
      const size_t end = at + word.size();
      if ((at == 0 || !word_char(text[at - 1])) && (end == text.size() || !word_char(text[end])))
        return true;
    }
    return false;
  }

  std::vector<std::string> keywords_, banned_;
  double penalty_;
  bool case_sensitive_, whole_words_, skip_empty_;
};

}  // namespace

TRAINRUN_PLUGIN("keyword-reward", "1.0.0",
                trainrun::v1::component<trainrun::v1::Reward, KeywordReward>(
                    "keyword-reward", "the fraction of listed keywords a completion contains"))
