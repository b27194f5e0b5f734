#pragma once
// ABI 1.8: the training objective as a component ([objective] plugin = "..."), and the model
// capability it computes from. Without an [objective] table (or with plugin = "sft") a run trains
// on the model's own next-token cross-entropy, exactly as before ABI 1.8.
//
// How a step runs with an objective (core/src/run/step.cpp, evaluate.cpp):
//   1. The core calls Objective::begin_forward with the micro-batch's split, sample indices and
//      pass, then Strategy::forward(batch) as always.
//   2. The model (an ObjectiveModel, e.g. llama) runs its trunk, computes TokenLogProbs for the
//      batch's targets and returns Objective::compute(log_probs, batch) as its ModelOutput. Every
//      strategy works unchanged: it only sees a model whose forward returns a loss.
//   3. An objective that compares with a reference model (DPO) gets a Reference pass first, under
//      no_grad: with LoRA the same model with its adapters switched off (AdapterSwitch, PEFT's
//      disable_adapter()), else the initial model once before training (precomputed, cached in
//      <run_dir>/reference_logps.safetensors). The core keeps what take_reference() returns and
//      hands it back in the Policy pass (ObjectiveForward::reference).
//   4. After each optimizer step (and each evaluation) the core sums take_metrics() over the ranks
//      and logs sum / count under the metric's name (StepMetrics::extra, metrics.jsonl,
//      TensorBoard), as TRL logs its trainers' metrics.
// The loss convention is the core's (types.hpp ModelOutput): compute() returns the SUM of the loss
// over the batch's Batch::num_targets loss units (pairs, for a preference dataset), and the core
// divides by the units of the whole global batch, so accumulation and world size change nothing.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/types.hpp"

