// Fuzz target `llama_config`: config.json text -> the llama plugin's LlamaConfig::from_json
// (model_type, sizes, rope scaling, dtype keys of transformers 4.x and 5.x), then to_json on top
// of the same text, as save_hf writes it back.
#include "../../plugins/models/llama/llama.hpp"
#include "fuzz_input.hpp"

using namespace trainrun;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean([&] {
    const llama::LlamaConfig c = llama::LlamaConfig::from_json(text, "config.json");
    const std::string written = c.to_json(text, c.dtype);
    // What was written must read back as the same architecture.
    const llama::LlamaConfig again = llama::LlamaConfig::from_json(written, "written config.json");
    if (again.hidden_size != c.hidden_size || again.num_hidden_layers != c.num_hidden_layers ||
        again.head_dim != c.head_dim || again.model_type != c.model_type)
      throw std::logic_error("config.json does not survive to_json: " + written);
  });
  return 0;
}
