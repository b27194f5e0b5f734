#pragma once
// The `preference` dataset's layout for reward models (trainer = "reward"), as TRL 1.16's
// RewardTrainer prepares and collates pairs (reward_trainer.py: _prepare_dataset,
// DataCollatorForPreference): each sequence is prompt + completion tokenized as one text (what
// tokenize_row's prompt_ids + chosen_ids already are), sequences longer than max_length are
// dropped rather than cut, and the model reads the whole sequence: there are no next-token
// targets. LibTorch-free, like preference_samples.hpp.
#include <cstdint>
#include <vector>

#include "preference_samples.hpp"

namespace trainrun::preference {

/// The longer of the pair's two whole sequences, in tokens.
int64_t longest_sequence(const Pair& pair);

/// Pairs as rows [2B, width]: rows 0..B-1 prompt + chosen, rows B..2B-1 prompt + rejected, each
/// whole (input = every id), right-padded with `pad` to the longest; target is `ignore_index`
/// everywhere (a reward model pools its score head at the last token that is not `pad`, as
/// transformers' *ForSequenceClassification does). num_tokens counts the real positions.
Collated collate_sequences(const std::vector<const Pair*>& pairs, int32_t pad,
                           int64_t ignore_index);

}  // namespace trainrun::preference
