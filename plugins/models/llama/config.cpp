// The llama family's config.json: read (LlamaConfig::from_json, every variant's keys of
// transformers 4.x and 5.x) and written back on top of the original (to_json).
#include <nlohmann/json.hpp>

#include <cmath>
#include <set>
#include <string>

#include "llama.hpp"
#include "trainrun/error.hpp"

namespace trainrun::llama {

using nlohmann::json;
using v1::ConfigError;

namespace {

const std::set<std::string> kModelTypes = {"llama",   "mistral",  "qwen2",       "qwen3",
                                           "gemma",   "gemma2",   "gemma3_text", "phi3",
                                           "mixtral", "qwen3_moe"};
const char* const kSupported =
    "llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3, mixtral, qwen3_moe";

bool is_gemma(const std::string& t) { return t == "gemma" || t == "gemma2" || t == "gemma3_text"; }
// Gemma 2 and 3: sandwich norms, query_pre_attn_scalar, sliding-window layers by layer type.
bool is_gemma23(const std::string& t) { return t == "gemma2" || t == "gemma3_text"; }
// The families whose config.json this plugin writes in full; the others' keep their own keys
// for what the plugin does not change (RoPE, activation, layer types).
bool llama_like(const std::string& t) {
  return t == "llama" || t == "mistral" || t == "qwen2" || t == "qwen3";
}

const json* key(const json& j, const char* k) {
  auto it = j.find(k);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

namespace detail {

std::string dtype_name(const std::string& d) {
  // transformers writes "bfloat16"; older files may say "torch.bfloat16".
  return d.rfind("torch.", 0) == 0 ? d.substr(6) : d;
}

at::ScalarType scalar_type(const std::string& d, const std::string& where) {
  if (d == "float32") return at::kFloat;
  if (d == "bfloat16") return at::kBFloat16;
  if (d == "float16") return at::kHalf;
  TR_CHECK_TYPED(ConfigError, false, where, ": dtype '", d,
                 "' is not supported (float32, bfloat16, float16)");
  return at::kFloat;
}

}  // namespace detail

using namespace detail;

namespace {

// Typed reads of config.json's keys: absent or null keys take the default, a key of the wrong
// type is an error naming the file and the key.
struct Keys {
  const json& j;
  const std::string& src;

  int64_t integer(const char* k, int64_t def) const {
    const json* v = key(j, k);
    if (!v) return def;
    TR_CHECK_TYPED(ConfigError, v->is_number_integer(), src, ": \"", k,
                   "\" must be an integer, got ", v->dump());
    return v->get<int64_t>();
  }
  double real(const json& o, const char* k, double def) const {
    const json* v = key(o, k);
    if (!v) return def;
    TR_CHECK_TYPED(ConfigError, v->is_number(), src, ": \"", k, "\" must be a number, got ",
                   v->dump());
    return v->get<double>();
  }
  double real(const char* k, double def) const { return real(j, k, def); }
  bool boolean(const char* k, bool def) const {
    const json* v = key(j, k);
    if (!v) return def;
    TR_CHECK_TYPED(ConfigError, v->is_boolean(), src, ": \"", k, "\" must be true or false, got ",
                   v->dump());
    return v->get<bool>();
  }
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// model_type, architectures (causal LM or sequence classifier) and the classifier's labels.
void read_architecture(const Keys& r, LlamaConfig& c) {
  const json* mt = key(r.j, "model_type");
  TR_CHECK_TYPED(ConfigError, mt && mt->is_string(), r.src,
                 ": no \"model_type\" (the llama plugin reads model_type ", kSupported, ")");
  c.model_type = mt->get<std::string>();
  TR_CHECK_TYPED(ConfigError, c.model_type != "gemma3", r.src,
                 ": model_type \"gemma3\" is Gemma 3's image-text model; the llama plugin opens "
                 "its text models (model_type \"gemma3_text\", Gemma3ForCausalLM)");
  TR_CHECK_TYPED(ConfigError, kModelTypes.count(c.model_type), r.src, ": model_type \"",
                 c.model_type, "\" is not supported by the llama plugin (supported: ", kSupported,
                 ")");
  bool classifier = false;
  if (const json* a = key(r.j, "architectures"); a && a->is_array())
    for (const auto& name : *a) {
      const std::string s = name.is_string() ? name.get<std::string>() : name.dump();
      classifier = classifier || ends_with(s, "ForSequenceClassification");
      TR_CHECK_TYPED(ConfigError,
                     ends_with(s, "ForCausalLM") || ends_with(s, "ForSequenceClassification"),
                     r.src, ": architectures lists \"", s,
                     "\"; the llama plugin builds *ForCausalLM models (LlamaForCausalLM, "
                     "MistralForCausalLM, Qwen2/3ForCausalLM, Gemma/Gemma2/Gemma3ForCausalLM, "
                     "Phi3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM) and their "
                     "*ForSequenceClassification (reward models)");
    }
  if (classifier) {
    // transformers: num_labels is len(id2label) when the file has one, else 2 (its default).
    c.num_labels = 2;
    if (const json* l = key(r.j, "id2label"); l && l->is_object() && !l->empty())
      c.num_labels = static_cast<int64_t>(l->size());
    else if (const json* n = key(r.j, "num_labels"); n && n->is_number_integer())
      c.num_labels = n->get<int64_t>();
    TR_CHECK_TYPED(ConfigError, c.num_labels > 0, r.src, ": num_labels must be positive");
  }
  if (const json* p = key(r.j, "pad_token_id"); p && !p->is_null()) {
    TR_CHECK_TYPED(ConfigError, p->is_number_integer() && p->get<int64_t>() >= 0, r.src,
                   ": \"pad_token_id\" must be a token id or null, got ", p->dump());
    c.pad_token_id = p->get<int64_t>();
  }
}

// The sizes: vocabulary, widths, depth, heads and head_dim.
void read_shape(const Keys& r, LlamaConfig& c) {
  c.vocab_size = r.integer("vocab_size", 32000);
  c.hidden_size = r.integer("hidden_size", 4096);
  c.intermediate_size = r.integer("intermediate_size", 11008);
  c.num_hidden_layers = r.integer("num_hidden_layers", 32);
  c.num_attention_heads = r.integer("num_attention_heads", 32);
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
  for (auto [k, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden_size},
                      {"intermediate_size", c.intermediate_size},
                      {"num_hidden_layers", c.num_hidden_layers},
                      {"num_attention_heads", c.num_attention_heads},
                      {"num_key_value_heads", c.num_key_value_heads}})
    TR_CHECK_TYPED(ConfigError, v > 0, r.src, ": \"", k, "\" must be positive, got ", v);
  TR_CHECK_TYPED(ConfigError, c.num_attention_heads % c.num_key_value_heads == 0, r.src,
                 ": num_attention_heads (", c.num_attention_heads,
                 ") must be a multiple of "
                 "num_key_value_heads (",
                 c.num_key_value_heads, ")");
  c.head_dim = r.integer("head_dim", c.hidden_size / c.num_attention_heads);
  TR_CHECK_TYPED(ConfigError, c.head_dim > 0 && c.head_dim % 2 == 0, r.src,
                 ": head_dim must be even and positive, got ", c.head_dim);
  if (!key(r.j, "head_dim"))
    TR_CHECK_TYPED(ConfigError, c.hidden_size % c.num_attention_heads == 0, r.src,
                   ": hidden_size (", c.hidden_size, ") is not divisible by num_attention_heads (",
                   c.num_attention_heads, ") and there is no head_dim");
  c.max_position_embeddings = r.integer("max_position_embeddings", 2048);
}

// The MLP's activation: Gemma 2/3 read hidden_activation, the others hidden_act (Gemma 1's
// legacy "gelu" means the tanh approximation, as transformers' GemmaConfig maps it).
void read_activation(const Keys& r, LlamaConfig& c) {
  const char* k = is_gemma23(c.model_type) ? "hidden_activation" : "hidden_act";
  c.hidden_act = is_gemma(c.model_type) ? "gelu_pytorch_tanh" : "silu";
  if (const json* act = key(r.j, k)) {
    TR_CHECK_TYPED(ConfigError, act->is_string(), r.src, ": \"", k, "\" must be a string");
    c.hidden_act = act->get<std::string>();
    if (c.model_type == "gemma" && c.hidden_act == "gelu") c.hidden_act = "gelu_pytorch_tanh";
  }
  TR_CHECK_TYPED(ConfigError, c.hidden_act == "silu" || c.hidden_act == "gelu_pytorch_tanh", r.src,
                 ": ", k, " \"", c.hidden_act,
                 "\" is not supported (the llama plugin's MLPs: \"silu\" (SwiGLU), "
                 "\"gelu_pytorch_tanh\" (GeGLU))");
}

// Sliding windows: Mistral and Phi-3 on every layer when sliding_window is set, Gemma 2/3 on the
// layers layer_types names (by default every other layer, Gemma 3 five of six); Qwen2/3's
// use_sliding_window (some layers only) is refused.
void read_sliding(const Keys& r, LlamaConfig& c) {
  const std::string& t = c.model_type;
  const bool gemma23 = is_gemma23(t);
  // The families whose sliding_window applies to every layer.
  const bool every_layer = t == "mistral" || t == "phi3" || t == "mixtral";
  if (every_layer) {
    c.sliding_window = r.integer("sliding_window", 0);
  } else if (gemma23) {
    c.sliding_window = r.integer("sliding_window", 4096);
    TR_CHECK_TYPED(ConfigError, !r.boolean("use_bidirectional_attention", false), r.src,
                   ": use_bidirectional_attention = true is not supported (causal attention only)");
    const int64_t pattern = t == "gemma2" ? 2 : r.integer("sliding_window_pattern", 6);
    TR_CHECK_TYPED(ConfigError, pattern > 0, r.src, ": sliding_window_pattern must be positive");
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      c.sliding_layers.push_back((i + 1) % pattern != 0);
  } else if (t == "qwen2" || t == "qwen3" || t == "qwen3_moe") {
    TR_CHECK_TYPED(ConfigError, !r.boolean("use_sliding_window", false), r.src,
                   ": use_sliding_window = true is not supported for ", t,
                   " (only full attention on every layer)");
  }
  TR_CHECK_TYPED(ConfigError, c.sliding_window >= 0, r.src, ": sliding_window must be >= 0");
  const json* lt = key(r.j, "layer_types");
  if (!lt) return;
  TR_CHECK_TYPED(ConfigError, lt->is_array(), r.src, ": layer_types must be a list");
  const bool sliding_ok = gemma23 || every_layer;
  std::vector<bool> layers;
  for (const auto& e : *lt) {
    TR_CHECK_TYPED(ConfigError, e == "full_attention" || (sliding_ok && e == "sliding_attention"),
                   r.src, ": layer_types contains ", e.dump(), "; supported: \"full_attention\"",
                   sliding_ok ? ", \"sliding_attention\"" : "");
    layers.push_back(e == "sliding_attention");
  }
  TR_CHECK_TYPED(ConfigError, static_cast<int64_t>(layers.size()) == c.num_hidden_layers, r.src,
                 ": layer_types lists ", layers.size(), " layers, num_hidden_layers is ",
                 c.num_hidden_layers);
  if (gemma23) c.sliding_layers = layers;
}

// Activation, biases, norms and attention variants: what each family turns on, and the variants
// the plugin refuses rather than computes differently from transformers.
void read_layers(const Keys& r, LlamaConfig& c) {
  const std::string& t = c.model_type;
  c.rms_norm_eps = r.real("rms_norm_eps", 1e-6);
  c.initializer_range = r.real("initializer_range", 0.02);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", is_gemma(t));
  read_activation(r, c);
  if (const json* tp = key(r.j, "pretraining_tp"))
    TR_CHECK_TYPED(ConfigError, tp->is_number_integer() && tp->get<int64_t>() == 1, r.src,
                   ": pretraining_tp ", tp->dump(), " is not supported (only 1)");
  for (const char* k : {"attention_dropout", "resid_pdrop", "embd_pdrop"}) {
    const double dropout = r.real(k, 0.0);
    TR_CHECK_TYPED(ConfigError, dropout == 0.0, r.src, ": ", k, " ", dropout,
                   " is not supported (only 0)");
  }

  // Biases: Llama's and Gemma's attention_bias puts one on q, k, v and o; Qwen2 has them on q, k,
  // v only; Phi-3 none.
  if (t == "qwen2") {
    c.qkv_bias = true;
  } else if (t != "phi3") {
    c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
  }
  c.mlp_bias = t == "llama" && r.boolean("mlp_bias", false);
  c.qk_norm = t == "qwen3" || t == "gemma3_text" || t == "qwen3_moe";
  c.fused_qkv = c.fused_gate_up = t == "phi3";
  if (is_gemma(t)) {
    c.norm_plus_one = true;
    // transformers: hidden_size**0.5 as a float32 tensor.
    c.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
  }
  if (is_gemma23(t)) {
    c.sandwich_norms = true;
    const double s = r.real("query_pre_attn_scalar", 256);
    TR_CHECK_TYPED(ConfigError, s > 0, r.src, ": query_pre_attn_scalar must be positive");
    c.attn_scale = std::pow(s, -0.5);
    c.final_logit_softcapping = r.real("final_logit_softcapping", t == "gemma2" ? 30.0 : 0.0);
    // Gemma 3's attention never applies attn_logit_softcapping (transformers does not pass it).
    if (t == "gemma2") c.attn_logit_softcapping = r.real("attn_logit_softcapping", 50.0);
    TR_CHECK_TYPED(ConfigError, c.final_logit_softcapping >= 0 && c.attn_logit_softcapping >= 0,
                   r.src, ": soft-capping values must be >= 0 (null = none)");
  }
  read_sliding(r, c);
}

// Mixture of experts: Mixtral (every layer; num_local_experts experts of intermediate_size,
// renormalised top-k, float32 routing weights) and Qwen3-MoE (num_experts of
// moe_intermediate_size on the layers decoder_sparse_step picks, but not mlp_only_layers;
// norm_topk_prob).
void read_moe(const Keys& r, LlamaConfig& c) {
  const std::string& t = c.model_type;
  if (t != "mixtral" && t != "qwen3_moe") return;
  const bool mixtral = t == "mixtral";
  // transformers 5 writes either family's count as num_local_experts; Qwen's own files say
  // num_experts.
  c.num_experts = r.integer("num_local_experts", r.integer("num_experts", mixtral ? 8 : 128));
  c.num_experts_per_tok = r.integer("num_experts_per_tok", mixtral ? 2 : 8);
  c.moe_intermediate_size = mixtral ? c.intermediate_size : r.integer("moe_intermediate_size", 768);
  c.norm_topk_prob = mixtral || r.boolean("norm_topk_prob", false);
  c.routing_weights_float = mixtral;
  c.router_aux_loss_coef = r.real("router_aux_loss_coef", 0.001);
  c.output_router_logits = r.boolean("output_router_logits", false);
  TR_CHECK_TYPED(ConfigError, c.num_experts >= 0, r.src, ": the number of experts must be >= 0");
  TR_CHECK_TYPED(
      ConfigError,
      c.num_experts == 0 || (c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.num_experts),
      r.src, ": num_experts_per_tok (", c.num_experts_per_tok,
      ") must be between 1 and the number of experts (", c.num_experts, ")");
  TR_CHECK_TYPED(ConfigError, c.moe_intermediate_size > 0, r.src,
                 ": the experts' intermediate size must be positive");
  const double jitter = r.real("router_jitter_noise", 0.0);
  TR_CHECK_TYPED(ConfigError, jitter == 0.0, r.src, ": router_jitter_noise ", jitter,
                 " is not supported (only 0)");
  const int64_t step = mixtral ? 1 : r.integer("decoder_sparse_step", 1);
  TR_CHECK_TYPED(ConfigError, step >= 1, r.src, ": decoder_sparse_step must be >= 1");
  std::vector<bool> dense(static_cast<size_t>(c.num_hidden_layers), false);
  if (const json* only = key(r.j, "mlp_only_layers"); only && !mixtral) {
    TR_CHECK_TYPED(ConfigError, only->is_array(), r.src, ": mlp_only_layers must be a list");
    for (const auto& e : *only) {
      TR_CHECK_TYPED(
          ConfigError,
          e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < c.num_hidden_layers,
          r.src, ": mlp_only_layers holds ", e.dump(), "; expected layer indices below ",
          c.num_hidden_layers);
      dense[static_cast<size_t>(e.get<int64_t>())] = true;
    }
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    c.moe_layers.push_back(!dense[static_cast<size_t>(i)] && (i + 1) % step == 0);
}

// One RoPE dict (rope_parameters, rope_scaling, or one layer type's entry of Gemma 3's nested
// rope_parameters): its type and the keys that type needs. `what` names the dict in errors.
void read_rope_dict(const Keys& r, const json& d, const std::string& what, const LlamaConfig& c,
                    RopeConfig& rc) {
  rc.theta = r.real(d, "rope_theta", rc.theta);
  rc.partial_rotary_factor = r.real(d, "partial_rotary_factor", rc.partial_rotary_factor);
  const json* t = key(d, "rope_type");
  if (!t) t = key(d, "type");
  rc.type = t && t->is_string() ? t->get<std::string>() : "default";
  if (rc.type == "su" || rc.type == "yarn") {
    // transformers' Phi3Config reads the names of older Phi-3 files as longrope.
    TR_CHECK_TYPED(ConfigError, c.model_type == "phi3", r.src, ": ", what, " rope_type \"", rc.type,
                   "\" is not supported (supported: default, linear, llama3, longrope)");
    rc.type = "longrope";
  }
  TR_CHECK_TYPED(
      ConfigError,
      rc.type == "default" || rc.type == "linear" || rc.type == "llama3" || rc.type == "longrope",
      r.src, ": ", what, " rope_type \"", rc.type,
      "\" is not supported (supported: default, linear, llama3, longrope)");
  if (rc.type == "linear" || rc.type == "llama3") {
    TR_CHECK_TYPED(ConfigError, key(d, "factor"), r.src, ": rope type ", rc.type,
                   " needs \"factor\"");
    rc.factor = r.real(d, "factor", 1.0);
  }
  if (rc.type == "llama3") {
    rc.low_freq_factor = r.real(d, "low_freq_factor", 1.0);
    rc.high_freq_factor = r.real(d, "high_freq_factor", 4.0);
    const json* o = key(d, "original_max_position_embeddings");
    TR_CHECK_TYPED(ConfigError, o && o->is_number_integer(), r.src,
                   ": rope type llama3 needs an integer \"original_max_position_embeddings\"");
    rc.original_max_position_embeddings = o->get<int64_t>();
  }
  if (rc.type == "longrope") {
    // transformers (modeling_rope_utils _compute_longrope_parameters): the pretraining context
    // from the top level where Phi-3 writes it, the factor max / original unless given, the
    // attention factor sqrt(1 + ln(factor) / ln(original)) unless given.
    rc.original_max_position_embeddings =
        r.integer("original_max_position_embeddings",
                  key(d, "original_max_position_embeddings") &&
                          d["original_max_position_embeddings"].is_number_integer()
                      ? d["original_max_position_embeddings"].get<int64_t>()
                      : c.max_position_embeddings);
    TR_CHECK_TYPED(ConfigError, rc.original_max_position_embeddings > 1, r.src,
                   ": original_max_position_embeddings must be > 1");
    rc.factor = key(d, "factor") ? r.real(d, "factor", 1.0)
                                 : static_cast<double>(c.max_position_embeddings) /
                                       static_cast<double>(rc.original_max_position_embeddings);
    rc.attention_factor =
        key(d, "attention_factor")
            ? r.real(d, "attention_factor", 1.0)
            : (rc.factor <= 1.0 ? 1.0
                                : std::sqrt(1 + std::log(rc.factor) /
                                                    std::log(static_cast<double>(
                                                        rc.original_max_position_embeddings))));
    const int64_t half = rc.rotary_dim(c.head_dim) / 2;
    for (auto [name, list] :
         {std::pair<const char*, std::vector<double>*>{"short_factor", &rc.short_factor},
          {"long_factor", &rc.long_factor}}) {
      const json* f = key(d, name);
      TR_CHECK_TYPED(ConfigError, f && f->is_array(), r.src, ": rope type longrope needs a list \"",
                     name, "\"");
      for (const auto& x : *f) {
        TR_CHECK_TYPED(ConfigError, x.is_number() && x.get<double>() > 0, r.src, ": ", name,
                       " holds ", x.dump(), "; expected positive numbers");
        list->push_back(x.get<double>());
      }
      TR_CHECK_TYPED(ConfigError, static_cast<int64_t>(list->size()) == half, r.src, ": ", name,
                     " has ", list->size(), " entries; the rotated width / 2 is ", half);
    }
  }
}

// RoPE: transformers 5.x writes rope_parameters {rope_type, rope_theta, ...} (Gemma 3: one per
// layer type, {full_attention: {...}, sliding_attention: {...}}); 4.x writes rope_theta at the
// top and rope_scaling {type | rope_type, factor, ...} (null = default), Gemma 3 also
// rope_local_base_freq for the sliding layers.
void read_rope(const Keys& r, LlamaConfig& c) {
  const bool gemma3 = c.model_type == "gemma3_text";
  const json* rp = key(r.j, "rope_parameters");
  const json* rs = key(r.j, "rope_scaling");
  c.rope.theta = r.real("rope_theta", gemma3 ? 1e6 : 10000.0);
  c.rope.partial_rotary_factor = r.real("partial_rotary_factor", 1.0);
  if (gemma3) {
    c.rope_local = RopeConfig{};
    c.rope_local.theta = r.real("rope_local_base_freq", 10000.0);
  }
  if (rp) {
    TR_CHECK_TYPED(ConfigError, rp->is_object(), r.src, ": rope_parameters must be an object");
    const json* full = key(*rp, "full_attention");
    const json* local = key(*rp, "sliding_attention");
    if (full || local) {
      TR_CHECK_TYPED(ConfigError, gemma3 || !local, r.src,
                     ": rope_parameters per layer type are read for gemma3_text only");
      if (full) read_rope_dict(r, *full, "rope_parameters.full_attention", c, c.rope);
      if (local) read_rope_dict(r, *local, "rope_parameters.sliding_attention", c, c.rope_local);
    } else {
      read_rope_dict(r, *rp, "rope_parameters", c, c.rope);
    }
  } else if (rs) {
    TR_CHECK_TYPED(ConfigError, rs->is_object(), r.src, ": rope_scaling must be an object or null");
    read_rope_dict(r, *rs, "rope_scaling", c, c.rope);
  }
  for (const RopeConfig* rc : {&c.rope, &c.rope_local}) {
    if (rc->type.empty()) continue;
    const int64_t rot = rc->rotary_dim(c.head_dim);
    TR_CHECK_TYPED(ConfigError, rot > 0 && rot % 2 == 0 && rot <= c.head_dim, r.src,
                   ": partial_rotary_factor ", rc->partial_rotary_factor, " of head_dim ",
                   c.head_dim, " rotates ", rot, " dimensions; expected an even number in [2, ",
                   c.head_dim, "]");
  }
  TR_CHECK_TYPED(ConfigError,
                 c.rope_local.type.empty() ||
                     c.rope_local.partial_rotary_factor == c.rope.partial_rotary_factor,
                 r.src, ": both layer types must rotate the same share of each head");
}

}  // namespace

LlamaConfig LlamaConfig::from_json(const std::string& text, const std::string& src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError(src + ": not valid JSON: " + trainrun::v1::parse_error_text(e.what()));
  }
  TR_CHECK_TYPED(ConfigError, j.is_object(), src, ": not a JSON object");
  const Keys r{j, src};
  LlamaConfig c;
  read_architecture(r, c);
  read_shape(r, c);
  read_layers(r, c);
  read_moe(r, c);
  read_rope(r, c);
  std::string dt = "float32";
  if (const json* d = key(j, "dtype"); d && d->is_string())
    dt = d->get<std::string>();
  else if (const json* d2 = key(j, "torch_dtype"); d2 && d2->is_string())
    dt = d2->get<std::string>();
  c.dtype = dtype_name(dt);
  scalar_type(c.dtype, src + " dtype");
  return c;
}

std::string LlamaConfig::to_json(const std::string& original, const std::string& dtype) const {
  json j = original.empty() ? json::object() : json::parse(original);
  static const std::map<std::string, std::string> arch = {
      {"llama", "Llama"},        {"mistral", "Mistral"}, {"qwen2", "Qwen2"},
      {"qwen3", "Qwen3"},        {"gemma", "Gemma"},     {"gemma2", "Gemma2"},
      {"gemma3_text", "Gemma3"}, {"phi3", "Phi3"},       {"mixtral", "Mixtral"},
      {"qwen3_moe", "Qwen3Moe"}};
  j["architectures"] = {arch.at(model_type) +
                        (num_labels > 0 ? "ForSequenceClassification" : "ForCausalLM")};
  if (num_labels > 0) {
    // transformers derives num_labels from id2label; both maps as its save_pretrained writes them.
    json id2label = json::object(), label2id = json::object();
    for (int64_t i = 0; i < num_labels; ++i) {
      id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
      label2id["LABEL_" + std::to_string(i)] = i;
    }
    j["id2label"] = id2label;
    j["label2id"] = label2id;
  }
  if (pad_token_id >= 0) j["pad_token_id"] = pad_token_id;
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (!llama_like(model_type)) {
    // The other families' activation, RoPE and layer keys are the input's, unchanged.
    j["torch_dtype"] = dtype;
    j["dtype"] = dtype;
    return j.dump(2) + "\n";
  }
  j["hidden_act"] = "silu";
  if (model_type == "llama") j["attention_bias"] = qkv_bias, j["mlp_bias"] = mlp_bias;
  if (model_type == "mistral")
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  // Both RoPE spellings: 4.x reads rope_theta + rope_scaling, 5.x rope_parameters.
  json params = {{"rope_type", rope.type}, {"rope_theta", rope.theta}};
  json legacy = nullptr;
  if (rope.type != "default") {
    params["factor"] = rope.factor;
    legacy = {{"rope_type", rope.type}, {"factor", rope.factor}};
  }
  if (rope.type == "llama3")
    for (json* o : {&params, &legacy}) {
      (*o)["low_freq_factor"] = rope.low_freq_factor;
      (*o)["high_freq_factor"] = rope.high_freq_factor;
      (*o)["original_max_position_embeddings"] = rope.original_max_position_embeddings;
    }
  if (rope.type == "longrope")
    for (json* o : {&params, &legacy}) {
      (*o)["short_factor"] = rope.short_factor;
      (*o)["long_factor"] = rope.long_factor;
      (*o)["original_max_position_embeddings"] = rope.original_max_position_embeddings;
      (*o)["attention_factor"] = rope.attention_factor;
    }
  if (rope.partial_rotary_factor != 1.0)
    params["partial_rotary_factor"] = rope.partial_rotary_factor;
  j["rope_theta"] = rope.theta;
  j["rope_scaling"] = legacy;
  j["rope_parameters"] = params;
  j["torch_dtype"] = dtype;  // 4.x
  j["dtype"] = dtype;        // 5.x
  return j.dump(2) + "\n";
}

}  // namespace trainrun::llama
