#include "trainrun/core/sampler.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randperm.h>

#include <algorithm>
#include <string>

#include "trainrun/error.hpp"

namespace trainrun::core {

std::string batch_layout_error(int64_t global, int64_t micro, int64_t world) {
  if (micro == 0 && global % world != 0)
    return "[trainer] global_batch_size " + std::to_string(global) +
           " is not divisible by world_size " + std::to_string(world) +
           " ([launch] nproc_per_node x nnodes)";
  if (micro > 0 && global % (micro * world) != 0)
    return "[trainer] global_batch_size " + std::to_string(global) +
           " is not divisible by micro_batch_size " + std::to_string(micro) + " x world_size " +
           std::to_string(world) + " (the gradient-accumulation step count must be a whole number; "
           "micro_batch_size = 0 derives it as global_batch_size / world_size)";
  return "";
}


DistributedSampler::DistributedSampler(const Options& o) : o_(o) {
  TR_CHECK(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "sampler: rank ", o.rank,
           " outside world_size ", o.world_size);
  TR_CHECK_TYPED(v1::ConfigError, o.global_batch_size > 0, "[trainer] global_batch_size ",
                 o.global_batch_size, " is not positive");
  if (const std::string error = batch_layout_error(o.global_batch_size, 0, o.world_size); !error.empty())
    throw v1::ConfigError(error);
  steps_ = o.drop_last ? o.num_samples / o.global_batch_size
                       : (o.num_samples + o.global_batch_size - 1) / o.global_batch_size;
  if (steps_ == 0)
    throw v1::ConfigError("[trainer] global_batch_size " + std::to_string(o.global_batch_size) +
                          " is larger than the training split (" + std::to_string(o.num_samples) +
                          " samples) and drop_last = true: an epoch has no step");
}

int64_t DistributedSampler::padded_per_epoch() const {
  return o_.drop_last ? 0 : steps_ * o_.global_batch_size - o_.num_samples;
}

int64_t DistributedSampler::dropped_per_epoch() const {
  return o_.drop_last ? o_.num_samples - steps_ * o_.global_batch_size : 0;
}

std::vector<int64_t> DistributedSampler::permutation(int64_t n, uint64_t seed, int64_t epoch) {
  // The generator seed mixes (seed, epoch) the way the single-process trainer always has, so
  // the data order of earlier runs is unchanged.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + static_cast<uint64_t>(epoch));
  at::Tensor p = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
  const int64_t* d = p.data_ptr<int64_t>();
  return std::vector<int64_t>(d, d + n);
}

std::vector<int64_t> DistributedSampler::rank_batch(int64_t epoch, int64_t step) {
  TR_CHECK(step >= 0 && step < steps_, "sampler: step ", step, " outside the epoch's ", steps_,
           " steps");
  if (epoch != cached_epoch_) {
    perm_ = permutation(o_.num_samples, o_.seed, epoch);
    cached_epoch_ = epoch;
  }
  const int64_t G = o_.global_batch_size, W = o_.world_size, N = o_.num_samples;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(G / W));
  for (int64_t j = 0; j < G / W; ++j) {
    const int64_t pos = step * G + o_.rank + j * W;
    out.push_back(perm_[static_cast<size_t>(pos % N)]);  // pos >= N only when padding
  }
  return out;
}

EvalShard eval_shard(int64_t n, int64_t limit, int64_t batch_size, int world, int rank) {
  TR_CHECK(batch_size > 0 && world >= 1 && rank >= 0 && rank < world,
           "eval_shard: bad batch size or rank");
  EvalShard s;
  s.batch_size = batch_size;
  const int64_t m = limit > 0 ? std::min(n, limit) : n;
  for (int64_t i = rank; i < m; i += world) s.indices.push_back(i);
  const int64_t longest = (m + world - 1) / world;  // rank 0's share, the largest
  s.batches = (longest + batch_size - 1) / batch_size;
  return s;
}

std::vector<int64_t> EvalShard::batch(int64_t b) const {
  const int64_t begin = b * batch_size;
  const int64_t size = static_cast<int64_t>(indices.size());
  if (begin >= size) return {};
  return std::vector<int64_t>(indices.begin() + begin,
                              indices.begin() + std::min(size, begin + batch_size));
}

}  // namespace trainrun::core
