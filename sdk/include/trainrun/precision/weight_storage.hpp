#pragma once
// ABI 1.15: what a precision's convert() will make of the model's frozen weights, known from the
// layers' shapes before any weight is read. `trainrun check` validates a quantizing precision's
// layer selection with it and sizes the model state from the storage it reports (a 4-bit base
// holds about 0.53 bytes per weight, not 4), the same figure the run's banner prints.
#include <cstdint>
#include <string>
#include <vector>

#include "trainrun/interfaces.hpp"

namespace trainrun::v1 {

/// One Linear weight that Precision::convert() will replace with a frozen stored form.
struct PlannedWeight {
  std::string module;  ///< the layer's dotted path ("model.layers.0.self_attn.q_proj"); its
                       ///< parameter "<module>.weight" is replaced
  int64_t numel = 0;   ///< elements of the dense weight (out_features x in_features)
  int64_t bytes = 0;   ///< bytes the stored form holds in all: codes and their scales (e.g.
                       ///< NF4 with double quantization, blocksize 64: numel / 2 + numel / 64
                       ///< + 4 x ceil(numel / 16384) + 4)
  std::string format;  ///< "nf4", "nf4+dq", "int8", ... (LinearBase::format() after convert)
};

/// Capability of a Precision (found with dynamic_cast; since ABI 1.15) whose convert() stores
/// some frozen weights in another form (quantization: quant-nf4, quant-int8).
class WeightStoragePlan {
 public:
  virtual ~WeightStoragePlan() = default;
  /// What convert(model) would do, from the model's layer names and shapes only: reads no
  /// weight value (a model whose weights are deferred stays deferred) and changes nothing.
  /// Throws the ConfigError convert() would throw for the same model and options (a
  /// target_modules entry that matches no layer, a model without trainrun Linear layers).
  virtual std::vector<PlannedWeight> plan_weight_storage(Model& model) const = 0;
};

}  // namespace trainrun::v1
