// Fuzz target `chat_data`: a conversation file's bytes -> chat::read_conversations: JSONL (one
// object per line: OpenAI messages, ShareGPT conversations, Alpaca records) or, when the text
// starts with '[', a JSON array of the same. Each conversation read is then rendered with the built-in chatml template
// and tokenized with the mistral fixture tokenizer (../shared/fixtures/tokenizers/mistral, when
// present), marking the trained tokens as the chat dataset does.
#include <filesystem>

#include "../../plugins/data/chat/chat_samples.hpp"
#include "fuzz_input.hpp"

using namespace trainrun;

namespace {

const text::Tokenizer* tokenizer() {
  static const std::optional<text::Tokenizer> tok = []() -> std::optional<text::Tokenizer> {
    const std::string dir = std::string(TRAINRUN_FUZZ_FIXTURES) + "/mistral";
    if (!std::filesystem::exists(dir + "/tokenizer.json")) return std::nullopt;
    return text::Tokenizer::from_directory(dir);
  }();
  return tok ? &*tok : nullptr;
}

}  // namespace

// Loading the 1.8 MB fixture takes seconds under ASan: before the first input, outside the
// per-input -timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const text::ChatTemplate chatml(text::builtin_chat_template("chatml"),
                                         {{"bos_token", "<s>"}, {"eos_token", "</s>"}}, "chatml");
  const text::Tokenizer* tok = tokenizer();
  fuzz::MemFile file(data, size);
  fuzz::expect_clean([&] {
    const auto convs = chat::read_conversations({file.path()});
    if (!tok) return;
    size_t rendered = 0;
    for (const auto& c : convs) {
      if (++rendered > 4) break;  // the reader is under test; four renderings cover the rest
      for (auto on : {chat::TrainOn::Assistant, chat::TrainOn::All})
        fuzz::expect_clean([&] {
          const chat::ChatSample s = chat::render_sample(c, chatml, *tok, on);
          if (s.counted.size() != s.ids.size())
            throw std::logic_error(c.where() + ": loss mask and ids differ in length");
        });
    }
  });
  return 0;
}
