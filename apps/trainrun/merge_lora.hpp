#pragma once
// `trainrun merge-lora`: folds LoRA adapters saved in PEFT's layout into full-precision base
// weights and writes a safetensors model.

namespace trainrun::app {
/// Runs `trainrun merge-lora --base F --adapter DIR --output F` (argv as main received it).
/// Returns the exit code: 0 ok, 1 an I/O failure, 2 bad arguments or files that do not match.
int run_merge_lora_command(int argc, char** argv);
}  // namespace trainrun::app
