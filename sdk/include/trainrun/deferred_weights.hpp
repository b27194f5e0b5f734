#pragma once
// ABI 1.7 capabilities for loading a model's weights by shard: a model whose weights are in
// files it can read by byte range (an HF directory's safetensors) builds its parameters without
// values ("deferred"), and a sharded strategy fills only this rank's part of each flat parameter
// straight from the files, so no rank ever holds the whole model. The idea is PyTorch FSDP's
// deferred initialisation (meta-device modules materialised per shard) and DeepSpeed's
// zero.Init; the byte ranges are those of the safetensors header (trainrun/hf/safetensors.hpp).
//
// Protocol (the core's trainer follows it; so must any other host of a Model):
//  1. A model that offers DeferredWeights may come out of its constructor with
//     weights_deferred() true: every parameter has its final name, shape, dtype and
//     requires_grad, but its storage holds no bytes (reading a value is undefined behaviour).
//  2. Right after building the components, the host calls load_deferred_weights() (the
//     read-once path: every tensor read whole, once) unless all of these hold: the strategy is a
//     DeferredWeightsLoader whose loads_deferred_weights() is true, no [trainer] init_weights
//     replaces the weights, the precision converts no weights (PrecisionBytes::param_bytes() ==
//     4), and every component that sees the model before the strategy (precision, callbacks) is
//     built against ABI >= 1.7. Components of ABI >= 1.7 that see a model before
//     Strategy::setup may wrap modules, freeze parameters and read names, shapes and dtypes, but
//     must not read parameter values while weights_deferred() is true.
//  3. The strategy's setup() then reads each piece it keeps through read_weight_range() (a
//     piece of a flat parameter, or a whole tensor it keeps whole) and calls
//     deferred_weights_loaded() once every parameter has its values.
// Plugins built against ABI <= 1.6 never see a deferred model: an older model has no such
// capability, and an older strategy, precision or callback makes the host load the weights
// whole first.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace trainrun::v1 {

/// Capability of a Model (found with dynamic_cast) whose weights can be read by element range.
class DeferredWeights {
 public:
  virtual ~DeferredWeights() = default;
  /// True while the parameters hold no values (see the protocol above).
  virtual bool weights_deferred() const = 0;
  /// Reads every parameter whole (in the model's dtype, on its current device); afterwards
  /// weights_deferred() is false. No-op when not deferred. Throws ConfigError naming the file
  /// and tensor when a read fails.
  virtual void load_deferred_weights() = 0;
  /// Whether parameter `name` waits for its values: false for a parameter added after
  /// construction (a LoRA adapter's), which holds its own, and for an unknown name.
  virtual bool weight_deferred(const std::string& name) const = 0;
  /// Elements [offset, offset + out.numel()) of parameter `name`'s row-major flattening (a
  /// name of named_parameters()), read from the files (only those bytes) and cast into `out`: a
  /// 1-D contiguous tensor of a floating dtype, on any device. Throws Error naming the
  /// parameter when the name is unknown or the range lies outside it; ConfigError naming the
  /// file and tensor when the read fails.
  virtual void read_weight_range(const std::string& name, int64_t offset, const at::Tensor& out) = 0;
  /// Called once by whoever filled every parameter through read_weight_range(); afterwards
  /// weights_deferred() is false.
  virtual void deferred_weights_loaded() = 0;
};

/// Capability of a Strategy (found with dynamic_cast): true when its setup() fills a
/// DeferredWeights model itself, reading only what this rank keeps (protocol step 3). Asked
/// once, after the components are built and before the model is touched.
class DeferredWeightsLoader {
 public:
  virtual ~DeferredWeightsLoader() = default;
  virtual bool loads_deferred_weights() const = 0;
};

}  // namespace trainrun::v1
