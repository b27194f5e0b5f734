// Renders a batch of chat-template jobs for tests/e2e/chat_template_reference.py, which compares
// the results with transformers' apply_chat_template. Input (argv[1]): a JSON array of
//   {"tokenizer": DIR or "", "template": NAME or "", "source": JINJA (instead of DIR/NAME),
//    "special_tokens": {...} (with "source"), "messages": [...], "add_generation_prompt": bool,
//    "continue_final_message": bool, "tools": ..., "documents": ..., "variables": {...}}
// Output (stdout): a JSON array of {"text": ..., "source": ..., "spans": [[b, e], ...],
// "bytes_built": N, "operations": N} or
// {"error": ..., "message": ..., "raised": bool, "line": N}.
#include <fstream>
#include <iostream>
#include <sstream>

#include "trainrun/text/chat_template.hpp"

using json = nlohmann::ordered_json;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: chat_template_render JOBS.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream ss;
  ss << in.rdbuf();
  const json jobs = json::parse(ss.str());
  json results = json::array();
  for (const auto& job : jobs) {
    json r = json::object();
    try {
      const std::string dir = job.value("tokenizer", "");
      const std::string name = job.value("template", "");
      const trainrun::text::ChatTemplate t =
          job.contains("source")
              ? trainrun::text::ChatTemplate(job["source"].get<std::string>(), job.value("special_tokens", json::object()))
          : dir.empty() ? trainrun::text::ChatTemplate(trainrun::text::builtin_chat_template(name))
                        : trainrun::text::load_chat_template(dir, name);
      trainrun::text::ChatTemplateOptions o;
      o.add_generation_prompt = job.value("add_generation_prompt", false);
      o.continue_final_message = job.value("continue_final_message", false);
      if (job.contains("tools")) o.tools = job["tools"];
      if (job.contains("documents")) o.documents = job["documents"];
      if (job.contains("variables")) o.variables = job["variables"];
      r["source"] = t.source();
      r["special_tokens"] = t.special_tokens();
      trainrun::text::RenderCost cost;
      const auto out = t.apply(job["messages"], o, cost);
      r["text"] = out.text;
      json spans = json::array();
      for (const auto& s : out.generation_spans) spans.push_back({s.first, s.second});
      r["spans"] = spans;
      r["bytes_built"] = cost.bytes_built;  // the cost against TemplateLimits (the limits' test)
      r["operations"] = cost.operations;
    } catch (const trainrun::text::ChatTemplateError& e) {
      r["error"] = e.what();
      r["message"] = e.message();
      r["raised"] = e.raised();
      r["line"] = e.line();
    } catch (const std::exception& e) {
      r["error"] = e.what();
      r["raised"] = false;
    }
    results.push_back(r);
  }
  std::cout << results.dump(1, ' ', false, json::error_handler_t::replace) << "\n";
  return 0;
}
