// `trainrun export --format gguf` (gguf_export.hpp). Two passes over the weights: the tensor
// infos come from the safetensors headers alone (names, shapes, the chosen type's byte count),
// so the header is written first and each tensor is then read, converted and appended on its
// own: the export holds one tensor at a time, never the model.
#include "gguf_export.hpp"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <cerrno>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/hf/model_dir.hpp"
#include "trainrun/hf/safetensors.hpp"

namespace trainrun::app {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// GGUF's metadata value types and ggml's tensor types (ggml.h), as numbered in the file.
enum : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9 };
enum : uint32_t { kTF32 = 0, kTF16 = 1, kTQ4_0 = 2, kTQ4_1 = 3, kTQ8_0 = 8, kTBF16 = 30 };
constexpr int64_t kBlock = 32;   // weights per block in Q8_0, Q4_0, Q4_1
constexpr uint64_t kAlign = 32;  // general.alignment's default

// llama.cpp's general.file_type (LLAMA_FTYPE_*): the type most tensors have.
uint32_t file_type(GgufType t) {
  switch (t) {
    case GgufType::F32:
      return 0;
    case GgufType::F16:
      return 1;
    case GgufType::Q4_0:
      return 2;
    case GgufType::Q4_1:
      return 3;
    case GgufType::Q8_0:
      return 7;
    case GgufType::BF16:
      return 32;
  }
  return 0;
}

// Little-endian bytes of the header, built in memory (it is small next to the tensors).
class Bytes {
 public:
  void u32(uint32_t v) { raw(&v, 4); }
  void i32(int32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void f32(float v) { raw(&v, 4); }
  void u8(uint8_t v) { raw(&v, 1); }
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) {
    const auto* c = static_cast<const char*>(p);
    data_.insert(data_.end(), c, c + n);
  }
  void pad_to(uint64_t align) {
    while (data_.size() % align != 0) data_.push_back(0);
  }
  const std::vector<char>& data() const { return data_; }

 private:
  std::vector<char> data_;
};

// The metadata, in the order added.
class Metadata {
 public:
  void u32(const std::string& k, uint32_t v) { key(k, kU32).u32(v), ++n_; }
  void f32(const std::string& k, float v) { key(k, kF32).f32(v), ++n_; }
  void boolean(const std::string& k, bool v) { key(k, kBool).u8(v ? 1 : 0), ++n_; }
  void str(const std::string& k, const std::string& v) { key(k, kString).str(v), ++n_; }
  void strings(const std::string& k, const std::vector<std::string>& v) {
    key(k, kArray).u32(kString);
    b_.u64(v.size());
    for (const auto& s : v) b_.str(s);
    ++n_;
  }
  void i32s(const std::string& k, const std::vector<int32_t>& v) {
    key(k, kArray).u32(kI32);
    b_.u64(v.size());
    for (int32_t x : v) b_.i32(x);
    ++n_;
  }
  uint64_t count() const { return n_; }
  const Bytes& bytes() const { return b_; }

 private:
  Bytes& key(const std::string& k, uint32_t type) {
    b_.str(k);
    b_.u32(type);
    return b_;
  }
  Bytes b_;
  uint64_t n_ = 0;
};

json read_json(const fs::path& p) {
  try {
    return json::parse(hf::read_text_file(p.string()));
  } catch (const json::exception& e) {
    throw v1::ConfigError(p.string() + ": not JSON: " + e.what());
  }
}

// float32 -> IEEE half / bfloat16 bits, rounding to nearest even (as numpy's astype and
// torch's casts, which llama.cpp's converter uses).
uint16_t half_bits(float x) { return c10::Half(x).x; }

// ggml's reference quantizers (ggml-quants.c, quantize_row_*_ref), one block of 32 floats to
// its bytes, with the same float32 operations in the same order so the bytes agree.
void quantize_q8_0(const float* x, uint8_t* out) {
  float amax = 0;
  for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = half_bits(d);
  std::memcpy(out, &dh, 2);
  for (int64_t j = 0; j < kBlock; ++j)
    out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
}

void quantize_q4_0(const float* x, uint8_t* out) {
  float amax = 0, max = 0;  // the value of largest magnitude, with its sign
  for (int64_t j = 0; j < kBlock; ++j)
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
  const float d = max / -8.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = half_bits(d);
  std::memcpy(out, &dh, 2);
  auto q = [&](float v) {
    return static_cast<uint8_t>(std::min(15, static_cast<int>(std::trunc(v * id + 8.5f))));
  };
  for (int64_t j = 0; j < kBlock / 2; ++j)
    out[2 + j] = static_cast<uint8_t>(q(x[j]) | (q(x[j + kBlock / 2]) << 4));
}

