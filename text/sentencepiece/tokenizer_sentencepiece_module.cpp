// tokenizer.model through Debian's sentencepiece library, built as a module of its own
// (libtrainrun_text_sentencepiece.so) that trainrun_text loads only when a directory has no
// tokenizer.json: libsentencepiece carries a private copy of protobuf-lite whose symbols, linked
// into a process that also has LibTorch's libprotobuf, crash protobuf's initialisers before
// main. Loaded with RTLD_LOCAL | RTLD_DEEPBIND, each copy keeps to itself.
// BOS/EOS follow tokenizer_config.json's add_bos_token (default true, as transformers'
// LlamaTokenizer) and add_eos_token (default false); skip_special_tokens drops control and unknown
// pieces.
#include "../src/tokenizer_internal.hpp"

#include <sentencepiece_processor.h>

#include <filesystem>

namespace trainrun::text {

namespace {

class SentencePieceTokenizer : public TokenizerImpl {
 public:
  SentencePieceTokenizer(const std::string& directory, const nlohmann::json& config) {
    dir = directory;
    const std::string file = (std::filesystem::path(directory) / "tokenizer.model").string();
    const auto status = sp_.Load(file);
    if (!status.ok()) throw std::runtime_error(file + ": not a sentencepiece model: " + status.ToString());
    auto flag = [&](const char* key, bool dflt) {
      return config.contains(key) && config[key].is_boolean() ? config[key].get<bool>() : dflt;
    };
    add_bos_ = flag("add_bos_token", true);
    add_eos_ = flag("add_eos_token", false);
    auto named = [&](const char* key, int id) -> std::optional<std::string> {
      if (config.contains(key)) {
        const auto& v = config[key];
        if (v.is_string()) return v.get<std::string>();
        if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
        if (v.is_null()) return std::nullopt;
      }
      if (id >= 0) return sp_.IdToPiece(id);
      return std::nullopt;
    };
    bos = named("bos_token", sp_.bos_id());
    eos = named("eos_token", sp_.eos_id());
    unk = named("unk_token", sp_.unk_id());
    pad = named("pad_token", sp_.pad_id());
  }

  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& out) const override {
    const size_t bad = detail::utf8_invalid_offset(text);
    if (bad != std::string_view::npos)
      throw std::invalid_argument("text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
    std::vector<int> ids;
    const auto status = sp_.Encode(std::string(text), &ids);
    if (!status.ok()) throw std::runtime_error(dir + "/tokenizer.model: encoding failed: " + status.ToString());
    out.clear();
    if (add_special_tokens && add_bos_ && sp_.bos_id() >= 0) out.push_back(sp_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    if (add_special_tokens && add_eos_ && sp_.eos_id() >= 0) out.push_back(sp_.eos_id());
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::vector<int> keep;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] < 0 || ids[k] >= sp_.GetPieceSize())
        throw std::out_of_range("token id " + std::to_string(ids[k]) + " (position " + std::to_string(k) +
                                ") is not in the vocabulary of " + dir);
      if (skip_special_tokens && is_special(ids[k])) continue;
      keep.push_back(ids[k]);
    }
    std::string text;
    const auto status = sp_.Decode(keep, &text);
    if (!status.ok()) throw std::runtime_error(dir + "/tokenizer.model: decoding failed: " + status.ToString());
    return text;
  }

  int32_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    const int id = sp_.PieceToId(std::string(token));
    if (id == sp_.unk_id() && sp_.IdToPiece(id) != token) return std::nullopt;
    return id;
  }
  std::string id_to_token(int32_t id) const override {
    if (id < 0 || id >= sp_.GetPieceSize()) throw std::out_of_range("token id " + std::to_string(id) + " is not in the vocabulary of " + dir);
    return sp_.IdToPiece(id);
  }
  bool is_special(int32_t id) const override { return sp_.IsControl(id) || sp_.IsUnknown(id); }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  bool add_bos_ = true, add_eos_ = false;
};

}  // namespace

}  // namespace trainrun::text

// The module's one entry point (see text/src/tokenizer_sentencepiece.cpp). Errors come back as
// text, not exceptions: the module is loaded with RTLD_DEEPBIND and has its own copies of
// inline code, so exception types are kept to the loader's side.
extern "C" __attribute__((visibility("default"))) trainrun::text::TokenizerImpl* trainrun_text_sentencepiece_load(
    const std::string& dir, const nlohmann::json& config, std::string& error) {
  try {
    return new trainrun::text::SentencePieceTokenizer(dir, config);
  } catch (const std::exception& e) {
    error = e.what();
    return nullptr;
  }
}
