// Rewards `accuracy`, `format` and `length` (rewards.hpp), and the PCRE2 wrapper they share.
#include "rewards.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "trainrun/error.hpp"

namespace trainrun::plugins {
namespace rewards {

namespace {
pcre2_code* code(void* p) { return static_cast<pcre2_code*>(p); }

// "row 3" (or "sample 3" when the caller gave no row index), for messages.
std::string row_of(const v1::RewardSample& s, size_t position) {
  return s.row_index >= 0 ? "row " + std::to_string(s.row_index)
                          : "sample " + std::to_string(position);
}
}  // namespace

Regex::Regex(const std::string& pattern, uint32_t flags, const std::string& context) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // Completions decoded from sampled tokens may hold broken UTF-8: matched around, not refused.
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        flags | PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!code_) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw v1::ConfigError(context + ": the regular expression does not compile at offset " +
                          std::to_string(offset) + ": " + reinterpret_cast<const char*>(message));
  }
  pcre2_pattern_info(code(code_), PCRE2_INFO_CAPTURECOUNT, &groups_);
}

Regex::~Regex() { pcre2_code_free(code(code_)); }

bool Regex::matches(const std::string& text, bool whole) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code(code_), nullptr);
  const int rc = pcre2_match(code(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                             whole ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0, md, nullptr);
  pcre2_match_data_free(md);
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
    throw v1::Error("PCRE2 failed to match (error " + std::to_string(rc) + ")");
  return rc >= 0;
}

std::vector<std::string> Regex::find_all(const std::string& text) const {
  std::vector<std::string> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code(code_), nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(code(code_), subject, text.size(), start, 0, md, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const uint32_t g = groups_ > 0 ? 1 : 0;
    if (g == 0 || (rc > 1 && ov[2] != PCRE2_UNSET))
      out.push_back(text.substr(ov[2 * g], ov[2 * g + 1] - ov[2 * g]));
    else
      out.emplace_back();
    // An empty match moves on by one byte, as Python's re.findall moves on by one character.
    start = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
  }
  pcre2_match_data_free(md);
  return out;
}

