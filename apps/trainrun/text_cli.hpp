#pragma once
// `trainrun encode` / `trainrun decode`: a Hugging Face tokenizer (trainrun/text/tokenizer.hpp)
// on stdin/stdout, for scripts, tests and curious users.

namespace trainrun::app {
/// `trainrun encode --tokenizer DIR [--add-special-tokens] [--jsonl] [--threads N] [--stats]`.
/// Returns the exit code: 0 ok, 2 bad arguments, tokenizer files or input.
int run_encode_command(int argc, char** argv);
/// `trainrun decode --tokenizer DIR [--skip-special-tokens] [--jsonl]`. Exit codes as encode.
int run_decode_command(int argc, char** argv);
}  // namespace trainrun::app
