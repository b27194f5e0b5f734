// `trainrun chat-template --tokenizer DIR [--add-generation-prompt] [--continue-final-message]
//  [--template NAME]`: stdin holds {"messages": [...]} plus optional "tools", "documents" and other
// template variables (e.g. "enable_thinking"); stdout gets the rendered text, byte for byte what
// transformers' apply_chat_template(..., tokenize=False) returns.
#include "chat_cli.hpp"

#include <iostream>
#include <iterator>
#include <string>

#include "trainrun/error.hpp"
#include "trainrun/text/chat_template.hpp"
#include "trainrun/text/template_limits.hpp"

namespace trainrun::app {
namespace {

constexpr const char* kUsage =
    "usage: trainrun chat-template --tokenizer DIR [--add-generation-prompt] "
    "[--continue-final-message]\n"
    "                              [--template NAME] [--template-max-bytes N]\n"
    "                              [--template-max-operations N]\n"
    "  Reads {\"messages\": [...], \"tools\": [...], \"documents\": [...], other variables} JSON "
    "from stdin\n"
    "  and prints the chat template's rendering. --template NAME: a named template of the "
    "tokenizer,\n"
    "  a built-in (chatml, llama3, llama2, mistral, alpaca) or a .jinja file.\n";

std::string usage() { return kUsage + text::template_limit_flags_help(); }

}  // namespace

int run_chat_template_command(int argc, char** argv) {
  std::string dir, name;
  text::ChatTemplateOptions options;
  text::TemplateLimits limits;
  bool add_generation_prompt = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << usage();
      return 0;
    }
    if ((a == "--tokenizer" || a == "--template") && i + 1 < argc) {
      (a == "--tokenizer" ? dir : name) = argv[++i];
    } else if (a == "--add-generation-prompt") {
      add_generation_prompt = true;
    } else if (a == "--continue-final-message") {
      options.continue_final_message = true;
    } else {
      try {
        if (i + 1 < argc && text::set_template_limit(a, argv[i + 1], limits)) {
          ++i;
          continue;
        }
      } catch (const std::invalid_argument& e) {
        std::cerr << "trainrun chat-template: error: " << e.what() << "\n";
        return 2;
      }
      std::cerr << "trainrun chat-template: error: unexpected argument '" << a << "'\n" << usage();
      return 2;
    }
  }
  if (dir.empty() && name.empty()) {
    std::cerr << "trainrun chat-template: error: --tokenizer DIR (or --template NAME) is required\n"
              << usage();
    return 2;
  }
  try {
    // Without a tokenizer a built-in template still renders (no special-token variables).
    const text::ChatTemplate tmpl =
        dir.empty() ? text::ChatTemplate(text::builtin_chat_template(name),
                                         nlohmann::ordered_json::object(),
                                         "built-in chat template " + name, limits)
                    : text::load_chat_template(dir, name, limits);
    const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    nlohmann::ordered_json doc;
    try {
      doc = nlohmann::ordered_json::parse(input);
    } catch (const nlohmann::ordered_json::parse_error& e) {
      std::cerr << "trainrun chat-template: error: stdin: invalid JSON: " << trainrun::v1::parse_error_text(e.what()) << "\n";
      return 2;
    }
    if (!doc.is_object() || !doc.contains("messages")) {
      std::cerr << "trainrun chat-template: error: stdin: expected a JSON object with \"messages\"\n";
      return 2;
    }
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (it.key() == "messages") continue;
      if (it.key() == "tools") options.tools = it.value();
      else if (it.key() == "documents") options.documents = it.value();
      else if (it.key() == "add_generation_prompt") add_generation_prompt = add_generation_prompt || it.value() == true;
      else options.variables[it.key()] = it.value();
    }
    options.add_generation_prompt = add_generation_prompt;
    std::cout << tmpl.apply(doc["messages"], options).text << std::flush;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "trainrun chat-template: error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace trainrun::app
