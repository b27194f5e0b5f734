// Fuzz target `chat_template`: a chat template's bytes -> text::ChatTemplate (compile) and
// apply() on a short conversation with tools, under a small TemplateLimits budget. A template
// may be refused (ChatTemplateError: a syntax error, an error of its own, a limit); nothing else
// may escape, and a rendering that succeeds stays within the budget it was given. The corpus
// (tests/fuzz/corpus/chat_template/) holds hostile templates that grow strings, lists and dicts
// or loop without output, each of which must end at a limit.
#include <stdexcept>
#include <string>

#include "fuzz_input.hpp"
#include "trainrun/text/chat_template.hpp"

using namespace trainrun;
using json = nlohmann::ordered_json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Small enough that every corpus input ends at a limit in milliseconds under sanitizers.
  text::TemplateLimits limits;
  limits.max_bytes = 1 << 20;
  limits.max_operations = 20000;
  static const json messages = json::parse(R"([
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <s> {{ x }} \u00e9"},
    {"role": "assistant", "content": "Hello", "tool_calls": [{"type": "function",
     "function": {"name": "f", "arguments": {"a": 1}}}]}, {"role": "tool", "content": "42"}])");
  static const json tools = json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  const json special = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  try {
    const text::ChatTemplate t(std::string(reinterpret_cast<const char*>(data), size), special,
                               "fuzz.jinja", limits);
    text::ChatTemplateOptions o;
    o.tools = tools;
    o.add_generation_prompt = true;
    text::RenderCost cost;
    const text::RenderedChat out = t.apply(messages, o, cost);
    if (cost.bytes_built > limits.max_bytes || cost.operations > limits.max_operations ||
        out.text.size() > limits.max_bytes)
      throw std::logic_error(
          "a rendering went past its budget: " + std::to_string(cost.bytes_built) + " bytes, " +
          std::to_string(cost.operations) + " operations");
  } catch (const text::ChatTemplateError&) {
  }
  return 0;
}
