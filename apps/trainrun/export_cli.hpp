#pragma once
// `trainrun export CHECKPOINT --output DIR`: a Hugging Face model directory (config.json,
// generation_config.json, safetensors weights or shards + index, tokenizer files) from a
// checkpoint written at any world size, by the model plugin the checkpoint's job used.

namespace trainrun::app {
/// Runs `trainrun export CHECKPOINT --output DIR [--dtype D] [--max-shard-size S]` (argv as main
/// received it). Returns the exit code: 0 ok, 1 an I/O failure, 2 bad arguments, a missing or
/// damaged checkpoint, a model that cannot write HF directories, or an existing DIR.
int run_export_command(int argc, char** argv);
}  // namespace trainrun::app