std::string strip(const std::string& s) {
  const auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  size_t b = 0, e = s.size();
  while (b < e && space(s[b])) ++b;
  while (e > b && space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::optional<double> as_number(const std::string& text) {
  std::string t;
  for (char c : strip(text))
    if (c != ',' && c != ' ') t += c;
  if (!t.empty() && t[0] == '+') t.erase(0, 1);
  if (!t.empty() && t.back() == '.') t.pop_back();
  if (t.empty() || !std::any_of(t.begin(), t.end(),
                                [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return std::nullopt;
  // Decimal notation only: strtod would also take "inf", "nan" and hexadecimal.
  for (char c : t)
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != 'e' &&
        c != 'E' && c != '+')
      return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return v;
}

double soft_overlong_punishment(int64_t length, int64_t max_length, int64_t cache) {
  if (length <= max_length - cache) return 0.0;
  if (length <= max_length) return static_cast<double>(max_length - cache - length) / cache;
  return -1.0;
}

}  // namespace rewards

using rewards::Regex;

namespace {
// The default answer of `accuracy`: a number, with optional sign, thousands commas and decimals.
constexpr const char* kNumber = R"([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)";

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

void AccuracyReward::declare_options(v1::OptionSchema& s) {
  s.string("field", "solution", "the prompt row's field holding the reference answer");
  s.string("pattern", "",
           "regex whose capture group 1 (or whole match) is the answer, last match counted; "
           "empty: the completion's last number");
  s.boolean("numeric", true, "compare as numbers when answer and reference both are numbers");
  s.real("tolerance", 0.0, "largest absolute difference of equal numbers", 0.0);
  s.boolean("case_sensitive", false, "compare text with its case");
  s.boolean("dotall", true, "'.' in pattern matches newlines too (Python's re.DOTALL)");
  s.choice("no_answer", "zero", {"zero", "none"},
           "a completion without an answer: scores 0, or gets no reward (NaN)");
}

AccuracyReward::AccuracyReward(const v1::Options& o, const v1::RunContext&)
    : field_(o.get_string("field")),
      numeric_(o.get_bool("numeric")),
      case_sensitive_(o.get_bool("case_sensitive")),
      none_without_answer_(o.get_string("no_answer") == "none"),
      tolerance_(o.get_double("tolerance")) {
  if (field_.empty()) throw v1::ConfigError(o.context() + ": option 'field' must not be empty");
  const std::string& p = o.get_string("pattern");
  pattern_ =
      std::make_unique<Regex>(p.empty() ? kNumber : p, o.get_bool("dotall") ? PCRE2_DOTALL : 0,
                              o.context() + ": option 'pattern'");
}

AccuracyReward::~AccuracyReward() = default;

std::optional<std::string> AccuracyReward::extract(const std::string& completion) const {
  const auto all = pattern_->find_all(completion);
  if (all.empty()) return std::nullopt;
  return all.back();
}

bool AccuracyReward::same(const std::string& answer, const std::string& reference) const {
  if (numeric_) {
    const auto a = rewards::as_number(answer), r = rewards::as_number(reference);
    if (a && r) return std::fabs(*a - *r) <= tolerance_;
  }
  const std::string a = rewards::strip(answer), r = rewards::strip(reference);
  return case_sensitive_ ? a == r : lower(a) == lower(r);
}

std::vector<double> AccuracyReward::score(const std::vector<v1::RewardSample>& samples) {
  std::vector<double> out;
  out.reserve(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    const auto row = nlohmann::json::parse(s.row, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object() || !row.contains(field_))
      throw v1::ConfigError(rewards::row_of(s, i) + " has no field '" + field_ +
                            "' (option 'field') to compare the answer with");
    const auto& ref = row[field_];
    if (!ref.is_string() && !ref.is_number())
      throw v1::ConfigError(rewards::row_of(s, i) + ": field '" + field_ +
                            "' must be a string or a number, got " + ref.dump());
    const std::string reference = ref.is_string() ? ref.get<std::string>() : ref.dump();
    const auto answer = extract(s.completion);
    if (!answer)
      out.push_back(none_without_answer_ ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    else
      out.push_back(same(*answer, reference) ? 1.0 : 0.0);
  }
  return out;
}

void FormatReward::declare_options(v1::OptionSchema& s) {
  s.required_string("pattern",
                    "regex over the completion, e.g. ^<think>.*?</think>\\s*<answer>.*?</answer>$");
  s.boolean("whole", true, "the match spans the whole completion (re.fullmatch); false: anywhere");
  s.boolean("dotall", true, "'.' matches newlines too (re.DOTALL)");
  s.boolean("multiline", false, "'^' and '$' match at every line (re.MULTILINE)");
}

FormatReward::FormatReward(const v1::Options& o, const v1::RunContext&)
    : whole_(o.get_bool("whole")) {
  const uint32_t flags =
      (o.get_bool("dotall") ? PCRE2_DOTALL : 0) | (o.get_bool("multiline") ? PCRE2_MULTILINE : 0);
  pattern_ =
      std::make_unique<Regex>(o.get_string("pattern"), flags, o.context() + ": option 'pattern'");
}

FormatReward::~FormatReward() = default;

std::vector<double> FormatReward::score(const std::vector<v1::RewardSample>& samples) {
  std::vector<double> out;
  out.reserve(samples.size());
  for (const auto& s : samples) out.push_back(pattern_->matches(s.completion, whole_) ? 1.0 : 0.0);
  return out;
}

void LengthReward::declare_options(v1::OptionSchema& s) {
  s.choice("kind", "overlong", {"overlong", "linear"},
           "overlong: DAPO's soft overlong punishment; linear: -length / max_completion_length");
  s.integer("max_completion_length", 0,
            "the length that scores -1 (the generation's max_completion_length); required", 0);
  s.integer("soft_punish_cache", 0,
            "kind overlong: the last tokens before max_completion_length over which the penalty "
            "falls from 0 to -1 (DAPO's L_cache; TRL's soft_punish_cache)",
            0);
  s.choice("unit", "tokens", {"tokens", "characters"},
           "what is counted: completion token ids, or UTF-8 characters of the text");
}

LengthReward::LengthReward(const v1::Options& o, const v1::RunContext&)
    : overlong_(o.get_string("kind") == "overlong"),
      tokens_(o.get_string("unit") == "tokens"),
      max_length_(o.get_int("max_completion_length")),
      cache_(o.get_int("soft_punish_cache")) {
  if (max_length_ < 1)
    throw v1::ConfigError(o.context() + ": option 'max_completion_length' must be set (>= 1)");
  if (overlong_ && (cache_ < 1 || cache_ > max_length_))
    throw v1::ConfigError(o.context() + ": option 'soft_punish_cache' must be in [1, " +
                          std::to_string(max_length_) + "] (max_completion_length), got " +
                          std::to_string(cache_));
}

std::vector<double> LengthReward::score(const std::vector<v1::RewardSample>& samples) {
  std::vector<double> out;
  out.reserve(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    int64_t length = 0;
    if (tokens_) {
      if (s.completion_ids.empty() && !s.completion.empty())
        throw v1::ConfigError(rewards::row_of(s, i) +
                              ": no completion token ids to count (unit = \"tokens\"); use unit "
                              "= \"characters\" for text without them");
      length = static_cast<int64_t>(s.completion_ids.size());
    } else {
      for (unsigned char c : s.completion) length += (c & 0xC0) != 0x80;  // UTF-8 lead bytes
    }
    out.push_back(overlong_ ? rewards::soft_overlong_punishment(length, max_length_, cache_)
                            : -static_cast<double>(length) / static_cast<double>(max_length_));
  }
  return out;
}

}  // namespace trainrun::plugins