void quantize_q4_1(const float* x, uint8_t* out) {
  float lo = x[0], hi = x[0];
  for (int64_t j = 1; j < kBlock; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
  const float d = (hi - lo) / 15.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = half_bits(d), mh = half_bits(lo);
  std::memcpy(out, &dh, 2);
  std::memcpy(out + 2, &mh, 2);
  auto q = [&](float v) {
    return static_cast<uint8_t>(std::min(15, static_cast<int>(std::trunc((v - lo) * id + 0.5f))));
  };
  for (int64_t j = 0; j < kBlock / 2; ++j)
    out[4 + j] = static_cast<uint8_t>(q(x[j]) | (q(x[j + kBlock / 2]) << 4));
}

int64_t block_bytes(uint32_t t) { return t == kTQ8_0 ? 34 : t == kTQ4_0 ? 18 : 20; }

// One tensor as it will be written.
struct Planned {
  std::string hf_name, name;
  const hf::SafetensorsFile* file = nullptr;
  std::vector<int64_t> shape;  // torch order; GGUF's dims are its reverse
  uint32_t type = kTF32;
  int64_t heads = 0;  // > 0: permute the rows for llama's rope (q_proj, k_proj)
  uint64_t bytes = 0, offset = 0;
};

// HF's rotate-half rope pairs dimension i with i + d/2 inside each head; llama.cpp's "llama"
// architecture pairs 2i with 2i + 1, so the converter reorders each head's rows:
// [heads, 2, d/2, in] -> [heads, d/2, 2, in].
at::Tensor permute_for_rope(const at::Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0);
  std::vector<int64_t> shape = {heads, 2, rows / heads / 2};
  for (int64_t i = 1; i < w.dim(); ++i) shape.push_back(w.size(i));
  return w.reshape(shape).transpose(1, 2).reshape(w.sizes()).contiguous();
}

// HF name -> GGUF name (llama.cpp's tensor names, gguf-py's tensor_mapping.py), "" when the
// tensor is not part of the model (rotary_emb.inv_freq).
std::string gguf_name(const std::string& n) {
  if (n == "model.embed_tokens.weight") return "token_embd.weight";
  if (n == "model.norm.weight") return "output_norm.weight";
  if (n == "lm_head.weight") return "output.weight";
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+)\.(weight|bias))");
  std::smatch m;
  if (std::regex_match(n, m, layer)) {
    static const std::map<std::string, std::string> part = {
        {"input_layernorm", "attn_norm"},    {"post_attention_layernorm", "ffn_norm"},
        {"self_attn.q_proj", "attn_q"},      {"self_attn.k_proj", "attn_k"},
        {"self_attn.v_proj", "attn_v"},      {"self_attn.o_proj", "attn_output"},
        {"self_attn.q_norm", "attn_q_norm"}, {"self_attn.k_norm", "attn_k_norm"},
        {"mlp.gate_proj", "ffn_gate"},       {"mlp.up_proj", "ffn_up"},
        {"mlp.down_proj", "ffn_down"}};
    if (auto it = part.find(m[2].str()); it != part.end())
      return "blk." + m[1].str() + "." + it->second + "." + m[3].str();
  }
  if (n.find("rotary_emb.inv_freq") != std::string::npos) return "";
  return "?";
}

// llama.cpp's name for the pre-tokenizer's split (tokenizer.ggml.pre), from tokenizer.json.
std::string pre_tokenizer_name(const json& tok, const std::string& file) {
  const json& pre = tok.value("pre_tokenizer", json());
  const std::string llama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (pre.is_object()) {
    const std::string type = pre.value("type", "");
    if (type == "ByteLevel" && pre.value("use_regex", true)) return "gpt-2";
    if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
      const json& seq = pre["pretokenizers"];
      if (seq.size() == 2 && seq[0].value("type", "") == "Digits" &&
          seq[0].value("individual_digits", false) && seq[1].value("type", "") == "ByteLevel")
        return "smollm";
      if (seq.size() == 2 && seq[0].value("type", "") == "Split" &&
          seq[1].value("type", "") == "ByteLevel" && seq[0].contains("pattern") &&
          seq[0]["pattern"].contains("Regex")) {
        const std::string r = seq[0]["pattern"]["Regex"].get<std::string>();
        if (r == llama3) return "llama-bpe";
        if (r == qwen2) return "qwen2";
      }
    }
  }
  throw v1::ConfigError(file + ": pre_tokenizer " + pre.dump().substr(0, 300) +
                        " has no llama.cpp name this export knows (gpt-2, llama-bpe, qwen2, "
                        "smollm); give it with --tokenizer-pre NAME (llama.cpp's "
                        "tokenizer.ggml.pre)");
}

