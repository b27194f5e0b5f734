#pragma once
// ABI 1.12: online objectives (GRPO and its variants), which train on completions the model
// generates during training instead of on a fixed dataset's targets, and the prompt datasets they
// generate from.
//
// How a step of an online objective runs (core/src/run/rollout_phase.cpp):
//   1. Every num_iterations optimizer steps, a rollout: the core takes this rank's prompts for the
//      step from the sampler (global_batch_size / num_generations prompts over all ranks, each
//      prompt's num_generations completions on one rank), asks the dataset (a PromptSource) for
//      their tokens and rows, and generates with the model's KV-cache decoder
//      (batch_generation.hpp) in evaluation mode, adapters active.
//   2. The core decodes the completions (PromptSource::decode), scores them with the job's
//      [[rewards]] (reward.hpp) and hands the scores to OnlineObjective::begin_rollout, which
//      returns nothing but records what it needs (advantages, TRL's group normalisation).
//   3. The rollout's rows (prompt + completion, targets on the completion's tokens only) are cut
//      into the step's micro-batches. Before training on them the core runs, under no_grad,
//      ObjectivePass::Old passes of the current model when RolloutSpec::old_logps says so
//      (num_iterations > 1: the importance ratio's denominator), and ObjectivePass::Reference
//      passes (adapters off under LoRA) when RolloutSpec::reference says so (beta > 0).
//   4. Then the optimizer steps run as for any objective: ObjectiveForward::indices are the
//      completions' indices within the rollout (0 .. completions on this rank - 1), and
//      Objective::compute returns the loss sum over Batch::num_targets units (one per
//      completion).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trainrun/reward.hpp"
#include "trainrun/types.hpp"

namespace trainrun::v1 {

class Communicator;

/// ABI 1.12. One prompt of a prompt dataset, as the model is to be prompted with it.
struct PromptSample {
  /// Token ids (the tokenizer's vocabulary) the completion continues, after the chat template
  /// (with its generation prompt) where the row is a conversation. Never empty.
  std::vector<int64_t> ids;
  /// The same prompt as text (what a reward sees as RewardSample::prompt).
  std::string text;
  /// The dataset row as one compact JSON object (RewardSample::row): every field, so rewards can
  /// read reference answers.
  std::string row;
  /// The row's 0-based index in its file (RewardSample::row_index), -1 when unknown.
  int64_t row_index = -1;
};

/// ABI 1.12. A Dataset of prompts (DataInfo::task "prompts"): what an online objective generates
/// from. Found with dynamic_cast on the Dataset; Dataset::size counts prompts. Dataset::batch
/// of a prompt dataset is not used by the training loop.
class PromptSource {
 public:
  virtual ~PromptSource() = default;
  /// The prompt at `index` of `split`. Throws Error for an index out of range.
  virtual PromptSample prompt(Split split, int64_t index) const = 0;
  /// Generated ids -> text, without special tokens (as transformers' batch_decode with
  /// skip_special_tokens=True, which TRL's rewards read).
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  /// The ids that end a completion (the tokenizer's and generation_config.json's EOS tokens).
  virtual std::vector<int64_t> eos_token_ids() const = 0;
  /// The id that pads rows (the tokenizer's pad token, else its EOS token).
  virtual int64_t pad_token_id() const = 0;
};

/// ABI 1.12. How an online objective wants its completions generated and used (TRL
/// GRPOConfig's names). Read once, after the objective is created.
struct RolloutSpec {
  /// Completions per prompt (a group); global_batch_size must be a multiple of it times the
  /// world size, so that each group lies on one rank.
  int64_t num_generations = 8;
  /// New tokens per completion at most.
  int64_t max_completion_length = 256;
  /// Sampling (batch_generation.hpp's GenerationRequest): softmax(logits / temperature) after
  /// top_k and top_p; temperature > 0.
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  /// Optimizer steps trained on each rollout (TRL's num_iterations, the μ of the GRPO paper).
  int64_t num_iterations = 1;
  /// Whether the objective needs ObjectivePass::Old passes (the policy's log-probabilities at
  /// rollout time, the importance ratio's denominator); without them the ratio is 1 by
  /// construction and the objective uses the current log-probabilities detached, as TRL does.
  bool old_logps = false;
  /// Whether it needs ObjectivePass::Reference passes (the KL term: beta > 0).
  bool reference = false;
};

/// ABI 1.12. What the core hands an online objective after scoring one rollout on this rank.
struct RolloutScores {
  /// float64 [N] on the CPU: TRL's combined reward of each completion (the weighted nansum over
  /// the rewards, RewardSet::combine). N = prompts x num_generations, prompt-major: completions
  /// g * num_generations .. (g + 1) * num_generations - 1 answer the same prompt.
  at::Tensor rewards;
  /// float64 [N, rewards] on the CPU: each reward's own score (NaN where it gave none), and the
  /// rewards' names in metrics (the [[rewards]] entries' names).
  at::Tensor per_reward;
  std::vector<std::string> reward_names;
  /// int64 [N]: tokens generated per completion (EOS included); bool [N]: whether it ended
  /// without an EOS or stop string (truncated at max_completion_length).
  at::Tensor completion_lengths;
  at::Tensor truncated;
  int64_t num_generations = 1;
};

/// ABI 1.12. The capability of an Objective that trains online (Objective::task() "prompts").
/// Found with dynamic_cast on the Objective.
class OnlineObjective {
 public:
  virtual ~OnlineObjective() = default;
  virtual RolloutSpec rollout_spec() const = 0;
  /// After each rollout, before any pass over its completions: the objective computes what it
  /// needs per completion (GRPO's advantages) and records its rollout metrics. `comm` is the
  /// job's communicator when the world has more than one rank (every rank calls this at the same
  /// point, so a collective meets its peers: batch-wide reward statistics), else null. Throws
  /// Error naming the completion when a reward is not finite.
  virtual void begin_rollout(const RolloutScores& scores, Communicator* comm) = 0;
};

/// ABI 1.12. An Objective whose log-probabilities are those of logits / temperature (TRL's GRPO
/// scores completions at the temperature it sampled them with). Found with dynamic_cast by the
/// model, which divides the logits before the log-softmax; a model built against an older SDK
/// does not, so the core refuses such an objective with it unless the temperature is 1.
class LogitTemperature {
 public:
  virtual ~LogitTemperature() = default;
  /// > 0.
  virtual double logit_temperature() const = 0;
};

}  // namespace trainrun::v1
