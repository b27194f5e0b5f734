#pragma once
// ABI 1.10: rewards for online reinforcement learning as components ([[rewards]] in the job),
// the counterpart of TRL's GRPOTrainer `reward_funcs` and `reward_weights`.
//
// A job lists any number of rewards, each a plugin with its options and a weight:
//
//   [[rewards]]
//   plugin = "accuracy"       # a Reward component
//   weight = 1.0              # the core's key (TRL's reward_weights), default 1
//   name = "answer"           # the core's key: the name in metrics, default the plugin's name
//   field = "solution"        # the rest are the component's options
//
// The core creates each one once per rank (trainrun check creates them too, so a bad option a
// constructor refuses exits 2 before anything runs), asks every reward for a score of each
// completion, and combines them as TRL does: the weighted sum over the rewards, a NaN left out
// (torch.nansum), so a reward that does not apply to a completion gives it no reward rather than
// zero. The per-reward scores are logged as rewards/<name>/mean and rewards/<name>/std.
//
// Nothing here depends on LibTorch: a reward sees text, token ids and the prompt's dataset row.
#include <cstdint>
#include <string>
#include <vector>

namespace trainrun::v1 {

/// ABI 1.10. One completion to score, with the prompt it answers (TRL passes a reward function
/// `prompts`, `completions`, `completion_ids` and the dataset's other columns as keyword
/// arguments; here they travel together, one sample per completion).
struct RewardSample {
  /// The prompt's dataset row as one JSON object, in compact text: every field of the row (the
  /// prompt itself included, and the reference fields a reward compares with, e.g. "solution").
  /// A reward parses the fields it reads; "{}" when the prompt came without a row.
  std::string row;
  /// The prompt as the model saw it (after the chat template, if any), UTF-8.
  std::string prompt;
  /// The generated text, UTF-8, decoded without special tokens, stop string included if one
  /// ended it.
  std::string completion;
  /// The generated token ids (the tokenizer's vocabulary), without padding; may be empty when
  /// the caller has text only (`trainrun reward` on a JSONL file without "completion_ids").
  std::vector<int64_t> completion_ids;
  /// Where the row came from, for error messages: its 0-based index in its dataset or input
  /// file, -1 when unknown.
  int64_t row_index = -1;
};

/// ABI 1.10. A reward function: scores completions. Created once per rank from the options of its
/// [[rewards]] table (plugin.hpp's component<Reward, Impl>); used from one thread at a time.
class Reward {
 public:
  virtual ~Reward() = default;
  /// One score per sample, in the order of `samples` (the same length). Units are the reward's
  /// own (the core only weights and sums them). NaN means "no reward for this completion" (a
  /// TRL reward function's None): it is left out of the weighted sum and of the reward's
  /// statistics. Throws ConfigError for bad input that names the sample (RewardSample::row_index)
  /// and what is wrong, e.g. a row without the field the reward compares with; Error when the
  /// reward itself fails (an external program that exits or hangs). Never returns a silent 0 for
  /// a sample it could not score.
  virtual std::vector<double> score(const std::vector<RewardSample>& samples) = 0;
  /// Fields every row must have for this reward (e.g. the reference answer's field), so a
  /// dataset can be checked before anything is generated. Default: none.
  virtual std::vector<std::string> required_fields() const { return {}; }
};

// The reward model trained by the `reward` objective (a directory written by a run with
// [model] architecture = "sequence_classification", read by `trainrun score`) is a model, so it
// cannot be a reward plugin: plugins never load one another. The hook for it is the core, which
// can: it would offer a built-in reward "reward-model" (option `model`, an HF directory) that
// implements this interface by tokenizing prompt + completion and calling
// SequenceClassifier::scores (objective.hpp), as `trainrun score` does. Not built yet.

}  // namespace trainrun::v1
