#pragma once
// Model `llama`: the Llama family of decoder-only transformers as transformers'
// LlamaForCausalLM computes it (models/llama/modeling_llama.py), with the variants Mistral,
// Qwen2 and Qwen3 differ by, read from an HF model directory's config.json or from inline keys.
//
// Module and parameter names are the HF checkpoint's tensor names
// ("model.layers.0.self_attn.q_proj.weight"), so loading, saving and LoRA targeting need no
// mapping tables. Each decoder layer is one sharding Unit; every projection is a
// trainrun::v1::Linear, so quant-nf4/int8 and lora apply.
#include <ATen/core/Tensor.h>
#include <trainrun/deferred_weights.hpp>
#include <trainrun/generation.hpp>
#include <trainrun/hf/model_dir.hpp>
#include <trainrun/hf/model_source.hpp>
#include <trainrun/interfaces.hpp>
#include <trainrun/model/activation_memory.hpp>
#include <trainrun/model/expert_parallel.hpp>
#include <trainrun/model/module_model.hpp>
#include <trainrun/objective.hpp>
#include <trainrun/model/packed_batch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace trainrun::llama {

/// Rotary position embedding of one kind of layer (transformers' modeling_rope_utils.py).
struct RopeConfig {
  /// "default", "linear" (factor), "llama3" (factor, low/high frequency factors, original
  /// context length) or "longrope" (Phi-3: short/long factors per frequency, the long set when
  /// a forward's longest position reaches original_max_position_embeddings).
  std::string type = "default";
  double theta = 10000.0, factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  std::vector<double> short_factor, long_factor;  ///< longrope, head_dim * partial / 2 each
  double attention_factor = 1.0;                  ///< longrope: cos and sin are multiplied by it
  /// Rotated share of each head (Phi-3 / Phi-4-mini partial_rotary_factor); the rest passes.
  double partial_rotary_factor = 1.0;

  /// The rotated width of a head of `head_dim`: int(head_dim * partial_rotary_factor), as
  /// transformers truncates it.
  int64_t rotary_dim(int64_t head_dim) const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
};

/// The architecture, as config.json describes it (transformers 4.x and 5.x spellings). Besides
/// the Llama variants, the Gemma (1, 2, 3 text) and Phi-3 families: each is the Llama layer
/// with some of the switches below turned on.
struct LlamaConfig {
  /// llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3, mixtral, qwen3_moe
  std::string model_type = "llama";
  int64_t vocab_size = 32000, hidden_size = 4096, intermediate_size = 11008;
  int64_t num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 32;
  int64_t head_dim = 128;  ///< per head; Qwen3 and Gemma may differ from hidden_size / heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6, initializer_range = 0.02;
  RopeConfig rope;  ///< every layer's, or the full-attention layers' where rope_local is set
  /// Gemma 3: the sliding-window layers' own RoPE (rope_local_base_freq); type "" = as `rope`.
  RopeConfig rope_local{""};
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  ///< biases on q/k/v (Qwen2, Llama attention_bias)
  bool o_bias = false;    ///< bias on o_proj (Llama attention_bias)
  bool mlp_bias = false;
  bool qk_norm = false;  ///< Qwen3, Gemma 3: RMSNorm over each head of q and k before RoPE
  /// The MLP's activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU, Gemma).
  std::string hidden_act = "silu";
  /// Gemma: RMSNorm gains stored as w - 1 and applied as (1 + w) in float32.
  bool norm_plus_one = false;
  /// Gemma: embeddings multiplied by sqrt(hidden_size) (in the weights' dtype); 1 = none.
  double embed_scale = 1.0;
  /// Gemma 2/3: the attention's and the MLP's outputs normed before their residual add
  /// (post_attention_layernorm, post_feedforward_layernorm), the MLP's input by
  /// pre_feedforward_layernorm.
  bool sandwich_norms = false;
  /// Multiplier of q k^T: 1/sqrt(head_dim), or Gemma 2/3's query_pre_attn_scalar^-1/2.
  double attn_scale = 0.0;  ///< 0 = 1/sqrt(head_dim)
  /// Gemma 2: cap * tanh(x / cap) on the attention scores and on the final logits; 0 = none.
  double attn_logit_softcapping = 0.0, final_logit_softcapping = 0.0;
  /// Phi-3: q, k, v as one qkv_proj and gate, up as one gate_up_proj (HF's names).
  bool fused_qkv = false, fused_gate_up = false;
  int64_t sliding_window = 0;  ///< a query sees the last sliding_window keys; 0 = all
  /// Mixture of experts (Mixtral, Qwen3-MoE): num_experts > 0 routes each token of the MoE
  /// layers to num_experts_per_tok experts of moe_intermediate_size by a softmax router `gate`
  /// (Fedus et al. 2021, Switch Transformer; Jiang et al. 2024, Mixtral), dropless.
  int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  bool norm_topk_prob = true;  ///< the top-k weights renormalised to sum to 1
  /// Mixtral keeps the routing weights float32; Qwen3-MoE casts them to the router's dtype.
  bool routing_weights_float = true;
  std::vector<bool> moe_layers;  ///< per layer: a sparse MoE block instead of the MLP
  /// The load-balancing loss (transformers' load_balancing_loss_func) times this is added to
  /// the loss when output_router_logits is set.
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;
  /// Per layer: true where the layer attends through the sliding window (Gemma 2/3's
  /// layer_types "sliding_attention"); empty = every layer when sliding_window > 0 (Mistral,
  /// Phi-3).
  std::vector<bool> sliding_layers;
  std::string dtype = "float32";  ///< torch_dtype / dtype: the weights' dtype on disk
  /// Outputs of the sequence-classification head `score` (transformers'
  /// *ForSequenceClassification: num_labels, or len(id2label)); 0 = a causal LM with lm_head.
  int64_t num_labels = 0;
  int64_t pad_token_id = -1;  ///< config.json's pad_token_id; -1 = none
  /// Not config.json's: [model] blocked_attention (training attention through the blocked
  /// kernels with their own backward, float32 and CPU bf16 autocast; false = autograd).
  bool blocked_attention = true;

