// A directory with only tokenizer.model (no tokenizer.json). Debian's libsentencepiece carries
// its own copy of protobuf-lite symbols; linked into a process that also loads libprotobuf
// (LibTorch does), protobuf's static initialisers crash before main. Until it is loaded apart
// (dlopen'ed in its own namespace), such a directory is refused with the way out.
#include "tokenizer_internal.hpp"

namespace trainrun::text {

std::shared_ptr<TokenizerImpl> load_sentencepiece_tokenizer(const std::string& dir, const nlohmann::json&) {
  throw v1::ConfigError(dir + "/tokenizer.model: SentencePiece model files are not read yet and " + dir +
                        " has no tokenizer.json; write one with transformers: "
                        "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)");
}

}  // namespace trainrun::text
