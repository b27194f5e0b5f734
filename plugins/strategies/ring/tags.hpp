#pragma once
// The point-to-point tags of the ring strategy's messages, in one place so that they stay
// distinct. The vote (negotiation.cpp) and the data (hierarchy.cpp) never overlap in time (one
// thread issues both), but distinct tags make a stray message a timeout instead of a silently
// mixed vote or tensor.

namespace trainrun::plugins::ring_strategy {

constexpr int kNegotiateTag = 0x524e;  ///< "RN": a round's vote
constexpr int kUsedTag = 0x5255;       ///< "RU": which tensors the round reduced
constexpr int kDataTag = 0x5244;       ///< "RD": hierarchical all-reduce, the reduced data
constexpr int kGatherTag = 0x5247;     ///< "RG": hierarchical all-reduce, the all-gather

}  // namespace trainrun::plugins::ring_strategy
