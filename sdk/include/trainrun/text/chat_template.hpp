#pragma once
// Chat templates of Hugging Face tokenizers, rendered natively (no Python): the subset of Jinja2
// that real templates use, with the semantics of transformers' apply_chat_template (an immutable
// sandboxed jinja2 Environment with trim_blocks and lstrip_blocks, the loopcontrols extension, the
// {% generation %} tag, the globals raise_exception/strftime_now/namespace/dict and transformers'
// tojson filter). Reference: transformers 5.24 utils/chat_template_utils.py and
// tokenization_utils_base.py (apply_chat_template, get_chat_template), jinja2 3.1.
// Anything outside the subset is refused when the template is compiled or when the construct is
// reached, naming the construct and the template line.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace trainrun::text {

namespace jinja {
struct Template;
}

/// A chat template that cannot be compiled or rendered, or that called raise_exception().
/// what(): "<origin>, line N: <message>"; for raise_exception: "<origin> raised: <message> (line N)".
class ChatTemplateError : public std::runtime_error {
 public:
  ChatTemplateError(const std::string& origin, const std::string& message, int line, bool raised);
  /// 1-based line of the template where it failed; 0 when not tied to a line.
  int line() const { return line_; }
  /// True when the template itself called raise_exception(message).
  bool raised() const { return raised_; }
  /// The message without the origin and line (for raise_exception: exactly the template's text).
  const std::string& message() const { return message_; }

 private:
  std::string message_;
  int line_;
  bool raised_;
};

/// Inputs of one apply_chat_template call besides the messages.
struct ChatTemplateOptions {
  bool add_generation_prompt = false;
  /// Leave the final message open (transformers' continue_final_message, on the "content" field);
  /// incompatible with add_generation_prompt.
  bool continue_final_message = false;
  /// JSON-schema tools (array of objects) or null; the template sees `tools` (None when null).
  nlohmann::ordered_json tools = nullptr;
  /// RAG documents (array of objects) or null; the template sees `documents`.
  nlohmann::ordered_json documents = nullptr;
  /// Further template variables (transformers' **kwargs, e.g. {"enable_thinking": false});
  /// they override the special tokens of the same name.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};

struct RenderedChat {
  std::string text;
  /// Byte ranges [begin, end) of `text` produced inside {% generation %} blocks (assistant text
  /// for templates that mark it, as transformers' return_assistant_tokens_mask uses them).
  std::vector<std::pair<std::size_t, std::size_t>> generation_spans;
};

/// What one rendering cost, in the units of TemplateLimits (render/apply's optional output;
/// a separate struct so that RenderedChat keeps the layout plugins were built against).
struct RenderCost {
  std::uint64_t bytes_built = 0;
  std::uint64_t operations = 0;
};

/// The budget of one rendering of a chat template. A model directory is untrusted input, and a
/// template that grows a string, list or dict in a loop, or loops without producing anything,
/// would otherwise take the machine (every rank renders at start-up). Exceeding a limit throws
/// ChatTemplateError naming the template, its line, the limit and its option. The defaults are
/// over a hundred times what the largest real templates need for ordinary conversations
/// (docs/troubleshooting.md gives the figures); raise them for a trusted template rendering
/// conversations of several MB.
struct TemplateLimits {
  /// Bytes of every string, list and dict one rendering builds, and of its output, in all (a
  /// list or dict counts its slots and string items). Job option / CLI flag: template_max_bytes.
  std::uint64_t max_bytes = std::uint64_t{32} << 20;
  /// Loop iterations and calls (filters, tests, methods, functions, macros) of one rendering, a
  /// call weighted by what it scans (one per item of a list or dict operand, per KiB of a
  /// string). Job option / CLI flag: template_max_operations.
  std::uint64_t max_operations = 500000;
};

/// A compiled chat template plus the special-token variables it is rendered with.
/// Immutable after construction; render/apply may be called from several threads at once.
class ChatTemplate {
 public:
  /// Compiles `source`. `special_tokens` (a JSON object of strings such as {"bos_token": "<s>"})
  /// become template variables; `origin` names the template in errors (a file, a built-in).
  /// Throws ChatTemplateError for syntax outside the supported subset.
  explicit ChatTemplate(std::string source,
                        nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object(),
                        std::string origin = "chat template");
  /// As above, every rendering bounded by `limits` (the three-argument form uses the defaults).
  /// Both forms exist so that plugins built against SDK 1.9 keep linking.
  ChatTemplate(std::string source, nlohmann::ordered_json special_tokens, std::string origin,
               TemplateLimits limits);

  /// apply_chat_template(messages, tokenize=False): drops message keys whose value is null,
  /// aliases reasoning_content/thinking/reasoning as transformers does, and renders with the
  /// special tokens, `messages`, `tools`, `documents`, `add_generation_prompt` and
  /// options.variables. `messages` is a non-empty JSON array of message objects.
  /// Throws ChatTemplateError (bad messages, template errors, raise_exception).
  RenderedChat apply(const nlohmann::ordered_json& messages, const ChatTemplateOptions& options = {}) const;
  /// As above, and stores what the rendering cost in `cost`.
  RenderedChat apply(const nlohmann::ordered_json& messages, const ChatTemplateOptions& options,
                     RenderCost& cost) const;

  /// Renders with exactly `variables` (a JSON object) and no preprocessing.
  RenderedChat render(const nlohmann::ordered_json& variables) const;
  /// As above, and stores what the rendering cost in `cost`.
  RenderedChat render(const nlohmann::ordered_json& variables, RenderCost& cost) const;

  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  /// The budget every rendering is held to (kept with the compiled template, so the class keeps
  /// the layout plugins were built against).
  TemplateLimits limits() const;

 private:
  std::string source_;
  nlohmann::ordered_json special_tokens_;
  std::string origin_;
  std::shared_ptr<const jinja::Template> compiled_;
};

/// Names of the built-in templates for base models without one: chatml, llama3, llama2,
/// mistral, alpaca.
std::vector<std::string> builtin_chat_template_names();

/// Jinja source of a built-in template; throws std::invalid_argument naming the known ones.
const std::string& builtin_chat_template(const std::string& name);

/// The special tokens transformers passes to chat templates for a tokenizer directory:
/// bos/eos/unk/sep/pad/cls/mask_token (strings or AddedToken objects' "content", nulls left out)
/// from tokenizer_config.json, special_tokens_map.json where the config has no
/// added_tokens_decoder, and named extra_special_tokens. Throws std::runtime_error for bad JSON.
nlohmann::ordered_json load_special_tokens(const std::filesystem::path& tokenizer_dir);

/// The chat template of a tokenizer directory, as transformers picks it: chat_template.jinja
/// (and additional_chat_templates/*.jinja) before tokenizer_config.json's "chat_template"
/// (a string, or a list of {"name", "template"}). `name` (optional) selects a named template of
/// the tokenizer, else a built-in of that name, else a .jinja file at that path. Without a name,
/// the tokenizer's single or "default" template. Throws std::runtime_error naming the directory
/// when there is none (suggesting the built-ins), ChatTemplateError when it does not compile.
ChatTemplate load_chat_template(const std::filesystem::path& tokenizer_dir,
                                const std::string& name = "");
/// As above, every rendering of the template bounded by `limits` (a separate overload so that
/// plugins built against SDK 1.9 keep linking).
ChatTemplate load_chat_template(const std::filesystem::path& tokenizer_dir, const std::string& name,
                                const TemplateLimits& limits);

}  // namespace trainrun::text
