#pragma once
// `trainrun eval`: lm-evaluation-harness tasks (its YAML task format, local data files) scored
// on a Hugging Face model directory through a model plugin, with lm-eval's prompts, requests,
// metrics and results file (docs/evaluation.md).

namespace trainrun::app {
/// `trainrun eval --model DIR --tasks TASK.yaml|DIR... [--num-fewshot N] [--limit N]
/// [--output results.json] [--log-samples DIR]`. Returns the exit code: 0 ok, 2 bad arguments,
/// task file, data or model, 1 a failure while scoring.
int run_eval_command(int argc, char** argv);
}  // namespace trainrun::app
