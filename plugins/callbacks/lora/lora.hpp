#pragma once
// Callback `lora`: low-rank adapters (Hu et al., "LoRA", 2021) on a model's trainrun Linear
// layers, with PEFT's options, defaults and checkpoint layout, so Python PEFT can load what a
// run saves.
//
// Each selected layer gets y += B(A(dropout(x))) x scaling, A [r, in] Kaiming-uniform
// (a = sqrt(5), as PEFT's reset_lora_parameters), B [out, r] zeros (so training starts from the
// base model's outputs), scaling = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
// (Kalajdzievski 2023). Every other parameter is frozen, except biases with bias = "all"
// (every bias) or "lora_only" (the adapted layers' biases). At the end of training rank 0 writes
// <run_dir>/<adapter_dir>/adapter_config.json and adapter_model.safetensors with PEFT's tensor
// names: base_model.model.<layer>.lora_A.weight [r, in], ...lora_B.weight [out, r] (and
// base_model.model.<layer>.bias for trainable biases).
#include <trainrun/hf/model_source.hpp>
#include <trainrun/interfaces.hpp>
#include <trainrun/objective.hpp>
#include <trainrun/model/linear.hpp>

#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <vector>

namespace trainrun::lora {

/// LoRA's scaling factor: alpha / r, or alpha / sqrt(r) with rsLoRA.
double lora_scaling(int64_t r, double alpha, bool use_rslora);

/// One adapter: lora_A (torch::nn::Linear in -> r, no bias), lora_B (r -> out, no bias).
class LoraAdapter final : public v1::LinearAdapter, public v1::LowRankAdapter {
 public:
  LoraAdapter(int64_t in_features, int64_t out_features, int64_t r, double alpha, double dropout,
              bool use_rslora);
  at::Tensor forward(const at::Tensor& x, bool training) override;
  /// scaling x B A, float32 [out, in].
  at::Tensor delta_weight() override;
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules() override;
  /// [r, in] and [out, r], the live parameters.
  const at::Tensor& A() const override { return a_->weight; }
  const at::Tensor& B() const override { return b_->weight; }
  double scaling() const override { return scaling_; }
  /// Without dropout (or outside training) forward() is the plain product; never while
  /// switched off (forward() then adds nothing).
  bool plain(bool training) const override { return enabled_ && !(dropout_ > 0 && training); }
  /// Switched off, forward() returns zeros of shape [1, out] (broadcast over the base output:
  /// y + 0 leaves it as the base computed it) and draws no dropout mask.
  void set_enabled(bool enabled) { enabled_ = enabled; }

 private:
  torch::nn::Linear a_{nullptr}, b_{nullptr};
  double dropout_, scaling_;
  bool enabled_ = true;
};

/// Writes float32 tensors (any device; CPU copies) to a safetensors file atomically (temporary
/// file + rename), with metadata {"format": "pt"}. Throws Error naming the file.
void write_safetensors_f32(const std::string& path, const std::vector<v1::NamedTensor>& tensors);

class LoraCallback final : public v1::Callback,
                           public v1::FinalStateDictConsumer,
                           public v1::AdapterSwitch {
 public:
  static void declare_options(v1::OptionSchema& s);
  LoraCallback(const v1::Options& o, const v1::RunContext& ctx);
  void on_setup(v1::Model& model, const v1::RunContext& ctx) override;
  /// Saves the adapters from the gathered state (works under every strategy).
  void on_final_state_dict(const std::vector<v1::NamedTensor>& state) override;
  /// Saves from the live layers when on_final_state_dict was not called (a strategy without a
  /// full state dict) and they are whole on this rank.
  void on_train_end(const v1::TrainSummary& summary) override;

  /// Writes adapter_config.json + adapter_model.safetensors into `dir` (created).
  /// `state`: name -> whole tensor (the final state dict); empty = read the live layers.
  void save(const std::string& dir, const std::map<std::string, at::Tensor>& state = {}) const;
  /// The adapted layers (after on_setup).
  const std::vector<std::pair<std::string, std::shared_ptr<LoraAdapter>>>& adapters() const {
    return adapters_;
  }
  /// AdapterSwitch (ABI 1.8): the reference model of DPO under LoRA is the base, adapters off.
  void set_adapters_enabled(bool enabled) override {
    for (auto& [name, a] : adapters_) a->set_enabled(enabled);
  }
  bool has_adapters() const override { return !adapters_.empty(); }
  int64_t trainable_parameters() const { return trainable_; }
  int64_t total_parameters() const { return total_; }

 private:
  int64_t r_;
  double alpha_, dropout_;
  bool rslora_, save_;
  std::string bias_, adapter_dir_, run_dir_;
  std::string base_model_, task_type_;  ///< from an HfModelSource model (PEFT's config keys)
  std::vector<std::string> targets_;
  int rank_;
  std::vector<std::pair<std::string, std::shared_ptr<LoraAdapter>>> adapters_;
  std::vector<v1::NamedTensor> biases_;  ///< trainable biases saved with the adapters
  std::vector<std::string>
      modules_to_save_;  ///< [[callbacks]] modules_to_save, + "score" (SEQ_CLS)
  std::vector<v1::NamedTensor> saved_whole_;  ///< their parameters, trained and saved whole
  /// What each adapted layer's frozen base was during training when a Precision quantized it
  /// (layer -> {"format", "blocksize", "dq_blocksize"}), recorded in the adapter's metadata so
  /// that merge-lora rebuilds the base the adapter was trained against.
  nlohmann::ordered_json base_quantization_ = nlohmann::ordered_json::object();
  int64_t trainable_ = 0, total_ = 0;
  bool saved_ = false;
};

}  // namespace trainrun::lora
