// The llama family's config.json: read (LlamaConfig::from_json, every variant's keys of
// transformers 4.x and 5.x) and written back on top of the original (to_json).
#include <nlohmann/json.hpp>

#include <set>
#include <string>

#include "llama.hpp"
#include "trainrun/error.hpp"

namespace trainrun::llama {

using nlohmann::json;
using v1::ConfigError;

namespace {

const std::set<std::string> kModelTypes = {"llama", "mistral", "qwen2", "qwen3"};

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
                 ": no \"model_type\" (the llama plugin "
                 "reads model_type llama, mistral, qwen2, qwen3)");
  c.model_type = mt->get<std::string>();
  TR_CHECK_TYPED(
      ConfigError, kModelTypes.count(c.model_type), r.src, ": model_type \"", c.model_type,
      "\" is not supported by the llama plugin (supported: llama, mistral, qwen2, qwen3)");
  bool classifier = false;
  if (const json* a = key(r.j, "architectures"); a && a->is_array())
    for (const auto& name : *a) {
      const std::string s = name.is_string() ? name.get<std::string>() : name.dump();
      classifier = classifier || ends_with(s, "ForSequenceClassification");
      TR_CHECK_TYPED(ConfigError,
                     ends_with(s, "ForCausalLM") || ends_with(s, "ForSequenceClassification"),
                     r.src, ": architectures lists \"", s,
                     "\"; the llama plugin builds *ForCausalLM models (LlamaForCausalLM, "
                     "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) and their "
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

// Activation, biases, norms and attention variants: what each family turns on, and the variants
// the plugin refuses rather than computes differently from transformers.
void read_layers(const Keys& r, LlamaConfig& c) {
  c.rms_norm_eps = r.real("rms_norm_eps", 1e-6);
  c.initializer_range = r.real("initializer_range", 0.02);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  if (const json* act = key(r.j, "hidden_act"))
    TR_CHECK_TYPED(ConfigError, act->is_string() && act->get<std::string>() == "silu", r.src,
                   ": hidden_act ", act->dump(),
                   " is not supported (the llama plugin's MLP is SwiGLU, \"silu\")");
  if (const json* tp = key(r.j, "pretraining_tp"))
    TR_CHECK_TYPED(ConfigError, tp->is_number_integer() && tp->get<int64_t>() == 1, r.src,
                   ": pretraining_tp ", tp->dump(), " is not supported (only 1)");
  const double dropout = r.real("attention_dropout", 0.0);
  TR_CHECK_TYPED(ConfigError, dropout == 0.0, r.src, ": attention_dropout ", dropout,
                 " is not supported (only 0)");

  // Biases: Llama's attention_bias puts one on q, k, v and o; Qwen2 has them on q, k, v only.
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;
  } else {
    c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
  }
  c.mlp_bias = r.boolean("mlp_bias", false);
  c.qk_norm = c.model_type == "qwen3";

  // Sliding window: Mistral applies sliding_window when set; Qwen2/3 only with
  // use_sliding_window (and then only on some layers), which is not supported.
  if (c.model_type == "mistral") {
    c.sliding_window = r.integer("sliding_window", 0);
  } else if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    TR_CHECK_TYPED(ConfigError, !r.boolean("use_sliding_window", false), r.src,
                   ": use_sliding_window = true is not supported for ", c.model_type,
                   " (only full attention on every layer)");
  }
  if (const json* lt = key(r.j, "layer_types"); lt && lt->is_array())
    for (const auto& t : *lt)
      TR_CHECK_TYPED(
          ConfigError,
          t == "full_attention" || (c.model_type == "mistral" && t == "sliding_attention"), r.src,
          ": layer_types contains ", t.dump(), "; only \"full_attention\" is supported");
}

// RoPE: transformers 5.x writes rope_parameters {rope_type, rope_theta, ...}; 4.x writes
// rope_theta at the top and rope_scaling {type | rope_type, factor, ...} (null = default).
void read_rope(const Keys& r, LlamaConfig& c) {
  const json* rp = key(r.j, "rope_parameters");
  const json* rs = key(r.j, "rope_scaling");
  c.rope_theta = r.real("rope_theta", 10000.0);
  const json* scaling = nullptr;
  if (rp) {
    TR_CHECK_TYPED(ConfigError, rp->is_object(), r.src, ": rope_parameters must be an object");
    c.rope_theta = r.real(*rp, "rope_theta", c.rope_theta);
    scaling = rp;
  } else if (rs) {
    TR_CHECK_TYPED(ConfigError, rs->is_object(), r.src, ": rope_scaling must be an object or null");
    scaling = rs;
  }
  if (!scaling) return;
  const json* t = key(*scaling, "rope_type");
  if (!t) t = key(*scaling, "type");
  c.rope_type = t && t->is_string() ? t->get<std::string>() : "default";
  TR_CHECK_TYPED(ConfigError,
                 c.rope_type == "default" || c.rope_type == "linear" || c.rope_type == "llama3",
                 r.src, ": ", rp ? "rope_parameters" : "rope_scaling", " rope_type \"", c.rope_type,
                 "\" is not supported (supported: default, linear, llama3)");
  if (c.rope_type != "default") {
    TR_CHECK_TYPED(ConfigError, key(*scaling, "factor"), r.src, ": rope type ", c.rope_type,
                   " needs \"factor\"");
    c.rope_factor = r.real(*scaling, "factor", 1.0);
  }
  if (c.rope_type == "llama3") {
    c.low_freq_factor = r.real(*scaling, "low_freq_factor", 1.0);
    c.high_freq_factor = r.real(*scaling, "high_freq_factor", 4.0);
    const json* o = key(*scaling, "original_max_position_embeddings");
    TR_CHECK_TYPED(ConfigError, o && o->is_number_integer(), r.src,
                   ": rope type llama3 needs an integer \"original_max_position_embeddings\"");
    c.original_max_position_embeddings = o->get<int64_t>();
  }
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
      {"llama", "Llama"}, {"mistral", "Mistral"}, {"qwen2", "Qwen2"}, {"qwen3", "Qwen3"}};
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
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (model_type == "llama") j["attention_bias"] = qkv_bias, j["mlp_bias"] = mlp_bias;
  if (model_type == "mistral")
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  // Both RoPE spellings: 4.x reads rope_theta + rope_scaling, 5.x rope_parameters.
  json params = {{"rope_type", rope_type}, {"rope_theta", rope_theta}};
  json legacy = nullptr;
  if (rope_type != "default") {
    params["factor"] = rope_factor;
    legacy = {{"rope_type", rope_type}, {"factor", rope_factor}};
  }
  if (rope_type == "llama3")
    for (json* o : {&params, &legacy}) {
      (*o)["low_freq_factor"] = low_freq_factor;
      (*o)["high_freq_factor"] = high_freq_factor;
      (*o)["original_max_position_embeddings"] = original_max_position_embeddings;
    }
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = legacy;
  j["rope_parameters"] = params;
  j["torch_dtype"] = dtype;  // 4.x
  j["dtype"] = dtype;        // 5.x
  return j.dump(2) + "\n";
}

}  // namespace trainrun::llama
