#include "negotiation.hpp"

#include <trainrun/collectives/ring.hpp>

#include <ATen/ATen.h>

#include <algorithm>

#include "tags.hpp"

namespace trainrun::plugins::ring_strategy {

using namespace trainrun::v1;

Vote::Vote(size_t tensors, int world_size)
    : tensors_(tensors),
      world_size_(world_size),
      bytes_(at::zeros({static_cast<int64_t>(tensors) + world_size}, at::kByte)) {}

void Vote::set_ready(size_t i, bool ready) { bytes_.data_ptr<uint8_t>()[i] = ready ? 0 : 1; }

void Vote::give_up(int rank) {
  bytes_.data_ptr<uint8_t>()[tensors_ + static_cast<size_t>(rank)] = 1;
}

void Vote::exchange(Communicator& comm, int64_t chunk_bytes, double timeout_s) {
  ring::Options o;
  o.op = ReduceOp::Max;
  o.chunk_bytes = chunk_bytes;
  o.tag = kNegotiateTag;
  o.timeout_s = timeout_s;
  ring::all_reduce(comm, bytes_, o);
}

bool Vote::ready_everywhere(size_t i) const { return bytes_.data_ptr<uint8_t>()[i] == 0; }

std::vector<int> Vote::quitters() const {
  const uint8_t* v = bytes_.data_ptr<uint8_t>();
  std::vector<int> out;
  for (int r = 0; r < world_size_; ++r)
    if (v[tensors_ + static_cast<size_t>(r)]) out.push_back(r);
  return out;
}

std::vector<uint8_t> used_anywhere(Communicator& comm, const std::vector<uint8_t>& used) {
  at::Tensor t = at::zeros({static_cast<int64_t>(used.size())}, at::kByte);
  std::copy(used.begin(), used.end(), t.data_ptr<uint8_t>());
  ring::Options o;
  o.op = ReduceOp::Max;
  o.tag = kUsedTag;
  ring::all_reduce(comm, t, o);
  return std::vector<uint8_t>(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + used.size());
}

}  // namespace trainrun::plugins::ring_strategy
