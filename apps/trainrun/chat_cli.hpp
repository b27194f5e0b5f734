#pragma once
// `trainrun chat-template`: renders a tokenizer's chat template (trainrun/text/chat_template.hpp).

namespace trainrun::app {
/// Runs `trainrun chat-template --tokenizer DIR [--add-generation-prompt] [--template NAME]`
/// (argv as main received it): reads {"messages": [...]} JSON from stdin, prints the rendered text.
/// Returns the exit code: 0 ok, 2 bad arguments, input or template (including raise_exception).
int run_chat_template_command(int argc, char** argv);
}  // namespace trainrun::app
