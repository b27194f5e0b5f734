#pragma once
// Hugging Face model directories (transformers' save_pretrained layout): config.json,
// generation_config.json, the weights as model.safetensors or as shards
// model-00001-of-0000N.safetensors listed in model.safetensors.index.json ({"metadata":
// {"total_size": bytes}, "weight_map": {tensor: shard}}), and the tokenizer files. Shared by
// model plugins (loading, saving <run_dir>/hf/) and the CLI (merge-lora).
#include <ATen/core/Tensor.h>
#include <trainrun/hf/safetensors.hpp>
#include <trainrun/types.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace trainrun::hf {

/// An HF model directory opened for reading: config.json read, every weight file's header
/// checked, tensors readable whole or by element range without reading the rest.
class ModelDir {
 public:
  /// Throws v1::ConfigError naming the directory or file when: `dir` is not a directory; it has
  /// no config.json; it has neither model.safetensors nor model.safetensors.index.json; the
  /// index is malformed or names a shard that is missing; a tensor listed in the index is not
  /// in its shard; a weight file is truncated or malformed (SafetensorsFile's checks).
  explicit ModelDir(std::string dir);
  ~ModelDir();

  const std::string& dir() const { return dir_; }
  /// The text of config.json.
  const std::string& config_text() const { return config_text_; }
  /// Every tensor name, in file order (shard by shard).
  const std::vector<std::string>& tensor_names() const { return names_; }
  bool contains(const std::string& name) const;
  /// The tensor's header entry; throws v1::ConfigError naming the directory when absent.
  const TensorEntry& entry(const std::string& name) const;
  /// Path of the file that holds `name`.
  const std::string& file_of(const std::string& name) const;
  /// The whole tensor, CPU, the file's dtype.
  at::Tensor read(const std::string& name) const;
  /// Elements [offset, offset + count) of the flattened tensor (SafetensorsFile::read_range).
  at::Tensor read_range(const std::string& name, int64_t offset, int64_t count) const;
  /// Sum of the weight files' tensor bytes.
  int64_t total_bytes() const;

 private:
  const SafetensorsFile& file_for(const std::string& name) const;
  std::string dir_, config_text_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  ///< tensor -> files_ index
  std::vector<std::string> names_;
};

/// Writes `tensors` into `dir` (created) as transformers does: one model.safetensors when their
/// bytes fit `max_shard_bytes` (<= 0: no limit), else shards model-00001-of-0000N.safetensors of
/// at most max_shard_bytes each (a tensor larger than that gets a shard of its own) and
/// model.safetensors.index.json. Every file carries __metadata__ {"format": "pt"}. Returns the
/// files written. Throws v1::Error naming the file on I/O failure.
std::vector<std::string> write_model_weights(const std::string& dir,
                                             const std::vector<v1::NamedTensor>& tensors,
                                             int64_t max_shard_bytes);

/// Copies the tokenizer files transformers reads (tokenizer.json, tokenizer_config.json,
/// special_tokens_map.json, tokenizer.model, vocab.json, merges.txt, added_tokens.json,
/// chat_template.jinja) that exist in `from` into `to`; returns their names.
std::vector<std::string> copy_tokenizer_files(const std::string& from, const std::string& to);

/// Writes `text` to `path` atomically (temporary file, fsync, rename). Throws v1::Error.
void write_text_file(const std::string& path, const std::string& text);

/// Reads a whole text file; throws v1::ConfigError naming it when it cannot be read.
std::string read_text_file(const std::string& path);

/// A size as transformers' max_shard_size spells it: "5GB" (10^9), "500MB", "2GiB" (2^30),
/// "100KB", or a plain byte count. Throws v1::ConfigError naming the text.
int64_t parse_size(const std::string& text);

}  // namespace trainrun::hf