namespace trainrun::v1 {

class Communicator;

/// ABI 1.8. What a model computes for an objective on one micro-batch of R rows and T positions
/// (Batch::input [R, T]): one row per sequence. Since ABI 1.10 a batch may pack its sequences
/// (Batch::segment_ids, e.g. the preference dataset's padding_free); the model then hands the
/// objective one row per sequence all the same, R = the sequences in row-major order and T the
/// longest one's positions (model/token_log_probs.hpp per_sequence), so an objective reads the
/// same rows padded or packed. Positions whose target is kIgnoreIndex hold 0 in every per-token
/// tensor.
struct TokenLogProbs {
  /// float32 [R, T]: log p(target[r, t] | input[r, 0..t]), log-softmax over the vocabulary in
  /// float32. Differentiable (with respect to the parameters) when grad mode is on.
  at::Tensor token_logps;
  /// float32 [R]: token_logps summed over each row (TRL's "logps").
  at::Tensor logps;
  /// int64 [R]: targets counted per row (target != kIgnoreIndex).
  at::Tensor num_tokens;
  /// float32 [R, T], no gradient; filled when wanted_statistics() has kEntropy: entropy of the
  /// predicted distribution at each counted position (nats).
  at::Tensor entropy;
  /// float32 [R, T], no gradient; kMeanLogits: the mean of the logits over the vocabulary.
  at::Tensor mean_logits;
  /// bool [R, T]; kTop1: whether the target is the arg-max of the logits.
  at::Tensor is_top1;
  // ---- ABI 1.9 ----
  /// float32 [R, num_labels], differentiable; filled instead of everything above when
  /// wanted_statistics() has kScores: the sequence-classification head (transformers'
  /// *ForSequenceClassification `score`) applied to each row's last token that is not the
  /// model's pad token (SequenceClassifier::pad_token_id), as transformers pools it. Only a
  /// model that is a SequenceClassifier (ABI >= 1.9) fills it; the core refuses an objective
  /// wanting kScores with any other model, so an objective never reads it from an older model.
  at::Tensor scores;
};

/// ABI 1.8. Which pass of a micro-batch a forward is.
enum class ObjectivePass {
  Policy,     ///< the trained model; compute() returns the loss
  Reference,  ///< the reference model under no_grad; compute() records what take_reference()
              ///< returns (an online objective, rollout.hpp: records its per-token values)
  Old,        ///< ABI 1.12, online objectives only (rollout.hpp): the policy under no_grad right
              ///< after a rollout; compute() records the per-token log-probabilities and
              ///< returns a zero loss
};

/// ABI 1.8. What the core tells an objective before each forward. Fields are only ever appended.
struct ObjectiveForward {
  Split split = Split::Train;
  ObjectivePass pass = ObjectivePass::Policy;
  /// The dataset indices (in `split`) of the micro-batch's samples, in batch order; a rank with
  /// nothing left to evaluate runs a filler batch whose result is discarded (filler = true).
  std::vector<int64_t> indices;
  bool filler = false;
  /// Policy pass of an objective with reference_width() > 0: float64 [samples, reference_width()],
  /// what take_reference() returned for these samples. Undefined otherwise.
  at::Tensor reference;
  // ---- ABI 1.9 ----
  /// Policy passes with more than one rank: the job's communicator (interfaces.hpp), for an
  /// all-reduce of a few values inside compute() (KTO's batch KL estimate, which TRL averages
  /// over the processes). Every rank runs the same sequence of policy passes, filler batches
  /// included, so a collective issued there meets its peers; reference passes do not (the
  /// precomputed one is rank-strided), and there it is null, as with one rank.
  Communicator* comm = nullptr;
  // ---- ABI 1.10 ----
  /// Per-sample values of the dataset (SampleValues below), for these samples in batch order:
  /// float64 [samples, sample_value_names.size()] on the CPU; undefined, with no names, when the
  /// dataset gives none. TRL's RewardTrainer reads its "margin" column from here.
  at::Tensor sample_values;
  std::vector<std::string> sample_value_names;
};

/// ABI 1.8. One logged figure: the core sums `sum` and `count` over the ranks and logs
/// sum / count (count 0: not logged).
struct ObjectiveMetric {
  std::string name;  ///< TRL's name where TRL logs it: "rewards/chosen", "logps/rejected", ...
  double sum = 0;
  double count = 0;
};

/// ABI 1.8. The training objective. Created once per rank; used from the training thread only.
class Objective {
 public:
  virtual ~Objective() = default;
  /// Optional per-token figures the model should fill in TokenLogProbs (bits below).
  static constexpr uint32_t kEntropy = 1, kMeanLogits = 2, kTop1 = 4;
  /// ABI 1.9: the model computes TokenLogProbs::scores (its score head at each row's last
  /// non-padding token) and no log-probabilities: reward models (Bradley-Terry).
  static constexpr uint32_t kScores = 8;

