// ShardedLanguageModel (decoder_model.hpp): the requests of a call split over the ranks in
// contiguous shares of about equal text length, the answers gathered by sums over the ranks.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "trainrun/eval/decoder_model.hpp"

namespace trainrun::eval {

namespace {
constexpr double kContinuationWeight = 2.0;
}  // namespace

ShardedLanguageModel::ShardedLanguageModel(LanguageModel& inner, int rank, int world_size,
                                           std::function<void(std::vector<double>&)> sum)
    : inner_(inner), rank_(rank), world_size_(world_size), sum_(std::move(sum)) {}

std::pair<size_t, size_t> ShardedLanguageModel::share(const std::vector<Request*>& requests) const {
  // Text bytes stand in for the work: a forward's cost grows with its tokens; a context shared
  // with the request before (a document's next choice) is run once, so it counts once, and a
  // continuation's tokens cost more than a context's (each needs the output head and a
  // log-softmax over the vocabulary: SmolLM2-135M scored 100 documents of wordnet_define,
  // mostly continuation, and of wordnet_word, mostly context, in the same 28 s with twice the
  // tokens in the second). Rank r takes the requests whose cumulative cost (counted from their
  // middle) falls in [r, r + 1) / W of it.
  std::vector<double> cost(requests.size());
  double total = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = *requests[i];
    const bool shared = i > 0 && !r.context.empty() && requests[i - 1]->context == r.context;
    cost[i] =
        1.0 + static_cast<double>(shared ? 0 : r.context.size()) +
        kContinuationWeight * static_cast<double>(r.continuation.size()) +
        (r.type == Request::Type::generate_until ? 4.0 * static_cast<double>(r.max_gen_toks) : 0.0);
    total += cost[i];
  }
  auto owner = [&](double middle) {
    return std::min(world_size_ - 1, static_cast<int>(std::floor(middle / total * world_size_)));
  };
  size_t first = requests.size(), last = requests.size();
  double before = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const int o = owner(before + cost[i] / 2);
    before += cost[i];
    if (o == rank_ && first == requests.size()) first = i;
    if (o > rank_) {
      last = i;
      break;
    }
  }
  if (first == requests.size()) return {first, first};
  return {first, last};
}

std::pair<size_t, size_t> ShardedLanguageModel::answer(
    const std::vector<Request*>& requests,
    void (LanguageModel::*kind)(const std::vector<Request*>&)) {
  const auto mine = share(requests);
  const std::vector<Request*> part(requests.begin() + static_cast<std::ptrdiff_t>(mine.first),
                                   requests.begin() + static_cast<std::ptrdiff_t>(mine.second));
  const auto t0 = std::chrono::steady_clock::now();
  if (!part.empty()) (inner_.*kind)(part);
  busy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  answered_ += static_cast<int64_t>(part.size());
  return mine;
}

void ShardedLanguageModel::gather_scores(const std::vector<Request*>& requests,
                                         std::pair<size_t, size_t> mine) {
  std::vector<double> v(2 * requests.size(), 0.0);
  for (size_t i = mine.first; i < mine.second; ++i) {
    v[2 * i] = requests[i]->loglikelihood;
    v[2 * i + 1] = requests[i]->is_greedy ? 1.0 : 0.0;
  }
  sum_(v);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i]->loglikelihood = v[2 * i];
    requests[i]->is_greedy = v[2 * i + 1] != 0.0;
  }
}

void ShardedLanguageModel::loglikelihood(const std::vector<Request*>& requests) {
  gather_scores(requests, answer(requests, &LanguageModel::loglikelihood));
}

void ShardedLanguageModel::loglikelihood_rolling(const std::vector<Request*>& requests) {
  gather_scores(requests, answer(requests, &LanguageModel::loglikelihood_rolling));
}

void ShardedLanguageModel::generate_until(const std::vector<Request*>& requests) {
  const auto mine = answer(requests, &LanguageModel::generate_until);
  // Each text's length, then its bytes (as float64, exact), at offsets all ranks know.
  std::vector<double> len(requests.size(), 0.0);
  for (size_t i = mine.first; i < mine.second; ++i)
    len[i] = static_cast<double>(requests[i]->text.size());
  sum_(len);
  std::vector<size_t> at(requests.size() + 1, 0);
  for (size_t i = 0; i < requests.size(); ++i) at[i + 1] = at[i] + static_cast<size_t>(len[i]);
  std::vector<double> bytes(at.back(), 0.0);
  for (size_t i = mine.first; i < mine.second; ++i)
    for (size_t b = 0; b < requests[i]->text.size(); ++b)
      bytes[at[i] + b] = static_cast<unsigned char>(requests[i]->text[b]);
  if (!bytes.empty()) sum_(bytes);
  for (size_t i = 0; i < requests.size(); ++i) {
    std::string& t = requests[i]->text;
    t.resize(at[i + 1] - at[i]);
    for (size_t b = 0; b < t.size(); ++b)
      t[b] = static_cast<char>(static_cast<unsigned char>(bytes[at[i] + b]));
  }
}

}  // namespace trainrun::eval
