#pragma once
// `trainrun tokenize`: text and JSONL files -> one token file (uint16/uint32, EOS after every
// document) plus a JSON sidecar, for the `text` dataset (format = "auto").

namespace trainrun::app {
/// `trainrun tokenize --tokenizer DIR --output FILE [--dtype auto|uint16|uint32] [--threads N]
/// [--text-key K] FILES...`. Returns the exit code: 0 ok, 2 bad arguments, tokenizer or input
/// (the message names the file and line), 1 failure while writing.
int run_tokenize_command(int argc, char** argv);
}  // namespace trainrun::app
