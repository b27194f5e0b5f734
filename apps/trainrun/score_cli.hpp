#pragma once
// `trainrun score`: a reward model's scores (an HF *ForSequenceClassification directory, e.g. the
// <run_dir>/hf/ of an [objective] plugin = "reward" run) for texts, conversations or preference
// pairs, tokenized as TRL's RewardTrainer tokenizes its pairs.

namespace trainrun::app {
/// `trainrun score --model DIR (--text TEXT... | --input FILE.jsonl) [--jsonl] [--threads N]`.
/// Returns the exit code: 0 ok, 2 bad arguments, model, tokenizer or input line, 1 failure while
/// scoring.
int run_score_command(int argc, char** argv);
}  // namespace trainrun::app