// Special tokens llama.cpp treats as control tokens although not marked special (the
// converter's does_token_look_special: <|...|> and <...> forms).
bool looks_special(const std::string& t) {
  static const std::regex angle(R"(<\|.*\|>|<[A-Za-z_]+>|</[A-Za-z_]+>)");
  return std::regex_match(t, angle);
}

void add_tokenizer(Metadata& md, const fs::path& dir, int64_t vocab_size,
                   const GgufExportOptions& o) {
  const fs::path tj = dir / "tokenizer.json";
  if (!fs::is_regular_file(tj))
    throw v1::ConfigError(dir.string() + ": no tokenizer.json (GGUF carries the tokenizer)");
  const json tok = read_json(tj);
  const json& model = tok.value("model", json::object());
  if (model.value("type", "") != "BPE" || model.value("byte_fallback", false) ||
      !model.contains("vocab"))
    throw v1::ConfigError(tj.string() + ": model " + model.value("type", "?") +
                          (model.value("byte_fallback", false) ? " with byte_fallback" : "") +
                          ": GGUF export writes byte-level BPE tokenizers (tokenizer.ggml.model "
                          "gpt2) only; SentencePiece-style vocabularies are not supported yet");
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  std::vector<int32_t> types(static_cast<size_t>(vocab_size), 0);
  auto put = [&](int64_t id, const std::string& t, int32_t type, const std::string& where) {
    if (id < 0 || id >= vocab_size)
      throw v1::ConfigError(tj.string() + ": " + where + " token '" + t + "' has id " +
                            std::to_string(id) + ", outside config.json's vocab_size " +
                            std::to_string(vocab_size));
    tokens[static_cast<size_t>(id)] = t;
    types[static_cast<size_t>(id)] = type;
  };
  std::map<std::string, int64_t> id_of;
  for (const auto& [t, id] : model["vocab"].items()) {
    put(id.get<int64_t>(), t, 1, "model.vocab");
    id_of[t] = id.get<int64_t>();
  }
  for (const auto& a : tok.value("added_tokens", json::array())) {
    const std::string t = a.value("content", "");
    const bool special = a.value("special", false) || looks_special(t);
    put(a.value("id", int64_t{-1}), t, special ? 3 : 4, "added_tokens");  // CONTROL, USER_DEFINED
    id_of[t] = a.value("id", int64_t{-1});
  }
  // Ids config.json counts beyond the tokenizer's (a vocabulary padded for the matmuls): the
  // converter writes them as unused placeholders.
  for (size_t i = 0; i < tokens.size(); ++i)
    if (types[i] == 0) tokens[i] = "[PAD" + std::to_string(i) + "]", types[i] = 5;  // UNUSED
  std::vector<std::string> merges;
  for (const auto& m : model.value("merges", json::array()))
    merges.push_back(m.is_string() ? m.get<std::string>()
                                   : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());

  json cfg = json::object();
  if (fs::is_regular_file(dir / "tokenizer_config.json"))
    cfg = read_json(dir / "tokenizer_config.json");
  md.str("tokenizer.ggml.model", "gpt2");
  md.str("tokenizer.ggml.pre",
         o.tokenizer_pre.empty() ? pre_tokenizer_name(tok, tj.string()) : o.tokenizer_pre);
  md.strings("tokenizer.ggml.tokens", tokens);
  md.i32s("tokenizer.ggml.token_type", types);
  md.strings("tokenizer.ggml.merges", merges);
  // Special tokens as tokenizer_config.json names them (a string or {"content": ...}).
  auto special = [&](const char* key, const char* gguf_key) {
    if (!cfg.contains(key) || cfg[key].is_null()) return;
    const std::string t =
        cfg[key].is_string() ? cfg[key].get<std::string>() : cfg[key].value("content", "");
    const auto it = id_of.find(t);
    if (it == id_of.end())
      throw v1::ConfigError((dir / "tokenizer_config.json").string() + ": " + key + " '" + t +
                            "' is not in tokenizer.json's vocabulary");
    md.u32(gguf_key, static_cast<uint32_t>(it->second));
  };
  special("bos_token", "tokenizer.ggml.bos_token_id");
  special("eos_token", "tokenizer.ggml.eos_token_id");
  special("unk_token", "tokenizer.ggml.unknown_token_id");
  special("pad_token", "tokenizer.ggml.padding_token_id");
  // Whether encoding adds BOS: tokenizer_config's add_bos_token, else whether the
  // post-processor's single-sequence template starts with a special token.
  bool add_bos = false;
  if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
    add_bos = cfg["add_bos_token"].get<bool>();
  } else if (tok.contains("post_processor") && tok["post_processor"].is_object()) {
    std::function<bool(const json&)> starts_special = [&](const json& pp) {
      if (pp.value("type", "") == "TemplateProcessing" && pp.contains("single") &&
          pp["single"].is_array() && !pp["single"].empty())
        return pp["single"][0].contains("SpecialToken");
      if (pp.value("type", "") == "Sequence" && pp.contains("processors"))
        for (const auto& p : pp["processors"])
          if (starts_special(p)) return true;
      return false;
    };
    add_bos = starts_special(tok["post_processor"]);
  }
  md.boolean("tokenizer.ggml.add_bos_token", add_bos);
  bool prefix_space = false;
  if (tok.contains("pre_tokenizer") && tok["pre_tokenizer"].is_object())
    prefix_space = tok["pre_tokenizer"].value("add_prefix_space", false);
  md.boolean("tokenizer.ggml.add_space_prefix", prefix_space);
  std::string chat_template;
  if (cfg.contains("chat_template") && cfg["chat_template"].is_string())
    chat_template = cfg["chat_template"].get<std::string>();
  else if (fs::is_regular_file(dir / "chat_template.jinja"))
    chat_template = hf::read_text_file((dir / "chat_template.jinja").string());
  if (!chat_template.empty()) md.str("tokenizer.chat_template", chat_template);
}

