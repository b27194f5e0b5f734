#pragma once
// `trainrun merge-lora`: folds LoRA adapters saved in PEFT's layout into full-precision base
// weights and writes a safetensors model; and the base a QLoRA adapter was trained against,
// which merge-lora, generate and score use unless told --plain-base.
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace trainrun::app {
/// Runs `trainrun merge-lora --base F --adapter DIR --output F` (argv as main received it).
/// Returns the exit code: 0 ok, 1 an I/O failure, 2 bad arguments or files that do not match.
int run_merge_lora_command(int argc, char** argv);

/// The quantization of each layer's frozen base as the lora callback recorded it in the
/// adapter's safetensors metadata (`metadata`, as read from `adapter_file` with its tensors:
/// `trainrun_base_quantization`: layer path -> {format, blocksize, double_quant, ...}); an
/// empty object for an adapter trained on a full-precision base. Throws ConfigError naming
/// `adapter_file` when the entry is not JSON.
nlohmann::json recorded_base_quantization(const std::map<std::string, std::string>& metadata,
                                          const std::string& adapter_file);

/// A layer's weight W as a QLoRA adapter's training saw it: quantized as recorded (NF4 with its
/// blocksize and double quantization, or int8) by the precision plugin that trained it
/// (quant-nf4 / quant-int8, found on the plugin search path), then dequantized; float32 of
/// W's shape. Adding the adapter to this, not to W, reproduces the trained model.
class TrainedBase {
 public:
  explicit TrainedBase(std::vector<std::string> plugin_paths);
  ~TrainedBase();
  /// `q`: the layer's entry of recorded_base_quantization. Throws ConfigError naming
  /// `adapter_file` and `layer` for a format no plugin rebuilds.
  at::Tensor operator()(const at::Tensor& W, const nlohmann::json& q, const std::string& layer,
                        const std::string& adapter_file);
  /// One warning line (prefixed `command`) for all layers whose recorded block sizes were not
  /// certain, if any.
  void warn_inexact(const std::string& command) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
}  // namespace trainrun::app