  /// The DataInfo::task it trains on ("preference"); the core refuses a dataset of another task
  /// before anything runs (exit 2).
  virtual std::string task() const = 0;
  /// Values per sample it needs from the reference model (0: reference-free, e.g. SimPO, ORPO;
  /// DPO: 2, the chosen and rejected log-probabilities).
  virtual int64_t reference_width() const { return 0; }
  /// Bits of kEntropy | kMeanLogits | kTop1 | kScores it reads.
  virtual uint32_t wanted_statistics() const { return 0; }
  /// Before every forward of the model (training, evaluation, reference passes).
  virtual void begin_forward(const ObjectiveForward& forward) = 0;
  /// Called by the model inside its forward. Policy pass: ModelOutput::loss_sum, a float32
  /// scalar, the sum of the loss over the batch's Batch::num_targets units, differentiable
  /// through lp.token_logps; num_correct counts units judged right (DPO: pairs whose chosen
  /// reward beats the rejected one; -1 where that means nothing), the evaluation's accuracy.
  /// Reference pass: records the reference values and returns a zero loss. Throws Error naming
  /// the samples (ObjectiveForward::indices) when the batch cannot be scored, e.g. a row without
  /// a counted target.
  virtual ModelOutput compute(const TokenLogProbs& lp, const Batch& batch) = 0;
  /// After a Reference pass: float64 [samples, reference_width()] on the CPU.
  virtual at::Tensor take_reference() {
    throw NotSupportedError("this objective needs no reference model");
  }
  /// The figures gathered since the last call for `split` (the core calls it after every
  /// optimizer step for Train and after every evaluation for Eval), then forgets them.
  virtual std::vector<ObjectiveMetric> take_metrics(Split split) = 0;
};

/// ABI 1.8. A Model that computes TokenLogProbs for an objective. After set_objective(o) (o not
/// null) forward(batch) computes the trunk and head as before, the log-probabilities of
/// batch.target, and returns o->compute(...); set_objective(nullptr) restores the model's own
/// loss. Found with dynamic_cast; the core calls it once, before Strategy::setup.
class ObjectiveModel {
 public:
  virtual ~ObjectiveModel() = default;
  virtual void set_objective(Objective* objective) = 0;
};

/// ABI 1.8. A Callback that added adapters to the model (lora) and can switch them off, so the
/// model computes as its base model did: the reference model of DPO under LoRA without a second
/// copy (PEFT's disable_adapter()). Found with dynamic_cast.
class AdapterSwitch {
 public:
  virtual ~AdapterSwitch() = default;
  /// false: every adapter this callback added contributes nothing until switched on again.
  virtual void set_adapters_enabled(bool enabled) = 0;
  /// Whether it added any adapter to the model (on_setup has run).
  virtual bool has_adapters() const = 0;
};

/// ABI 1.9. A Model with a sequence-classification head (transformers'
/// LlamaForSequenceClassification: `score`, a bias-free Linear hidden -> num_labels, read at the
/// last token of each row that is not pad_token_id). Found with dynamic_cast; the core requires it
/// of the model when the objective wants Objective::kScores.
class SequenceClassifier {
 public:
  virtual ~SequenceClassifier() = default;
  /// Outputs of the score head (1 for a reward model); 0 when the model has no score head (it is
  /// a causal LM this run), which the core treats as absent.
  virtual int64_t num_labels() const = 0;
  /// The token id whose positions do not count when pooling (config.json's pad_token_id), -1 when
  /// there is none: the last position of every row is read then.
  virtual int64_t pad_token_id() const = 0;
  /// The score head at each row's pooled position, without an objective (`trainrun score`):
  /// batch.input int64 [B, T] -> float32 [B, num_labels()]. Differentiable when grad mode is on.
  /// Throws Error when the model has no score head.
  virtual at::Tensor scores(const Batch& batch) = 0;
};

/// ABI 1.9. A figure reduced by minimum or maximum instead of a mean (TRL's RewardTrainer logs
/// min_reward and max_reward): `values` holds one value per micro-batch (evaluation: per
/// evaluation batch, a filler batch pushing +inf for a minimum, -inf for a maximum) in order.
/// The core takes the minimum (maximum) over the ranks of each micro-batch's value, then logs the
/// mean over the micro-batches, which is what TRL logs for a global batch gathered per micro-batch.
struct ObjectiveExtreme {
  std::string name;
  bool maximum = false;  ///< false: minimum over the ranks
  std::vector<double> values;
};

/// ABI 1.9. An Objective that logs ObjectiveExtreme figures besides its take_metrics() means.
/// Found with dynamic_cast; every rank must return the same names with the same number of values.
class ObjectiveExtremes {
 public:
  virtual ~ObjectiveExtremes() = default;
  /// The figures gathered since the last call for `split` (called right after take_metrics).
  virtual std::vector<ObjectiveExtreme> take_extremes(Split split) = 0;
};

/// ABI 1.10. A Dataset whose samples carry values an objective reads besides the tokens (the
/// `preference` dataset's per-pair "margin" column, TRL RewardTrainer's). Found with
/// dynamic_cast; the core hands the values of each micro-batch's samples to the objective in
/// ObjectiveForward::sample_values before every forward.
class SampleValues {
 public:
  virtual ~SampleValues() = default;
  /// The values every sample has, by name ("margin"); empty when this run's data has none.
  virtual std::vector<std::string> sample_value_names() const = 0;
  /// float64 [indices.size(), sample_value_names().size()] on the CPU for the samples `indices`
  /// of `split` (the indices of Dataset::batch). Throws Error for an index out of range.
  virtual at::Tensor sample_values(Split split, const std::vector<int64_t>& indices) const = 0;
};

}  // namespace trainrun::v1