// Writes all of `b` at the file's current position.
void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw v1::Error(path + ": write failed: " + std::strerror(errno));
    }
    c += w, n -= static_cast<size_t>(w);
  }
}

}  // namespace

GgufType parse_gguf_type(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::map<std::string, GgufType> types = {
      {"f32", GgufType::F32},   {"f16", GgufType::F16},   {"bf16", GgufType::BF16},
      {"q8_0", GgufType::Q8_0}, {"q4_0", GgufType::Q4_0}, {"q4_1", GgufType::Q4_1}};
  const auto it = types.find(n);
  if (it == types.end())
    throw v1::ConfigError("--type '" + name + "': give f32, f16, bf16, q8_0, q4_0 or q4_1");
  return it->second;
}

GgufExportSummary write_gguf(const std::string& hf_dir, const std::string& output,
                             const GgufExportOptions& o) {
  const fs::path dir(hf_dir);
  const fs::path cfg_path = dir / "config.json";
  if (!fs::is_regular_file(cfg_path))
    throw v1::ConfigError(hf_dir + ": no config.json (not a Hugging Face model directory)");
  const json cfg = read_json(cfg_path);
  const std::string model_type = cfg.value("model_type", "");
  std::string arch;
  bool permute = false;
  if (model_type == "llama" || model_type == "mistral")
    arch = "llama", permute = true;
  else if (model_type == "qwen2" || model_type == "qwen3")
    arch = model_type;
  else
    throw v1::ConfigError(cfg_path.string() + ": model_type '" + model_type +
                          "': GGUF export knows llama, mistral, qwen2 and qwen3");
  auto get_int = [&](const char* k) -> int64_t {
    if (!cfg.contains(k) || !cfg[k].is_number_integer())
      throw v1::ConfigError(cfg_path.string() + ": no integer '" + k + "'");
    return cfg[k].get<int64_t>();
  };
  const int64_t hidden = get_int("hidden_size"), layers = get_int("num_hidden_layers"),
                heads = get_int("num_attention_heads"), vocab = get_int("vocab_size");
  const int64_t kv_heads =
      cfg.contains("num_key_value_heads") && cfg["num_key_value_heads"].is_number_integer()
          ? cfg["num_key_value_heads"].get<int64_t>()
          : heads;
  const int64_t head_dim = cfg.contains("head_dim") && cfg["head_dim"].is_number_integer()
                               ? cfg["head_dim"].get<int64_t>()
                               : hidden / heads;
  // Rope as transformers 4 (rope_theta, rope_scaling) or 5 (rope_parameters) writes it.
  const json rope = cfg.contains("rope_parameters") && cfg["rope_parameters"].is_object()
                        ? cfg["rope_parameters"]
                        : cfg.value("rope_scaling", json());
  const double rope_theta =
      cfg.contains("rope_theta") && cfg["rope_theta"].is_number() ? cfg["rope_theta"].get<double>()
      : rope.is_object() && rope.contains("rope_theta")           ? rope["rope_theta"].get<double>()
                                                                  : 10000.0;
  if (rope.is_object()) {
    const std::string t = rope.value("rope_type", rope.value("type", std::string("default")));
    if (t != "default")
      throw v1::ConfigError(
          cfg_path.string() + ": rope type '" + t +
          "': GGUF export writes unscaled rope only (not yet: llama3, yarn, linear)");
  }

  // The weights: one file or the index's shards, each header read once.
  std::vector<std::unique_ptr<hf::SafetensorsFile>> files;
  if (fs::is_regular_file(dir / "model.safetensors.index.json")) {
    const json idx = read_json(dir / "model.safetensors.index.json");
    std::vector<std::string> shards;
    for (const auto& [name, file] : idx.value("weight_map", json::object()).items())
      if (std::find(shards.begin(), shards.end(), file.get<std::string>()) == shards.end())
        shards.push_back(file.get<std::string>());
    std::sort(shards.begin(), shards.end());
    for (const auto& s : shards)
      files.push_back(std::make_unique<hf::SafetensorsFile>((dir / s).string()));
  } else if (fs::is_regular_file(dir / "model.safetensors")) {
    files.push_back(std::make_unique<hf::SafetensorsFile>((dir / "model.safetensors").string()));
  } else {
    throw v1::ConfigError(hf_dir + ": no model.safetensors or model.safetensors.index.json");
  }

  const uint32_t quant = o.type == GgufType::Q8_0   ? kTQ8_0
                         : o.type == GgufType::Q4_0 ? kTQ4_0
                         : o.type == GgufType::Q4_1 ? kTQ4_1
                                                    : kTF32;
  GgufExportSummary summary;
  summary.architecture = arch;
  // The output layer (lm_head, or the tied embedding that serves as it) stays at 8 bits under a
  // 4-bit type, as llama.cpp's quantizer keeps it at a higher precision than the layers: its
  // error reaches every logit (SmolLM2 at q4_0 otherwise: logits up to 20 away).
  bool has_output = false;
  for (const auto& f : files) has_output = has_output || f->find("lm_head.weight") != nullptr;
  const std::string output_name = has_output ? "output.weight" : "token_embd.weight";
  std::vector<Planned> plan;
  for (const auto& f : files)
    for (const auto& e : f->entries()) {
      const std::string name = gguf_name(e.name);
      if (name.empty()) continue;
      if (name == "?")
        throw v1::ConfigError(f->path() + ": tensor '" + e.name +
                              "' has no GGUF name in architecture " + arch + " (not a " +
                              model_type + " weight this export knows)");
      Planned p;
      p.hf_name = e.name, p.name = name, p.file = f.get(), p.shape = e.shape;
      if (permute && e.name.find("self_attn.q_proj.") != std::string::npos) p.heads = heads;
      if (permute && e.name.find("self_attn.k_proj.") != std::string::npos) p.heads = kv_heads;
      const int64_t numel = e.numel();
      if (e.shape.size() < 2 || o.type == GgufType::F32) {
        p.type = kTF32;
        if (o.type == GgufType::F32 && e.shape.size() >= 2) ++summary.in_type;
      } else if (o.type == GgufType::F16) {
        p.type = kTF16;
        ++summary.in_type;
      } else if (o.type == GgufType::BF16) {
        p.type = kTBF16;
        ++summary.in_type;
      } else if (e.shape.back() % kBlock == 0 && quant != kTQ8_0 && name == output_name) {
        p.type = kTQ8_0;
        summary.output_q8_0 = name;
      } else if (e.shape.back() % kBlock == 0) {
        p.type = quant;
        ++summary.in_type;
      } else {
        p.type = kTF16;
        ++summary.fell_back;
      }
      p.bytes = static_cast<uint64_t>(p.type == kTF32 ? 4 * numel
                                      : p.type == kTF16 || p.type == kTBF16
                                          ? 2 * numel
                                          : numel / kBlock * block_bytes(p.type));
      plan.push_back(std::move(p));
    }
  uint64_t off = 0;
  for (auto& p : plan) {
    p.offset = off;
    off += (p.bytes + kAlign - 1) / kAlign * kAlign;
  }

  Metadata md;
  md.str("general.architecture", arch);
  md.str("general.type", "model");
  md.str("general.name",
         o.name.empty() ? fs::absolute(dir).lexically_normal().filename().string() : o.name);
  const std::string a = arch + ".";
  md.u32(a + "block_count", static_cast<uint32_t>(layers));
  md.u32(a + "context_length", static_cast<uint32_t>(get_int("max_position_embeddings")));
  md.u32(a + "embedding_length", static_cast<uint32_t>(hidden));
  md.u32(a + "feed_forward_length", static_cast<uint32_t>(get_int("intermediate_size")));
  md.u32(a + "attention.head_count", static_cast<uint32_t>(heads));
  md.u32(a + "attention.head_count_kv", static_cast<uint32_t>(kv_heads));
  md.f32(a + "rope.freq_base", static_cast<float>(rope_theta));
  md.f32(a + "attention.layer_norm_rms_epsilon", cfg.value("rms_norm_eps", 1e-6f));
  if (head_dim != hidden / heads) {
    md.u32(a + "attention.key_length", static_cast<uint32_t>(head_dim));
    md.u32(a + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  md.u32("general.file_type", file_type(o.type));
  md.u32(a + "vocab_size", static_cast<uint32_t>(vocab));
  md.u32(a + "rope.dimension_count", static_cast<uint32_t>(head_dim));
  add_tokenizer(md, dir, vocab, o);
  md.u32("general.quantization_version", 2);

  Bytes head;
  head.raw("GGUF", 4);
  head.u32(3);
  head.u64(plan.size());
  head.u64(md.count());
  head.raw(md.bytes().data().data(), md.bytes().data().size());
  for (const auto& p : plan) {
    head.str(p.name);
    head.u32(static_cast<uint32_t>(p.shape.size()));
    for (auto it = p.shape.rbegin(); it != p.shape.rend(); ++it)
      head.u64(static_cast<uint64_t>(*it));
    head.u32(p.type);
    head.u64(p.offset);
  }
  head.pad_to(kAlign);

  const fs::path out = fs::absolute(output).lexically_normal();
  if (!out.parent_path().empty()) fs::create_directories(out.parent_path());
  const std::string tmp = out.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw v1::Error(tmp + ": cannot create: " + std::strerror(errno));
  try {
    write_all(fd, head.data().data(), head.data().size(), tmp);
    std::vector<uint8_t> buf;
    const std::vector<char> zeros(kAlign, 0);
    for (const auto& p : plan) {
      at::Tensor w = p.file->read(p.hf_name).to(at::kFloat).contiguous();
      if (p.heads > 0) {
        if (w.size(0) % (2 * p.heads) != 0)
          throw v1::ConfigError(p.file->path() + ": " + p.hf_name + " has " +
                                std::to_string(w.size(0)) + " rows, not a multiple of 2 x " +
                                std::to_string(p.heads) + " heads");
        w = permute_for_rope(w, p.heads);
      }
      const float* x = w.data_ptr<float>();
      const int64_t n = w.numel();
      buf.resize(p.bytes);
      if (p.type == kTF32) {
        std::memcpy(buf.data(), x, p.bytes);
      } else if (p.type == kTF16 || p.type == kTBF16) {
        auto* h = reinterpret_cast<uint16_t*>(buf.data());
        for (int64_t i = 0; i < n; ++i)
          h[i] = p.type == kTF16 ? half_bits(x[i]) : c10::BFloat16(x[i]).x;
      } else {
        const int64_t bb = block_bytes(p.type);
        for (int64_t b = 0; b < n / kBlock; ++b) {
          const float* src = x + b * kBlock;
          uint8_t* dst = buf.data() + b * bb;
          if (p.type == kTQ8_0)
            quantize_q8_0(src, dst);
          else if (p.type == kTQ4_0)
            quantize_q4_0(src, dst);
          else
            quantize_q4_1(src, dst);
        }
      }
      write_all(fd, buf.data(), buf.size(), tmp);
      const uint64_t pad = (kAlign - p.bytes % kAlign) % kAlign;
      write_all(fd, zeros.data(), pad, tmp);
    }
    if (::fsync(fd) != 0) throw v1::Error(tmp + ": fsync failed: " + std::strerror(errno));
    ::close(fd);
  } catch (...) {
    ::close(fd);
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  fs::rename(tmp, out);
  summary.tensors = static_cast<int64_t>(plan.size());
  summary.bytes = static_cast<int64_t>(fs::file_size(out));
  return summary;
}

}  // namespace trainrun::app
