#pragma once
// `trainrun generate`: text from a Hugging Face model directory through a model plugin that
// offers v1::IncrementalDecoder (KV cache), with the directory's tokenizer and chat template.

namespace trainrun::app {
/// `trainrun generate --model DIR [--adapter DIR] [--chat] --prompt TEXT... | --prompts-file F
/// --max-new-tokens N [--temperature T --top-p P --seed S] [--jsonl]`. Returns the exit code:
/// 0 ok, 2 bad arguments, model, adapter, tokenizer or prompt file, 1 failure while generating.
int run_generate_command(int argc, char** argv);
}  // namespace trainrun::app
