#pragma once
// `trainrun export --format gguf`: a Hugging Face model directory as one GGUF v3 file, the
// format llama.cpp, Ollama and LM Studio load (ggml's docs/gguf.md: a header, typed key-value
// metadata, tensor infos, then the tensors' data, each aligned to general.alignment = 32 bytes).
// What llama.cpp's converter (convert_hf_to_gguf.py) writes for the same directory is the
// reference: the architecture's keys, its tensor names, llama's q/k row order for its rope, and
// the tokenizer as vocabulary, token types, merges, special ids and the chat template.
#include <cstdint>
#include <string>

namespace trainrun::app {

/// The tensor types an export writes: float32, float16, bfloat16, and ggml's block formats of 32
/// weights (ggml-common.h): Q8_0 (a float16 scale + 32 int8: 8.5 bits a weight), Q4_0 (a float16
/// scale + 32 4-bit values with offset 8: 4.5 bits), Q4_1 (float16 scale and minimum + 32 4-bit
/// values: 5 bits). In the quantized types 2-D weights are quantized (a row not a multiple of 32
/// long falls back to float16, as llama.cpp's converter does) and 1-D tensors (norms, biases) stay
/// float32; in f16/bf16 the 2-D weights take that type. Under Q4_0/Q4_1 the output layer
/// (output.weight, or token_embd.weight when tied) is Q8_0, as llama.cpp's quantizer keeps it
/// above the layers' type.
enum class GgufType { F32, F16, BF16, Q8_0, Q4_0, Q4_1 };

/// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1" (case-insensitive) -> the type; throws
/// v1::ConfigError naming the value and the choices.
GgufType parse_gguf_type(const std::string& name);

struct GgufExportOptions {
  GgufType type = GgufType::F16;
  /// llama.cpp's pre-tokenizer name (tokenizer.ggml.pre); "" = from tokenizer.json's
  /// pre_tokenizer (GPT-2's byte-level regex "gpt-2", Llama 3's split "llama-bpe", Qwen2's
  /// "qwen2", digits split before byte-level "smollm").
  std::string tokenizer_pre;
  /// general.name; "" = the directory's name.
  std::string name;
};

/// What write_gguf wrote.
struct GgufExportSummary {
  int64_t tensors = 0;
  int64_t bytes = 0;         ///< the file's size
  int64_t in_type = 0;       ///< 2-D tensors in the type asked for (the rest: f32, or f16 below)
  std::string output_q8_0;   ///< under q4_0/q4_1: the output layer's tensor, kept at q8_0
  int64_t fell_back = 0;     ///< 2-D tensors written as float16 instead (rows not a multiple of 32)
  std::string architecture;  ///< general.architecture
};

/// Writes `hf_dir` (config.json, model.safetensors or its shards with
/// model.safetensors.index.json, tokenizer.json, tokenizer_config.json, chat_template.jinja
/// when present) to `output` atomically (a temporary file beside it, renamed). Families:
/// model_type llama and mistral (GGUF architecture "llama", q_proj/k_proj rows permuted to
/// llama.cpp's rope pairing), qwen2 and qwen3 (their own architectures, rows as they are).
/// Tokenizers: byte-level BPE (tokenizer.ggml.model "gpt2"). Throws v1::ConfigError naming the
/// file and key or tensor for a family, rope scaling, tokenizer or tensor it cannot translate
/// (nothing written), v1::Error for I/O failures.
GgufExportSummary write_gguf(const std::string& hf_dir, const std::string& output,
                             const GgufExportOptions& options);

}  // namespace trainrun::app