  /// Whether layer `i` attends through the sliding window.
  bool layer_is_sliding(int64_t i) const {
    return sliding_window > 0 && (sliding_layers.empty() || sliding_layers[static_cast<size_t>(i)]);
  }
  bool layer_is_moe(int64_t i) const {
    return num_experts > 0 && moe_layers[static_cast<size_t>(i)];
  }
  /// The RoPE of layer `i` (Gemma 3's sliding layers have their own).
  const RopeConfig& layer_rope(int64_t i) const {
    return !rope_local.type.empty() && layer_is_sliding(i) ? rope_local : rope;
  }
  /// The rotated width of each head (even): head_dim * partial_rotary_factor.
  int64_t rotary_dim() const { return rope.rotary_dim(head_dim); }
  /// Whether some layer attends through the sliding window (`sliding`) or over every key.
  bool has_layer_kind(bool sliding) const {
    for (int64_t i = 0; i < num_hidden_layers; ++i)
      if (layer_is_sliding(i) == sliding) return true;
    return false;
  }

  /// Parses config.json text. Throws v1::ConfigError naming `source` and the key when
  /// model_type, a rope type, hidden_act or another value is not supported.
  static LlamaConfig from_json(const std::string& text, const std::string& source);
  /// config.json for this architecture, readable by transformers 4.x and 5.x (both rope
  /// spellings, both dtype keys), on top of `original` (the input's config.json text, whose
  /// other keys are kept; "" = none), with `dtype` as the weights' dtype.
  std::string to_json(const std::string& original, const std::string& dtype) const;
};

