#pragma once
// `trainrun reward`: the job's [[rewards]] (ABI 1.10) applied to prompt/completion rows of a
// JSONL file, without a model or training, to try reward plugins and their weights.

namespace trainrun::app {
/// `trainrun reward --config job.toml --input rows.jsonl [--set K=V]... [--plugin-path P]...
/// [--batch-size N]`. Each input line is a JSON object with "completion" (a string), optionally
/// "prompt" (a string) and "completion_ids" (a list of token ids); its other fields are the
/// prompt's row the rewards see (RewardSample::row). Prints one JSON line per row on stdout,
/// {"row": i, "rewards": {name: score or null}, "reward": weighted sum}, and the mean and
/// standard deviation of each reward on stderr. Returns 0, 2 for a bad job, input line or a
/// reward that fails (naming it and the row), 1 for other failures.
int run_reward_command(int argc, char** argv);
}  // namespace trainrun::app
