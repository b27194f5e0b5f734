// Model `llama` (see llama.hpp). The forward follows transformers' modeling_llama.py (and
// modeling_qwen3.py for q_norm/k_norm, modeling_mistral.py for the sliding window) operation by
// operation, so fp32 logits agree with transformers' eager attention to rounding.
#include "llama.hpp"

#include <trainrun/model/token_log_probs.hpp>
#include <trainrun/rollout.hpp>

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "modules.hpp"
#include "trainrun/hf/model_dir.hpp"
#include "trainrun/log.hpp"
#include "trainrun/model/attention.hpp"
#include "trainrun/model/linear.hpp"
#include "trainrun/model/packed_batch.hpp"
#include "trainrun/plugin.hpp"
#include "trainrun/strategy/sharding.hpp"

namespace trainrun::llama {

namespace fs = std::filesystem;
using nlohmann::json;
using v1::ConfigError;
using namespace detail;

// =============================================================================================
// The model component

void LlamaModel::declare_options(v1::OptionSchema& s) {
  s.string("path", "",
           "Hugging Face model directory (config.json + safetensors weights); \"\" = "
           "build from the inline keys below and initialise randomly");
  s.choice("model_type", "llama", {"llama", "mistral", "qwen2", "qwen3"},
           "inline config: architecture variant");
  s.integer("vocab_size", 0, "inline config: vocabulary size; 0 = the dataset's", 0, 1 << 24);
  s.integer("hidden_size", 256, "inline config: model width", 1);
  s.integer("intermediate_size", 688, "inline config: MLP width", 1);
  s.integer("num_hidden_layers", 4, "inline config: decoder layers", 1);
  s.integer("num_attention_heads", 4, "inline config: query heads", 1);
  s.integer("num_key_value_heads", 0,
            "inline config: key/value heads (GQA); 0 = num_attention_heads", 0);
  s.integer("head_dim", 0, "inline config: per-head width; 0 = hidden_size / num_attention_heads",
            0);
  s.integer("max_position_embeddings", 2048,
            "inline config: longest sequence (written to config.json)", 1);
  s.real("rms_norm_eps", 1e-6, "inline config: RMSNorm epsilon", 0.0);
  s.real("rope_theta", 10000.0, "inline config: RoPE base", 1.0);
  s.boolean("tie_word_embeddings", false, "inline config: lm_head reuses embed_tokens.weight");
  s.boolean("attention_bias", false, "inline config (llama): biases on q/k/v/o_proj");
  s.integer("sliding_window", 0, "inline config (mistral): keys a query sees; 0 = all", 0);
  s.choice("architecture", "auto", {"auto", "causal_lm", "sequence_classification"},
           "auto = as path's config.json says (causal_lm for an inline config); "
           "sequence_classification = transformers' *ForSequenceClassification: a `score` head "
           "(hidden -> num_labels, no bias) read at each row's last non-padding token, added "
           "with N(0, initializer_range) weights to a causal LM's directory (its lm_head is "
           "dropped): a reward model for [objective] plugin = \"reward\"");
  s.integer("num_labels", 1,
            "architecture = \"sequence_classification\": outputs of the score head", 1, 1 << 20);
  s.integer("pad_token_id", -2,
            "sequence classification: the token whose positions pooling skips (written to "
            "config.json); -2 = config.json's, else the tokenizer's pad token, else its EOS "
            "(as TRL's RewardTrainer sets it); -1 = none (read the last position)",
            -2);
  s.boolean("save_hf", true, "write <run_dir>/hf/ (an HF model directory) at the end of training");
  s.choice("save_dtype", "auto", {"auto", "float32", "bfloat16", "float16"},
           "dtype of the saved weights; auto = the input's (float32 for an inline config)");
  s.string("max_shard_size", "5GB",
           "largest weight file in <run_dir>/hf/ before sharding (\"5GB\", \"500MB\")");
  s.boolean(
      "fused_head_loss", true,
      "training loss with a frozen head (LoRA, QLoRA): the vocabulary projection and the "
      "cross-entropy in one step whose logits buffer is reused from step to step and "
      "overwritten by their gradient; false = the projection through autograd, then the loss");
  s.choice("router_aux_loss", "auto", {"auto", "on", "off"},
           "mixture of experts: add router_aux_loss_coef x the router's load-balancing loss "
           "(transformers' load_balancing_loss_func, over each micro-batch of each rank) to the "
           "language-modelling loss; auto = as config.json's output_router_logits says");
  s.real("router_aux_loss_coef", -1.0,
         "mixture of experts: the load-balancing loss's weight; -1 = config.json's", -1.0);
  s.boolean(
      "blocked_attention", true,
      "training attention (LibTorch < 2.1) through blocked kernels with their own "
      "backward, float32 and under CPU bf16 autocast: queries in blocks of 64 (float32) or 128 "
      "(bf16), grouped "
      "query heads without repeated keys, only the diagonal masked; false = autograd "
      "through the masked math form");
}

LlamaModel::LlamaModel(const v1::Options& o, const v1::RunContext& ctx)
    : run_dir_(ctx.run_dir), rank_(ctx.rank) {
  const v1::DataInfo& data = ctx.data;
  // Preference data (ABI 1.8) is token rows too; its objective computes the loss. Prompts
  // (ABI 1.12) become token rows of completions in the core's rollouts.
  TR_CHECK_TYPED(ConfigError,
                 data.task.empty() || data.task == "language_modeling" ||
                     data.task == "preference" || data.task == "unpaired-preference" ||
                     data.task == "reward" || data.task == "prompts",
                 o.context(),
                 ": llama needs a language-modelling, preference, reward or prompt dataset, but "
                 "the dataset's task is '",
                 data.task, "'");
  save_hf_ = o.get_bool("save_hf");
  fused_head_loss_ = o.get_bool("fused_head_loss");
  blocked_attention_ = o.get_bool("blocked_attention");
  const std::string aux = o.get_string("router_aux_loss");
  want_router_loss_ = aux == "auto" ? -1 : aux == "on" ? 1 : 0;
  want_router_coef_ = o.get_double("router_aux_loss_coef");
  save_dtype_ = o.get_string("save_dtype");
  max_shard_bytes_ = hf::parse_size(o.get_string("max_shard_size"));
  const std::string architecture = o.get_string("architecture");
  want_labels_ = architecture == "auto"                      ? -1
                 : architecture == "sequence_classification" ? o.get_int("num_labels")
                                                             : 0;
  want_pad_ = o.get_int("pad_token_id");
  const std::string path = o.get_string("path");
  if (!path.empty()) {
    load(path, /*defer=*/true);  // the host loads them whole, or a sharded strategy by shard
  } else {
    json j;
    j["model_type"] = o.get_string("model_type");
    j["vocab_size"] = o.get_int("vocab_size") > 0 ? o.get_int("vocab_size") : data.vocab_size;
    TR_CHECK_TYPED(ConfigError, j["vocab_size"].get<int64_t>() > 0, o.context(),
                   ": vocab_size = 0 takes the vocabulary from the dataset, which reports none");
    for (const char* k : {"hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "max_position_embeddings"})
      j[k] = o.get_int(k);
    if (o.get_int("num_key_value_heads") > 0)
      j["num_key_value_heads"] = o.get_int("num_key_value_heads");
    if (o.get_int("head_dim") > 0) j["head_dim"] = o.get_int("head_dim");
    j["rms_norm_eps"] = o.get_double("rms_norm_eps");
    j["rope_theta"] = o.get_double("rope_theta");
    j["tie_word_embeddings"] = o.get_bool("tie_word_embeddings");
    j["attention_bias"] = o.get_bool("attention_bias");
    if (o.get_int("sliding_window") > 0) j["sliding_window"] = o.get_int("sliding_window");
    cfg_ = LlamaConfig::from_json(j.dump(), o.context());
    if (want_labels_ > 0) {
      cfg_.num_labels = want_labels_;
      cfg_.pad_token_id = want_pad_ >= 0 ? want_pad_ : -1;
    }
    build(false);
    // transformers' _init_weights: N(0, initializer_range) for Linear and Embedding weights,
    // zero biases, unit RMSNorm gains.
    torch::NoGradGuard no_grad;
    for (auto& item : net_->named_parameters(true)) {
      const std::string& n = item.key();
      torch::Tensor& p = item.value();
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0)
        p.zero_();
      else if (p.dim() == 1)
        p.fill_(cfg_.norm_plus_one ? 0.0 : 1.0);
      else
        p.normal_(0.0, cfg_.initializer_range);
    }
  }
  TR_CHECK_TYPED(ConfigError, data.vocab_size <= cfg_.vocab_size, o.context(),
                 ": the dataset's vocabulary (", data.vocab_size,
                 ") is larger than the model's vocab_size (", cfg_.vocab_size, ")");
}

LlamaModel::LlamaModel(const std::string& dir) : save_hf_(false) { load(dir, /*defer=*/false); }

void LlamaModel::build(bool release) {
  cfg_.blocked_attention = blocked_attention_;
  if (want_router_loss_ >= 0) cfg_.output_router_logits = want_router_loss_ == 1;
  if (want_router_coef_ >= 0) cfg_.router_aux_loss_coef = want_router_coef_;
  net_ = CausalLM(cfg_, release).ptr();
  set_module(net_);
  units_.clear();
  auto& net = net_of(net_);
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i)
    units_.push_back(std::make_unique<v1::Unit>("model.layers." + std::to_string(i),
                                                net.model->layer_ptrs[static_cast<size_t>(i)]));
}

at::Tensor LlamaModel::logits(const at::Tensor& ids) {
  v1::Batch b;
  b.input = ids;
  return logits(b);
}

// The training forward: positions from batch.position_ids (restarting per packed sample) and a
// block-diagonal causal mask from batch.segment_ids, both as transformers computes them.
at::Tensor LlamaModel::logits(const v1::Batch& batch) { return head(hidden_states(batch)); }

at::Tensor LlamaModel::head(const at::Tensor& x) {
  TR_CHECK(cfg_.num_labels == 0,
           "llama: the model has a score head (sequence classification), no vocabulary head");
  return net_of(net_).head(x);
}

namespace {

// The inputs of each kind of layer: RoPE tables of the batch's positions and the attention mask
// (causal, packed samples, and the sliding window for the layers that use it). `pos` float
// [1 or B, T].
std::array<LayerInputs, 2> layer_inputs(const CausalLMImpl& net, const LlamaConfig& c,
                                        const torch::Tensor& pos, int64_t T,
                                        const torch::Tensor& segment_ids) {
  std::array<LayerInputs, 2> in;  // [0] full attention, [1] sliding window
  for (int kind = 0; kind < 2; ++kind) {
    if (!c.has_layer_kind(kind == 1)) continue;
    // cos/sin in float32 as transformers computes them (autocast off): [1, 1, T, rot] for
    // 0..T-1, [B, 1, T, rot] for given positions, broadcasting over the heads.
    auto [cos, sin] = net.rope_cos_sin(pos.unsqueeze(-1), kind == 1);
    in[kind].cos = cos.unsqueeze(1);
    in[kind].sin = sin.unsqueeze(1);
    in[kind].blocked =
        v1::attention_blocked(T, pos.device(), segment_ids, kind == 1 ? c.sliding_window : 0);
  }
  return in;
}

}  // namespace

at::Tensor LlamaModel::hidden_states(const v1::Batch& batch) {
  const v1::Batch f = fields_of(batch);
  const at::Tensor& ids = f.input;
  TR_CHECK(ids.dim() == 2, "llama: input must be token ids [B, T], got shape ", ids.sizes());
  TR_CHECK(ids.scalar_type() == at::kLong, "llama: token ids must be int64, got ",
           ids.scalar_type());
  auto& net = net_of(net_);
  const int64_t B = ids.size(0), T = ids.size(1);
  const torch::Tensor pos = v1::positions_of(f, B, T, ids.device()).to(torch::kFloat);
  const std::array<LayerInputs, 2> in = layer_inputs(net, cfg_, pos, T, f.segment_ids);
  torch::Tensor x = net.model->embed(ids, cfg_.embed_scale);
  for (size_t i = 0; i < units_.size(); ++i) {
    const auto& layer = net.model->layer_ptrs[i];
    // By value: a unit may run the layer again in the backward (activation checkpointing).
    x = units_[i]->run(x, [layer, inputs = in[layer->sliding ? 1 : 0]](const torch::Tensor& t) {
      return layer->forward(t, inputs);
    });
  }
  return net.model->norm->forward(x);
}

// The loss only needs the logits of the positions that count: those whose target is
// kIgnoreIndex (prompt tokens of chat data, padding) skip the vocabulary projection altogether,
// which changes no figure (their loss is 0 and their arg-max never equals the target).
v1::ModelOutput LlamaModel::forward(const v1::Batch& b) {
  v1::ModelOutput out = forward_hidden(b, hidden_states(b));
  // Mixture of experts: transformers' *ForCausalLM adds router_aux_loss_coef x the
  // load-balancing loss to the language-modelling loss when output_router_logits is set; here
  // as that much per counted target, so that the core's mean over the batch's targets adds it
  // (weighted by targets across micro-batches and ranks).
  if (cfg_.num_experts > 0 && cfg_.output_router_logits && objective_ == nullptr) {
    const int64_t n = b.target.ne(v1::kIgnoreIndex).sum().item<int64_t>();
    out.loss_sum = out.loss_sum + router_aux_loss().to(out.loss_sum.scalar_type()) *
                                      (cfg_.router_aux_loss_coef * static_cast<double>(n));
  }
  return out;
}

// transformers' load_balancing_loss_func (Switch Transformer eqs. 4-6) over every MoE layer's
// router logits of the last forward, without an attention mask: num_experts x the sum over
// experts of (the share of top-k choices it got) x (its mean router probability).
torch::Tensor LlamaModel::router_aux_loss() const {
  auto& net = net_of(net_);
  const int64_t E = cfg_.num_experts;
  torch::Tensor counts, probs;
  int64_t rows = 0;
  for (const auto& layer : net.model->layer_ptrs) {
    if (!layer->moe) continue;
    const torch::Tensor& logits = layer->moe->router_logits;
    TR_CHECK(logits.defined(), "llama: no router logits recorded for the load-balancing loss");
    TR_CHECK(!torch::GradMode::is_enabled() || logits.requires_grad() ||
                 !net.model->embed_tokens->weight.requires_grad(),
             "llama: the router's load-balancing loss (output_router_logits) needs the router "
             "logits of the forward; activation checkpointing recomputes them in the backward");
    const torch::Tensor w = torch::softmax(logits, -1);
    const torch::Tensor chosen = std::get<1>(w.topk(cfg_.num_experts_per_tok, -1));
    const torch::Tensor c = torch::bincount(chosen.flatten(), {}, E).to(torch::kFloat);
    const torch::Tensor p = w.to(torch::kFloat).sum(0);
    counts = counts.defined() ? counts + c : c;
    probs = probs.defined() ? probs + p : p;
    rows += w.size(0);
  }
  const double n = static_cast<double>(rows);
  return ((counts / n) * (probs / n)).sum() * static_cast<double>(E);
}

v1::ModelOutput LlamaModel::forward_hidden(const v1::Batch& b, torch::Tensor h) {
  TR_CHECK(b.target.sizes() == h.sizes().slice(0, 2),
           "llama: target must be [B, T] as the input, got ", b.target.sizes(), " for input ",
           h.sizes().slice(0, 2));
  if (cfg_.num_labels > 0) {
    TR_CHECK(objective_ != nullptr && (objective_->wanted_statistics() & v1::Objective::kScores),
             "llama: a model with a score head (sequence classification) trains with an "
             "objective that reads scores ([objective] plugin = \"reward\")");
    TR_CHECK(!b.segment_ids.defined(),
             "llama: the score head reads one sequence per row, not packed rows");
    v1::TokenLogProbs lp;
    lp.scores = pool_scores(h, b.input);
    return objective_->compute(lp, b);
  }
  if (objective_ != nullptr) {
    // A packed batch (padding-free preference pairs) gives the objective one row per sequence.
    const torch::Tensor segments = segment_ids(b);
    TR_CHECK(segments.defined() || !b.segment_ids.defined(),
             "llama: packed rows for an objective need a strategy that passes segment ids "
             "(ABI >= 1.6)");
    const torch::Tensor positions = v1::counted_positions(b.target);
    torch::Tensor logits = head(h.reshape({-1, h.size(-1)}).index_select(0, positions));
    // ABI 1.12: an objective scoring completions at its sampling temperature (TRL's GRPO).
    if (const auto* t = dynamic_cast<const v1::LogitTemperature*>(objective_);
        t != nullptr && t->logit_temperature() != 1.0)
      logits = logits / t->logit_temperature();
    v1::TokenLogProbs lp =
        v1::token_log_probs(logits, b.target, positions, objective_->wanted_statistics());
    if (segments.defined()) lp = v1::per_sequence(lp, b.target, segments);
    return objective_->compute(lp, b);
  }
  h = h.reshape({-1, h.size(-1)});
  torch::Tensor target = b.target.reshape({-1});
  const torch::Tensor valid = target.ne(v1::kIgnoreIndex);
  if (!valid.all().item<bool>()) {
    const torch::Tensor idx = valid.nonzero().squeeze(1);
    h = h.index_select(0, idx);
    target = target.index_select(0, idx);
  }
  if (fused_head_loss_ && cfg_.final_logit_softcapping <= 0 && torch::GradMode::is_enabled() &&
      h.requires_grad() && h.scalar_type() == torch::kFloat) {
    auto& net = net_of(net_);
    // The head's weight when the head is a plain product with it (undefined otherwise).
    torch::Tensor w;
    if (cfg_.tie_word_embeddings)
      w = net.model->embed_tokens->weight;
    else if (net.lm_head->adapters().empty() && !net.lm_head->base() &&
             !net.lm_head->bias.defined())
      w = net.lm_head->weight;
    if (w.defined() && !w.requires_grad() && w.scalar_type() == torch::kFloat) {
      const c10::DeviceType d = h.device().type();
      v1::ModelOutput out;
      if (!v1::compat::autocast_enabled(d)) {
        out.loss_sum = HeadCrossEntropySum::apply(h.contiguous(), w, target, logits_buffer_, false);
        return out;
      }
      if (d == c10::kCPU && v1::compat::autocast_dtype(d) == torch::kBFloat16) {
        out.loss_sum = HeadCrossEntropySum::apply(h.contiguous(), w, target, logits_buffer_, true);
        return out;
      }
    }
  }
  const torch::Tensor logits = head(h);
  if (torch::GradMode::is_enabled() && logits.requires_grad() &&
      logits.scalar_type() == torch::kFloat) {
    v1::ModelOutput out;
    out.loss_sum = CrossEntropySum::apply(logits, target);
    return out;
  }
  return v1::cross_entropy_sum(logits, target);
}

// transformers' pooling for *ForSequenceClassification: the rightmost position whose token is
// not pad_token_id (0 when every token is), or the last position without a pad token; the score
// head runs on those B rows only (the same numbers as scoring every position, then picking).
at::Tensor LlamaModel::pool_scores(const at::Tensor& h, const at::Tensor& ids) {
  const int64_t B = ids.size(0), T = ids.size(1);
  torch::Tensor last;
  if (cfg_.pad_token_id >= 0)
    last =
        (torch::arange(T, ids.options()) * ids.ne(cfg_.pad_token_id).to(torch::kLong)).argmax(-1);
  else
    last = torch::full({B}, T - 1, ids.options());
  const torch::Tensor rows = h.index({torch::arange(B, ids.options()), last});  // [B, hidden]
  return net_of(net_).score->forward(rows).to(torch::kFloat);
}

at::Tensor LlamaModel::scores(const v1::Batch& batch) {
  TR_CHECK(cfg_.num_labels > 0, "llama: scores: the model has no score head (it is a causal LM)");
  return pool_scores(hidden_states(batch), batch.input);
}

std::vector<v1::Unit*> LlamaModel::units() {
  std::vector<v1::Unit*> out;
  for (auto& u : units_) out.push_back(u.get());
  return out;
}

double LlamaModel::activation_bytes(const v1::ActivationShape& shape) const {
  const double rows = static_cast<double>(shape.micro_batch_size);
  const int64_t T = std::max<int64_t>(shape.seq_len, 1);
  const double tokens = rows * static_cast<double>(T);
  const double h = static_cast<double>(cfg_.hidden_size);
  const double q = static_cast<double>(cfg_.num_attention_heads * cfg_.head_dim);
  const double kv = static_cast<double>(cfg_.num_key_value_heads * cfg_.head_dim);
  const double heads = static_cast<double>(cfg_.num_attention_heads);
  // bytes_per_element 2 = a forward under 16-bit autocast: the residual stream, the norms and an
  // adapted Linear's output (a float32 adapter output added to the 16-bit product) stay float32;
  // a plain Linear's output and the casts of its inputs are 16-bit.
  const bool autocast = shape.bytes_per_element < 4;
  auto& net = net_of(net_);
  bool adapted = false;
  double dense_weights = 0;  // elements of the decoder layers' dense Linear weights
  for (const auto& m : net.model->modules(/*include_self=*/false))
    if (const auto* l = dynamic_cast<const v1::LinearImpl*>(m.get())) {
      adapted = adapted || !l->adapters().empty();
      if (l->weight.defined()) dense_weights += static_cast<double>(l->weight.numel());
    }
  const double out = autocast && !adapted ? 2 : 4;  // a Linear output's bytes
  // The score probabilities the blocked attention keeps for its backward (LibTorch < 2.1: no
  // SDPA), float32 in both kernels: each block of n queries keeps n x e scores per head, e the
  // keys up to its end. With SDPA, one log-sum-exp per head and token.
  double scores = heads * 4;  // bytes per token
#if !TRAINRUN_HAS_SDPA
  {
    const int64_t block = T > 64 ? (autocast ? 128 : 64) : T;
    double kept = 0;
    for (int64_t s = 0; s < T; s += block) {
      const int64_t n = std::min(block, T - s);
      kept += static_cast<double>(n) * static_cast<double>(s + n);
    }
    scores = heads * 4 * kept / static_cast<double>(T);
  }
#endif
  double layers_total = 0, largest = 0;
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    // A MoE block's intermediates exist for each token's top-k experts.
    const double inter =
        cfg_.layer_is_moe(l)
            ? static_cast<double>(cfg_.num_experts_per_tok * cfg_.moe_intermediate_size)
            : static_cast<double>(cfg_.intermediate_size);
    // Bytes per token the layer keeps: both norms' float32 inputs (the residual stream); the
    // attention's queries (scaled), keys and values; its output (o_proj's input); act(gate),
    // up and gate (silu's input) and their product (down_proj's input). Float32: the normed
    // inputs are shared by the products that read them. Under autocast each product keeps its
    // own 16-bit cast of a float32 input (q, k, v: three; gate, up: two), the attention its
    // 16-bit queries, keys and values.
    const double per_token = autocast ? 2 * 4 * h + 3 * 2 * h + 2 * q + 4 * kv + 2 * q + 2 * 2 * h +
                                            3 * out * inter + 2 * inter + scores
                                      : 4 * (4 * h + 2 * q + 2 * kv + 4 * inter) + scores;
    layers_total += per_token;
    largest = std::max(largest, per_token);
  }
  const double layers = static_cast<double>(cfg_.num_hidden_layers);
  // Checkpointed, a unit keeps only its input until its backward recomputes it.
  double body = shape.checkpointing ? tokens * (4 * h * layers + largest) : tokens * layers_total;
  // Under autocast the 16-bit copies of the dense weights live until the backward: a frozen
  // weight's kept copy (LinearImpl::keep_frozen_weight_copy) or autocast's cast, which the
  // product keeps.
  if (autocast) body += 2 * dense_weights;
  // The head: the fused loss of a frozen head keeps one [tokens, vocab] buffer (its gradient is
  // written over it), in float32 or under autocast in bf16 with a bf16 copy of the weight;
  // CrossEntropySum keeps the float32 logits alone. Under autocast through autograd: the 16-bit
  // logits, their float32 log-softmax and its gradient.
  // A sequence classifier scores each row once: no vocabulary-wide logits.
  if (cfg_.num_labels > 0) return body;
  torch::Tensor head;
  if (cfg_.tie_word_embeddings)
    head = net.model->embed_tokens->weight;
  else if (!net.lm_head.is_empty())
    head = net.lm_head->weight;
  const bool plain_head =
      cfg_.tie_word_embeddings || (!net.lm_head.is_empty() && net.lm_head->adapters().empty() &&
                                   !net.lm_head->base() && !net.lm_head->bias.defined());
  const bool fused = fused_head_loss_ && cfg_.final_logit_softcapping <= 0 && head.defined() &&
                     !head.requires_grad() && plain_head;
  const double vocab = static_cast<double>(cfg_.vocab_size);
  // Soft-capped logits (Gemma 2) go through autograd: the product, its tanh and the result.
  if (!autocast) return body + tokens * vocab * 4 * (cfg_.final_logit_softcapping > 0 ? 3 : 1);
  if (fused) return body + tokens * vocab * 2 + vocab * h * 2;
  return body + tokens * vocab * (2 + 4 + 4);
}

