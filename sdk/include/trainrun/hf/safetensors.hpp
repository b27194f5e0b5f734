#pragma once
// safetensors files, the weight format of Hugging Face checkpoints (huggingface/safetensors,
// "format" in its README): an 8-byte little-endian header length N, N bytes of JSON mapping
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the
// end of the header, row-major little-endian data) plus an optional "__metadata__" string map,
// then the data. One implementation for the core's checkpoints, model plugins and the CLI.
//
// Reading is by byte range: opening a file reads and checks its header only; read() and
// read_range() then read just the bytes of one tensor (or one slice of its flattened elements),
// so a rank can load only its shard of a model.
#include <ATen/core/Tensor.h>
#include <trainrun/types.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace trainrun::hf {

/// One tensor of a safetensors header. begin/end are absolute byte offsets in the file.
struct TensorEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;  ///< F64/F32/F16/BF16/I64/I32/I16/I8/U8/BOOL
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
  int64_t numel() const;
};

/// An open safetensors file: the header parsed and checked against the file size.
class SafetensorsFile {
 public:
  /// Reads and checks the header. Throws v1::Error naming the file when it cannot be opened,
  /// is shorter than its header, has malformed JSON, an unknown dtype, a shape that disagrees
  /// with its data_offsets, or data_offsets past the end of the file ("truncated").
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  /// Tensors in header order.
  const std::vector<TensorEntry>& entries() const { return entries_; }
  /// The entry named `name`, or nullptr.
  const TensorEntry* find(const std::string& name) const;
  /// The header's "__metadata__" (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The whole tensor: a new CPU tensor of the file's dtype and shape. Throws v1::Error naming
  /// the file and tensor when it is absent or the read comes up short.
  at::Tensor read(const std::string& name) const;
  /// Elements [offset, offset + count) of the tensor's row-major flattening, as a new 1-D CPU
  /// tensor of the file's dtype; only those bytes are read. Throws v1::Error as read(), or when
  /// the range lies outside the tensor.
  at::Tensor read_range(const std::string& name, int64_t offset, int64_t count) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<TensorEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `tensors` (any device; CPU copies are made one at a time) to `path` atomically: a
/// temporary file in the same directory is written, fsynced and renamed over `path`, and the
/// directory fsynced, so a crash leaves either the old file or the complete new one. dtypes as
/// TensorEntry. Throws v1::Error naming the file or the tensor (undefined, duplicate name,
/// unsupported dtype, disk full).
void write_safetensors(const std::string& path, const std::vector<v1::NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Reads every tensor of a safetensors file into CPU tensors, in header order (the file's
/// dtypes). Errors as SafetensorsFile.
std::vector<v1::NamedTensor> read_safetensors(const std::string& path,
                                              std::map<std::string, std::string>* metadata = nullptr);

/// The safetensors dtype code of `t` ("F32", "BF16", ...); throws v1::Error naming `what` when
/// safetensors has none for it.
std::string dtype_code(at::ScalarType t, const std::string& what);

}  // namespace trainrun::hf
