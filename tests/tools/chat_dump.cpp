// chat_dump: what the `chat` dataset makes of conversation files, one JSON line per conversation,
// for comparison with transformers (tests/e2e/chat_reference.py). No LibTorch.
//   chat_dump --tokenizer DIR [--template NAME] [--train-on assistant|last|all] FILE...
// First line: {"template": SOURCE, "origin": ORIGIN}; then per conversation
// {"where": "FILE:LINE", "ids": [...], "counted": [0/1 per token]} or {"where", "error": MESSAGE}.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/chat/chat_samples.hpp"

using namespace trainrun;

int main(int argc, char** argv) {
  std::string dir, name, train_on = "assistant";
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) dir = argv[++i];
    else if (a == "--template" && i + 1 < argc) name = argv[++i];
    else if (a == "--train-on" && i + 1 < argc) train_on = argv[++i];
    else files.push_back(a);
  }
  if (dir.empty() || files.empty()) {
    std::cerr << "usage: chat_dump --tokenizer DIR [--template NAME] [--train-on MODE] FILE...\n";
    return 2;
  }
  try {
    const text::Tokenizer tok = text::Tokenizer::from_directory(dir);
    const text::ChatTemplate tmpl = text::load_chat_template(dir, name);
    const chat::TrainOn mode = train_on == "all" ? chat::TrainOn::All
                               : train_on == "last" ? chat::TrainOn::Last : chat::TrainOn::Assistant;
    std::cout << nlohmann::json{{"template", tmpl.source()}, {"origin", tmpl.origin()}}.dump() << "\n";
    for (const auto& c : chat::read_conversations(files)) {
      nlohmann::json out = {{"where", c.where()}};
      try {
        const chat::ChatSample s = chat::render_sample(c, tmpl, tok, mode);
        out["ids"] = s.ids;
        out["counted"] = s.counted;
      } catch (const std::exception& e) {
        out["error"] = e.what();
      }
      std::cout << out.dump() << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "chat_dump: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
