#pragma once
// Plain data exchanged between the core and components: batches, model outputs, run context,
// training plan and metrics; and the dtype vocabulary (names, what communicators carry).
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trainrun::v1 {

/// Short dtype name as users write it: "float32", "bfloat16", "uint8", ... (c10's name for
/// anything else).
inline std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::Undefined: return "undefined";
    default: return c10::toString(t);
  }
}

/// The dtypes every shipped Communicator carries (float32, float64, bfloat16, float16, int32,
/// int64, uint8); a strategy sends anything else as uint8 bytes (broadcast, gather) or refuses.
inline bool communicator_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::BFloat16:
    case c10::ScalarType::Half:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
    case c10::ScalarType::Byte: return true;
    default: return false;
  }
}

/// A tensor with its dotted name as in a state dict ("blocks.0.attn.qkv.weight").
struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

/// What a dataset provides, so a model can size itself.
/// task: "classification" (input float32 [B, sample_shape...], target int64 [B] in
/// [0, num_classes)) or "language_modeling" (input int64 [B, T], target int64 [B, T] in
/// [0, vocab_size)).
struct DataInfo {
  std::string task;
  std::vector<int64_t> sample_shape;  ///< shape of one input sample, without the batch dimension
  int64_t num_classes = 0;            ///< classification only
  int64_t vocab_size = 0;             ///< language modelling only
};

/// Which part of a dataset a batch is drawn from.
enum class Split { Train, Eval };

/// Target value of a position the loss ignores (prompt tokens, padding): transformers' label
/// convention and LibTorch's default cross_entropy ignore_index, so cross_entropy_sum() and any
/// model built on at::cross_entropy_loss skip it without knowing about masks.
constexpr int64_t kIgnoreIndex = -100;

/// One micro-batch. Tensors live on the CPU; the strategy moves them to the device.
///
/// Layout and ABI: the first five fields are ABI 1.0; position_ids and segment_ids were appended
/// in ABI 1.6 and are only ever appended to. A Batch made or copied by a component built against
/// an older SDK ends before them, so the core never hands such a copy to a reader of the 1.6
/// fields (see BatchFieldsReader) and converts batches of older datasets (core/src/trainer.cpp).
struct Batch {
  at::Tensor input;   ///< classification: float32 [B, ...]; language modelling: int64 [B, T]
  /// classification: int64 [B]; language modelling: int64 [B, T], the next token at each
  /// position, or kIgnoreIndex where the position does not count in the loss.
  at::Tensor target;
  int64_t num_samples = 0;  ///< B (samples; a packed row may hold several, see segment_ids)
  /// Target elements the loss counts: those != kIgnoreIndex (B, or B*T without masking). The
  /// core normalises the loss by their sum over the whole global batch.
  int64_t num_targets = 0;
  int64_t num_tokens = 0;   ///< input tokens for token models (B*T less any padding), 0 otherwise
  // ---- ABI 1.6 ----
  /// int64 [B, T]: position of each token within its sample (restarts at 0 for every sample of a
  /// packed row), for positional embeddings / RoPE as transformers' position_ids. Undefined:
  /// 0..T-1 in every row.
  at::Tensor position_ids;
  /// int64 [B, T]: which sample of the row a token belongs to (packing). A token attends only to
  /// earlier-or-equal tokens with the same segment id in the same row (block-diagonal causal
  /// mask); padding carries a segment id of its own. Undefined: one sample per row.
  at::Tensor segment_ids;
};

/// A model's forward result on one micro-batch.
/// loss_sum: float32 scalar, the SUM of per-target losses over the batch (not the mean), so the
/// core can normalise by the number of targets in the whole global batch: accumulation and
/// world size then leave the gradient unchanged.
/// num_correct: correctly classified targets, or -1 where accuracy does not apply.
struct ModelOutput {
  at::Tensor loss_sum;
  int64_t num_correct = -1;
};

/// Where this process stands in the job. Given to every component factory.
struct RunContext {
  int rank = 0;              ///< global rank, 0 <= rank < world_size
  int world_size = 1;
  int local_rank = 0;        ///< rank within this node
  int local_world_size = 1;
  uint64_t seed = 0;         ///< [trainer] seed
  std::string run_dir;       ///< [trainer] run_dir, created before components are built
  std::string job_file;      ///< path of the job file as given on the command line
  DataInfo data;             ///< filled from the dataset before the model is created
};

/// The schedule of the run, fixed before training starts.
/// global_batch_size = micro_batch_size * accumulation_steps * world_size (samples).
struct TrainPlan {
  int64_t total_steps = 0;      ///< optimizer steps in the whole run
  int64_t steps_per_epoch = 0;  ///< optimizer steps in one pass over the training split
  int64_t micro_batch_size = 0;
  int64_t accumulation_steps = 1;
  int64_t global_batch_size = 0;
};

/// Metrics of one optimizer step, as logged. loss, samples_per_s and tokens_per_s describe the
/// whole global batch (summed over ranks); step_time_s and `extra` are this rank's.
/// Units: seconds, samples/s, tokens/s. tokens_per_s is 0 for non-token models.
struct StepMetrics {
  int64_t step = 0;   ///< 1-based count of optimizer steps done
  int64_t epoch = 0;  ///< 0-based epoch the step belongs to
  int rank = 0;
  double loss = 0;    ///< mean loss per target over the global batch
  double lr = 0;
  double grad_norm = 0;  ///< global L2 norm of the gradients before clipping
  double step_time_s = 0;
  double elapsed_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;
  int64_t total_steps = 0;
  std::map<std::string, double> extra;  ///< further figures (e.g. loss_scale, bytes_communicated)
};

/// Result of one pass over the evaluation split, summed over ranks (each held-out sample is
/// evaluated on exactly one rank; padding is never counted).
struct EvalMetrics {
  int64_t step = 0;
  int rank = 0;
  double loss = 0;      ///< mean loss per target
  double accuracy = -1; ///< fraction in [0,1], or -1 where accuracy does not apply
  int64_t samples = 0;
  int64_t targets = 0;
  double time_s = 0;
  // ---- ABI 1.8 (appended; the core makes this struct and hands it by reference) ----
  /// The objective's held-out figures (Objective::take_metrics, summed over ranks), by TRL's
  /// names without its "eval_" prefix ("rewards/accuracies").
  std::map<std::string, double> extra;
};

/// Summary at the end of training.
struct TrainSummary {
  int64_t steps = 0;
  double elapsed_s = 0;
  bool interrupted = false;  ///< stopped early by Ctrl-C / SIGTERM
};

}  // namespace trainrun::v1