std::string LlamaModel::describe() const {
  return v1::detail::cat(
      "llama (", cfg_.model_type, "): ", cfg_.num_hidden_layers, " layers, hidden ",
      cfg_.hidden_size, ", heads ", cfg_.num_attention_heads, "/", cfg_.num_key_value_heads,
      " (q/kv), head_dim ", cfg_.head_dim, ", vocab ", cfg_.vocab_size,
      cfg_.tie_word_embeddings ? ", tied embeddings" : "",
      cfg_.num_labels > 0 ? v1::detail::cat(", score head (", cfg_.num_labels,
                                            cfg_.num_labels == 1 ? " label" : " labels", ", pad ",
                                            cfg_.pad_token_id, ")")
                          : std::string(),
      cfg_.rope.type != "default" ? ", rope " + cfg_.rope.type : std::string(),
      cfg_.rope.partial_rotary_factor != 1.0
          ? v1::detail::cat(", rotary ", cfg_.rotary_dim(), "/", cfg_.head_dim)
          : std::string(),
      cfg_.sliding_window > 0
          ? v1::detail::cat(", sliding window ", cfg_.sliding_window,
                            cfg_.sliding_layers.empty()
                                ? std::string()
                                : v1::detail::cat(" on ",
                                                  std::count(cfg_.sliding_layers.begin(),
                                                             cfg_.sliding_layers.end(), true),
                                                  " layers"))
          : std::string(),
      cfg_.num_experts > 0
          ? v1::detail::cat(", ", cfg_.num_experts, " experts (top ", cfg_.num_experts_per_tok,
                            ") on ",
                            std::count(cfg_.moe_layers.begin(), cfg_.moe_layers.end(), true),
                            " of ", cfg_.num_hidden_layers, " layers",
                            ep_group_ != nullptr
                                ? v1::detail::cat(", ", cfg_.num_experts / ep_group_->world_size(),
                                                  " per rank (ep ", ep_group_->world_size(), ")")
                                : std::string(),
                            cfg_.output_router_logits
                                ? v1::detail::cat(", router aux loss x ", cfg_.router_aux_loss_coef)
                                : std::string())
          : std::string(),
      cfg_.final_logit_softcapping > 0 || cfg_.attn_logit_softcapping > 0 ? ", soft-capped"
                                                                          : std::string(),
      dir_.empty() ? ", random init" : ", from " + dir_);
}

