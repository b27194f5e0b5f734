#pragma once
// Reward plugin `rewards` (ABI 1.10): the rewards of online RL that need no model, as TRL's
// GRPOTrainer takes reward functions (`reward_funcs`, TRL's trl.rewards accuracy_reward and
// think_format_reward, DAPO's soft overlong punishment) and as a program of the user's.
// Regular expressions are PCRE2's (Perl syntax, which Python's `re` shares for the common cases).
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainrun/options.hpp"
#include "trainrun/reward.hpp"
#include "trainrun/types.hpp"

namespace trainrun::plugins {
namespace rewards {

/// A compiled PCRE2 pattern (UTF-8). Throws ConfigError naming `context` (the option), the
/// offset and PCRE2's message when the pattern does not compile.
class Regex {
 public:
  Regex(const std::string& pattern, uint32_t flags, const std::string& context);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  /// Whether the pattern matches `text` (anchored at both ends when `whole`, else anywhere).
  bool matches(const std::string& text, bool whole) const;
  /// Every non-overlapping match in `text`, left to right: capture group 1 when the pattern has
  /// groups (empty when group 1 did not take part), else the whole match.
  std::vector<std::string> find_all(const std::string& text) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8
  uint32_t groups_ = 0;
};

/// Leading and trailing ASCII whitespace removed.
std::string strip(const std::string& s);
/// `s` as a number when it is one after removing spaces, a leading '+', thousands commas
/// ("1,234.5") and a trailing '.'; nullopt otherwise.
std::optional<double> as_number(const std::string& s);
/// DAPO's soft overlong punishment (Yu et al. 2025, eq. 13; TRL's
/// get_soft_overlong_punishment): 0 up to max_length - cache tokens, then falling linearly to -1
/// at max_length, -1 beyond.
double soft_overlong_punishment(int64_t length, int64_t max_length, int64_t cache);

}  // namespace rewards

/// `accuracy`: 1 when the answer extracted from the completion equals the reference field of the
/// prompt's row, else 0 (TRL's accuracy_reward compares parsed LaTeX; this compares text).
/// Options: field (the reference field, default "solution"), pattern (a regex whose group 1, or
/// whole match, is the answer; its last match counts; "" = the completion's last number),
/// numeric (compare as numbers when both sides are numbers), tolerance (absolute, for numbers),
/// case_sensitive, no_answer ("zero": a completion without an answer scores 0; "none": NaN).
/// The reference is a string or a number; a row without it is a ConfigError naming the row.
class AccuracyReward final : public v1::Reward {
 public:
  static void declare_options(v1::OptionSchema& s);
  AccuracyReward(const v1::Options& o, const v1::RunContext& ctx);
  ~AccuracyReward() override;
  std::vector<double> score(const std::vector<v1::RewardSample>& samples) override;
  std::vector<std::string> required_fields() const override { return {field_}; }
  /// The answer extracted from `completion`; nullopt when there is none.
  std::optional<std::string> extract(const std::string& completion) const;
  /// Whether `answer` equals `reference` after normalisation (strip; case; numbers).
  bool same(const std::string& answer, const std::string& reference) const;

 private:
  std::string field_;
  std::unique_ptr<rewards::Regex> pattern_;
  bool numeric_, case_sensitive_, none_without_answer_;
  double tolerance_;
};

/// `format`: 1 when a regex matches the completion, else 0 (TRL's think_format_reward, with the
/// pattern of your choice). Options: pattern (required), whole (the match must span the whole
/// completion, Python's re.fullmatch; false: anywhere, re.search), dotall ('.' matches newlines,
/// re.DOTALL; default true), multiline ('^' and '$' at every line, re.MULTILINE).
class FormatReward final : public v1::Reward {
 public:
  static void declare_options(v1::OptionSchema& s);
  FormatReward(const v1::Options& o, const v1::RunContext& ctx);
  ~FormatReward() override;
  std::vector<double> score(const std::vector<v1::RewardSample>& samples) override;

 private:
  std::unique_ptr<rewards::Regex> pattern_;
  bool whole_;
};

/// `length`: a penalty on the completion's length L (tokens, RewardSample::completion_ids; or
/// characters, UTF-8 code points). kind "overlong": DAPO's soft overlong punishment
/// (rewards::soft_overlong_punishment, options max_completion_length and soft_punish_cache);
/// kind "linear": -L / max_completion_length (0 for an empty completion, -1 at the maximum).
/// With unit "tokens" a sample without token ids is a ConfigError naming its row.
class LengthReward final : public v1::Reward {
 public:
  static void declare_options(v1::OptionSchema& s);
  LengthReward(const v1::Options& o, const v1::RunContext& ctx);
  std::vector<double> score(const std::vector<v1::RewardSample>& samples) override;

 private:
  bool overlong_, tokens_;
  int64_t max_length_, cache_;
};

/// `command`: a program of the user's, started at the first score() with `command` (argv; a
/// bare program name is searched on PATH) in the job file's directory, and kept running. For each
/// completion it reads one JSON line on stdin, the prompt's row with "prompt", "completion" and
/// "completion_ids" set, and writes one line on stdout: a number, or nan / null / None for no
/// reward. Every answer must come within timeout_s of the previous one (or of the request). The
/// program's stderr is trainrun's. Errors (Error, naming the program and the row): it exits or
/// cannot start, it hangs (killed after timeout_s), it writes something that is not a number, or
/// more lines than it was sent.
class CommandReward final : public v1::Reward {
 public:
  static void declare_options(v1::OptionSchema& s);
  CommandReward(const v1::Options& o, const v1::RunContext& ctx);
  ~CommandReward() override;
  std::vector<double> score(const std::vector<v1::RewardSample>& samples) override;

 private:
  void start();
  /// Stops the program: closes its input and, unless `force`, gives it a second to exit; then
  /// kills its process group. Closes the pipes.
  void stop(bool force);
  /// Reaps the program if it exits within `seconds` (its wait status), killing its process
  /// group's leftovers; nullopt if it is still running.
  std::optional<int> wait_exit(double seconds);
  [[noreturn]] void fail(const std::string& message);
  std::vector<std::string> argv_;
  std::string shown_;  // the command line, for messages
  std::string dir_;    // the job file's directory: the program's working directory
  double timeout_s_;
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string pending_;  // read from the program, not yet consumed
};

}  // namespace trainrun::plugins
