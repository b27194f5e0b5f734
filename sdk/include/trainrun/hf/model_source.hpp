#pragma once
// ABI 1.5 capability of a Model that mirrors a Hugging Face architecture (the `llama` plugin):
// its parameter names are the HF checkpoint's tensor names, so components that write files for
// HF tools (lora's PEFT adapter_config.json) can say what the adapters belong to. Found with
// dynamic_cast on the Model; header-only, so plugins built against ABI 1.4 are unaffected.
#include <string>

namespace trainrun::v1 {

class HfModelSource {
 public:
  virtual ~HfModelSource() = default;
  /// The HF model directory the weights were loaded from (PEFT's base_model_name_or_path),
  /// or "" for a model built from an inline config.
  virtual std::string hf_model_dir() const = 0;
  /// PEFT's task_type for adapters of this model: "CAUSAL_LM" for a causal language model.
  virtual std::string hf_task_type() const = 0;
};

}  // namespace trainrun::v1
