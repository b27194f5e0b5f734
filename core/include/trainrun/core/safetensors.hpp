#pragma once
// safetensors files (the format of Hugging Face's `safetensors`): an 8-byte little-endian
// header length, a JSON header mapping each tensor name to {dtype, shape, data_offsets}
// (plus an optional "__metadata__" string map), then the raw little-endian tensor bytes.
#include <trainrun/types.hpp>

#include <map>
#include <string>
#include <vector>

namespace trainrun::core {

/// Writes `tensors` (any device; CPU copies are made) to `path` atomically: a temporary file in
/// the same directory is written, fsynced and renamed over `path`, and the directory fsynced, so
/// a crash leaves either the old file or the complete new one. Supported dtypes: float64/32/16,
/// bfloat16, int64/32/16/8, uint8, bool. Throws v1::Error naming the file or the tensor.
void write_safetensors(const std::string& path, const std::vector<v1::NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Reads every tensor of a safetensors file into CPU tensors, in the file's header order.
/// Throws v1::Error naming the file when it is truncated, malformed or uses an unknown dtype.
std::vector<v1::NamedTensor> read_safetensors(const std::string& path,
                                              std::map<std::string, std::string>* metadata = nullptr);

}  // namespace trainrun::core
