#pragma once
// Which samples each rank reads: the training split as PyTorch's DistributedSampler deals it
// (a per-epoch permutation, every rank a strided, disjoint share), and the evaluation split
// counted exactly once across ranks.
#include <cstdint>
#include <string>
#include <vector>

namespace trainrun::core {

/// The one batch-layout rule: why `global` samples per step cannot be split into micro-batches
/// of `micro` (0 = global / world) on `world` ranks, as a sentence starting "[trainer]
/// global_batch_size ..."; "" when they can. Validation applies it to [launch]'s world (with the
/// key's location, so `trainrun check` catches it), the plan to the world that runs, the
/// sampler to its own options.
std::string batch_layout_error(int64_t global, int64_t micro, int64_t world);

/// Training-data order of a data-parallel job.
///
/// Epoch e is the permutation of [0, num_samples) drawn from (seed, e) alone, so every rank
/// computes the same one without communicating and a resumed run can rebuild it. The epoch is
/// cut into steps of global_batch_size samples; step s of the epoch is positions
/// [s*G, (s+1)*G) of the permutation, whatever the world size (so a job computes the same
/// global batches at any world size). Within a step, rank r takes positions s*G + r + j*W for
/// j = 0 .. G/W-1, which is exactly DistributedSampler's rank-strided share followed by a batch
/// sampler of G/W samples; micro-batch k of the step is the rank's j in [k*micro, (k+1)*micro).
///
/// The end of an epoch follows one rule on every rank: with drop_last the samples that do not
/// fill a whole global batch are skipped (floor(N/G) steps); without it the permutation is
/// padded by repeating its own beginning until the last global batch is full (ceil(N/G)
/// steps), so there is never a partial step or a partial accumulation window, and every rank
/// runs the same number of steps.
class DistributedSampler {
 public:
  struct Options {
    int64_t num_samples = 0;        ///< N, size of the training split
    int64_t global_batch_size = 0;  ///< G, a multiple of world_size
    int world_size = 1;
    int rank = 0;
    uint64_t seed = 0;
    bool drop_last = true;
  };
  /// Throws v1::ConfigError when G does not divide by world_size or an epoch has no step.
  explicit DistributedSampler(const Options& options);

  int64_t steps_per_epoch() const { return steps_; }
  /// Samples repeated (drop_last = false) or skipped (drop_last = true) per epoch.
  int64_t padded_per_epoch() const;
  int64_t dropped_per_epoch() const;

  /// This rank's G/W sample indices for step `step_in_epoch` of `epoch`, in micro-batch
  /// order. Throws v1::Error when step_in_epoch is out of range.
  std::vector<int64_t> rank_batch(int64_t epoch, int64_t step_in_epoch);

  /// The epoch's permutation (length N), as every rank draws it.
  static std::vector<int64_t> permutation(int64_t num_samples, uint64_t seed, int64_t epoch);

 private:
  Options o_;
  int64_t steps_ = 0;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;
};

/// One rank's part of an evaluation pass. The first `limit` held-out samples (all when
/// limit <= 0) are dealt rank-strided (rank r: r, r+W, ...), so each is evaluated on exactly
/// one rank. Every rank runs the same number of batches (`batches`), because a sharded
/// strategy's forward is itself a collective; a rank whose share runs out first evaluates a
/// filler batch whose results are discarded, so padding never enters a metric.
struct EvalShard {
  std::vector<int64_t> indices;  ///< this rank's samples, in order
  int64_t batches = 0;           ///< batches every rank runs
  int64_t batch_size = 0;
  /// Samples of batch b for this rank; empty when this rank's share is exhausted (run a filler).
  std::vector<int64_t> batch(int64_t b) const;
};
EvalShard eval_shard(int64_t num_samples, int64_t limit, int64_t batch_size, int world_size,
                     int rank);

}  // namespace trainrun::core
