#include "reward_layout.hpp"

#include <algorithm>

namespace trainrun::preference {

int64_t longest_sequence(const Pair& pair) {
  return static_cast<int64_t>(std::max(pair.prompt_of(false).size() + pair.chosen_ids.size(),
                                       pair.prompt_of(true).size() + pair.rejected_ids.size()));
}

Collated collate_sequences(const std::vector<const Pair*>& pairs, int32_t pad,
                           int64_t ignore_index) {
  Collated c;
  c.rows = 2 * static_cast<int64_t>(pairs.size());
  for (const Pair* p : pairs) c.width = std::max(c.width, longest_sequence(*p));
  const auto W = static_cast<size_t>(c.width);
  c.input.assign(static_cast<size_t>(c.rows) * W, pad);
  c.target.assign(static_cast<size_t>(c.rows) * W, ignore_index);
  size_t r = 0;
  for (bool rejected : {false, true})
    for (const Pair* p : pairs) {
      const std::vector<int32_t>& prompt = p->prompt_of(rejected);
      const std::vector<int32_t>& completion = rejected ? p->rejected_ids : p->chosen_ids;
      std::copy(prompt.begin(), prompt.end(), c.input.begin() + static_cast<std::ptrdiff_t>(r * W));
      std::copy(completion.begin(), completion.end(),
                c.input.begin() + static_cast<std::ptrdiff_t>(r * W + prompt.size()));
      c.num_tokens += static_cast<int64_t>(prompt.size() + completion.size());
      ++r;
    }
  return c;
}

}  // namespace trainrun::preference
