// Fuzz target `tokenizer`: tokenizer.json text -> text::Tokenizer::from_directory (model, added
// tokens, normalizer, pre-tokenizer, post-processor and decoder chains), then what a loaded
// tokenizer is used for: encoding a short mixed-script string with and without special tokens,
// decoding the ids back, and the vocabulary lookups. Loading may refuse (ConfigError); once
// loaded, encoding valid UTF-8 and decoding the ids it gave must not throw at all.
#include <filesystem>

#include "fuzz_input.hpp"
#include "trainrun/text/tokenizer.hpp"

using namespace trainrun;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/tokenizer";
    std::filesystem::create_directories(d);
    return d;
  }();
  fuzz::write_file(dir + "/tokenizer.json", data, size);
  std::optional<text::Tokenizer> tok;
  fuzz::expect_clean([&] { tok = text::Tokenizer::from_directory(dir); });
  if (!tok) return 0;
  static const std::string sample = "Hello, wörld! 12345 <s> \t\n  \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 don't";
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = tok->encode(sample, special);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok->vocab_size())
        throw std::logic_error("encode gave id " + std::to_string(id) + " outside the vocabulary of " +
                               std::to_string(tok->vocab_size()));
      tok->id_to_token(id);  // std::out_of_range (a crash here) when the id names no token
    }
    tok->decode(ids, false);
    tok->decode(ids, true);
  }
  tok->token_to_id("Hello");
  (void)tok->bos_token_id(), (void)tok->eos_token_id(), (void)tok->pad_token_id();
  return 0;
}