void LlamaModel::save_hf(const std::string& out, const std::vector<v1::NamedTensor>& state,
                         const std::string& dtype, int64_t max_shard_bytes) const {
  const at::ScalarType st = scalar_type(dtype, "llama save_dtype");
  std::vector<v1::NamedTensor> weights;
  for (const auto& t : state) weights.push_back({t.name, t.tensor.detach().to(at::kCPU).to(st)});
  fs::create_directories(out);
  hf::write_model_weights(out, weights, max_shard_bytes);
  hf::write_text_file((fs::path(out) / "config.json").string(), cfg_.to_json(config_text_, dtype));
  const fs::path gen = fs::path(dir_) / "generation_config.json";
  std::error_code ec;
  if (!dir_.empty() && fs::is_regular_file(gen, ec)) {
    fs::copy_file(gen, fs::path(out) / "generation_config.json",
                  fs::copy_options::overwrite_existing);
  } else {
    json g = json::object();
    if (!config_text_.empty()) {
      const json c = json::parse(config_text_);
      for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
        if (c.contains(k)) g[k] = c[k];
    }
    hf::write_text_file((fs::path(out) / "generation_config.json").string(), g.dump(2) + "\n");
  }
  if (!dir_.empty()) hf::copy_tokenizer_files(dir_, out);
}

}  // namespace trainrun::llama