/// The model. Parameters float32, named as in HF checkpoints.
class LlamaModel final : public v1::ModuleModel,
                         public v1::BatchFieldsReaderBase,
                         public v1::FinalStateDictConsumer,
                         public v1::HfModelSource,
                         public v1::IncrementalDecoder,
                         public v1::PaddedDecoder,
                         public v1::LastLogitsDecoder,
                         public v1::DecodeStateRepeat,
                         public v1::DeferredWeights,
                         public v1::ObjectiveModel,
                         public v1::SequenceClassifier,
                         public v1::ExpertParallelModel,
                         public v1::ActivationMemory {
 public:
  static void declare_options(v1::OptionSchema& s);
  LlamaModel(const v1::Options& o, const v1::RunContext& ctx);
  /// Loads an HF model directory (tests and tools). Throws v1::ConfigError as the plugin does.
  explicit LlamaModel(const std::string& dir);

  /// The tensors a decoder layer keeps for backward per token (its input, the normed inputs of
  /// the projections, q/k/v and the attention output with its log-sum-exp, the MLP's four
  /// intermediate-wide tensors), times layers and tokens; under activation checkpointing each
  /// layer's input plus one layer's set. Plus the loss's logits: one [tokens, vocab] float32
  /// buffer for the fused frozen head, three (logits, log-softmax, gradient) otherwise.
  double activation_bytes(const v1::ActivationShape& shape) const override;

  /// ids int64 [B, T] -> logits [B, T, vocab_size] (float32 unless autocast says otherwise).
  at::Tensor logits(const at::Tensor& ids);
  /// The batch's input -> logits [B, T, vocab_size], honouring batch.position_ids and
  /// batch.segment_ids (packed samples never attend to each other).
  at::Tensor logits(const v1::Batch& batch);
  v1::ModelOutput forward(const v1::Batch& batch) override;
  std::vector<v1::Unit*> units() override;
  std::string describe() const override;
  /// Writes <run_dir>/hf/ (config, generation config, weights, tokenizer files) on rank 0.
  void on_final_state_dict(const std::vector<v1::NamedTensor>& state) override;
  std::string hf_model_dir() const override { return dir_; }
  std::string hf_task_type() const override {
    return cfg_.num_labels > 0 ? "SEQ_CLS" : "CAUSAL_LM";
  }

  /// DeferredWeights (ABI 1.7): built from an HF directory through the plugin, the model checks
  /// every tensor's header but reads no weight until the host or a sharded strategy asks.
  bool weights_deferred() const override { return !deferred_.empty(); }
  bool weight_deferred(const std::string& name) const override;
  void load_deferred_weights() override;
  void read_weight_range(const std::string& name, int64_t offset, const at::Tensor& out) override;
  /// Prints what this rank read (bytes of weights, and the process's rchar since the first read)
  /// and closes the weight files.
  void deferred_weights_loaded() override;

  /// KV-cache decoding (decode.cpp): keys/values cached per layer after RoPE, as
  /// transformers' DynamicCache holds them; the training forward above is not used.
  std::unique_ptr<v1::DecodeState> new_decode_state(int64_t batch_size, int64_t max_length) override;
  at::Tensor decode(const at::Tensor& ids, v1::DecodeState& state) override;
  /// PaddedDecoder (ABI 1.10): left-padded rows of different lengths (decode.cpp).
  at::Tensor decode_padded(const at::Tensor& ids, const at::Tensor& attention_mask,
                           v1::DecodeState& state) override;
  /// LastLogitsDecoder (ABI 1.16): the head on the last `logits_to_keep` slots only.
  at::Tensor decode_padded_last(const at::Tensor& ids, const at::Tensor& attention_mask,
                                v1::DecodeState& state, int64_t logits_to_keep) override;
  /// DecodeStateRepeat (ABI 1.12): one prefill shared by a prompt's completions (decode.cpp).
  void repeat_rows(v1::DecodeState& state, int64_t repeats) override;

  /// ObjectiveModel (ABI 1.8): forward() then hands the log-probabilities of the batch's
  /// counted targets to `objective` (the head runs on those positions only, as for the loss).
  void set_objective(v1::Objective* objective) override { objective_ = objective; }

  /// SequenceClassifier (ABI 1.9): with a `score` head (architecture = "sequence_classification",
  /// or a *ForSequenceClassification directory) forward() hands the objective
  /// TokenLogProbs::scores instead of log-probabilities.
  int64_t num_labels() const override { return cfg_.num_labels; }
  int64_t pad_token_id() const override { return cfg_.pad_token_id; }
  /// The score head at each row's last token that is not pad_token_id (transformers' pooling):
  /// input int64 [B, T] -> float32 [B, num_labels]. Throws Error without a score head.
  at::Tensor scores(const v1::Batch& batch) override;

  /// ExpertParallelModel (ABI 1.14, experts.cpp): Mixtral and Qwen3-MoE split their experts over
  /// [parallel] ep ranks; afterwards named_parameters() leaves them out.
  int64_t num_experts() const override { return cfg_.num_experts; }
  bool is_expert_parameter(const std::string& name) const override;
  void shard_experts(v1::Communicator& group) override;
  std::vector<v1::NamedTensor> expert_parameters() override;
  std::vector<v1::NamedTensor> named_parameters() override;

  const LlamaConfig& config() const { return cfg_; }
  /// Writes an HF model directory from `state` (names as named_parameters()) in `dtype`.
  void save_hf(const std::string& out, const std::vector<v1::NamedTensor>& state,
               const std::string& dtype, int64_t max_shard_bytes) const;

 private:
  void build(bool release);
  void load(const std::string& dir, bool defer);
  /// decode() (real undefined) and decode_padded() (real: the attention mask) in one body;
  /// keep > 0: the logits of the last `keep` slots only.
  at::Tensor decode_rows(const at::Tensor& ids, const at::Tensor& real, v1::DecodeState& state,
                         int64_t keep = 0);
  /// The final norm's output [B, T, hidden] for the batch (logits() without the head).
  at::Tensor hidden_states(const v1::Batch& batch);
  /// forward() from the final norm's output `h` [B, T, hidden], without the router's loss.
  v1::ModelOutput forward_hidden(const v1::Batch& batch, at::Tensor h);
  /// Mixture of experts: the load-balancing loss of the last forward's routing (scalar float32).
  at::Tensor router_aux_loss() const;
  /// hidden [..., hidden_size] -> logits [..., vocab_size] (lm_head, or the tied embedding).
  at::Tensor head(const at::Tensor& hidden);
  /// hidden [B, T, hidden_size], ids [B, T] -> the score head at the pooled positions [B, labels].
  at::Tensor pool_scores(const at::Tensor& hidden, const at::Tensor& ids);

  LlamaConfig cfg_;
  std::string dir_, config_text_, run_dir_, save_dtype_ = "auto";
  int64_t max_shard_bytes_ = 5'000'000'000;
  bool save_hf_ = true;
  bool fused_head_loss_ = true;
  bool blocked_attention_ = true;
  int want_router_loss_ = -1;       ///< [model] router_aux_loss: -1 auto, 0 off, 1 on
  double want_router_coef_ = -1.0;  ///< [model] router_aux_loss_coef; -1 = config.json's
  int rank_ = 0;
  v1::Communicator* ep_group_ = nullptr;  ///< shard_experts' group; null = every expert here
  v1::Objective* objective_ = nullptr;    ///< set_objective; not owned
  /// [model] architecture as num_labels: -1 = as the directory says, 0 = causal LM, n = a score
  /// head of n outputs (added, initialised as transformers does, to a causal LM's directory).
  int64_t want_labels_ = -1;
  int64_t want_pad_ = -2;  ///< [model] pad_token_id; -2 = auto
  std::shared_ptr<torch::nn::Module> net_;
  std::vector<std::unique_ptr<v1::Unit>> units_;
  /// The training loss's logits [tokens * vocab], reused from step to step (HeadCrossEntropySum).
  std::shared_ptr<at::Tensor> logits_buffer_ = std::make_shared<at::Tensor>();
  std::unique_ptr<hf::ModelDir> md_;            ///< open while weights are deferred
  std::map<std::string, at::Tensor> deferred_;  ///< parameters waiting for their values
  int64_t bytes_read_ = 0, ranges_read_ = 0, rchar_start_ = -1, rss_at_build_ = -1;
};

namespace detail {
/// config.json's dtype names ("float32", "bfloat16", "float16"; "torch.bfloat16" as older
/// files write it) as a ScalarType; throws ConfigError naming `where` for any other.
at::ScalarType scalar_type(const std::string& d, const std::string& where);
}  // namespace detail

}  // namespace trainrun::llama
