// `trainrun score` (see score_cli.hpp). Each input is tokenized as TRL 1.16's RewardTrainer
// prepares a sequence: plain text is prompt + completion with the EOS token's text appended
// unless it ends with it, encoded with special tokens; a conversation is rendered with the
// model's chat template (no generation prompt) and encoded without. The model pools its score
// head as transformers does (the last token that is not the pad token), one sequence at a time.
#include "score_cli.hpp"
#include "generate_cli.hpp"
#include "command_line.hpp"
#include "jsonl_line.hpp"

#include <ATen/ATen.h>
#include <boost/program_options.hpp>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "trainrun/core/registry.hpp"
#include "trainrun/core/runtime.hpp"
#include "trainrun/objective.hpp"
#include "trainrun/text/chat_template.hpp"
#include "trainrun/text/tokenizer.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace trainrun::app {
namespace {

using v1::ConfigError;

// One input line: what to score ("text"; or "prompt"? + "completion"; or "messages"; or
// "prompt"? + "chosen" + "rejected", a pair scored both ways).
struct Item {
  std::string where;
  ordered_json prompt = nullptr;
  std::vector<std::pair<std::string, ordered_json>> parts;  // (name, completion or text)
};

Item parse_line(const ordered_json& j, const std::string& where) {
  auto bad = [&](const std::string& m) { throw ConfigError(where + ": " + m); };
  if (!j.is_object()) bad("expected a JSON object");
  Item it;
  it.where = where;
  auto field = [&](const char* k) {
    const ordered_json& v = j[k];
    if (!(v.is_string() || (v.is_array() && !v.empty())))
      bad(std::string("\"") + k + "\" must be a string or a non-empty list of messages");
    return v;
  };
  if (j.contains("prompt")) it.prompt = field("prompt");
  if (j.contains("chosen") || j.contains("rejected")) {
    if (!j.contains("chosen") || !j.contains("rejected"))
      bad("a pair needs both \"chosen\" and \"rejected\"");
    it.parts = {{"chosen", field("chosen")}, {"rejected", field("rejected")}};
  } else if (j.contains("completion")) {
    it.parts = {{"score", field("completion")}};
  } else if (j.contains("text")) {
    if (!j["text"].is_string()) bad("\"text\" must be a string");
    it.parts = {{"score", j["text"]}};
  } else if (j.contains("messages")) {
    it.parts = {{"score", field("messages")}};
  } else {
    bad("expected \"text\", \"messages\", \"completion\" (with an optional \"prompt\") or "
        "\"chosen\" and \"rejected\"");
  }
  for (const auto& [name, v] : it.parts)
    if (!it.prompt.is_null() && it.prompt.is_string() != v.is_string())
      bad("\"prompt\" and \"" + (name == "score" ? std::string("completion") : name) +
          "\" must both be text or both be messages");
  return it;
}

std::vector<int32_t> encode(const Item& it, const ordered_json& completion,
                            const text::Tokenizer& tok, std::optional<text::ChatTemplate>& tmpl,
                            const std::string& model_dir) {
  if (completion.is_string()) {
    std::string s = (it.prompt.is_string() ? it.prompt.get<std::string>() : std::string()) +
                    completion.get<std::string>();
    const std::optional<std::string> eos = tok.eos_token();
    if (!eos) throw ConfigError(it.where + ": the tokenizer has no EOS token to end a text with");
    if (s.size() < eos->size() || s.compare(s.size() - eos->size(), eos->size(), *eos) != 0)
      s += *eos;
    return tok.encode(s, /*add_special_tokens=*/true);
  }
  if (!tmpl) tmpl = text::load_chat_template(model_dir);
  ordered_json messages = it.prompt.is_array() ? it.prompt : ordered_json::array();
  for (const auto& m : completion) messages.push_back(m);
  return tok.encode(tmpl->apply(messages, text::ChatTemplateOptions{}).text,
                    /*add_special_tokens=*/false);
}

// The command line of `trainrun score`.
struct ScoreArgs {
  std::string model_dir, adapter, input, model_plugin = "llama";
  std::vector<std::string> texts, plugin_paths;
  int64_t threads = 0;
  bool jsonl = false;
  bool plain_base = false;
};

// The items of --text (each a text) and of the lines of --input.
std::vector<Item> read_items(const ScoreArgs& a) {
  std::vector<Item> items;
  for (size_t i = 0; i < a.texts.size(); ++i)
    items.push_back(
        parse_line(ordered_json{{"text", a.texts[i]}}, "--text " + std::to_string(i + 1)));
  if (a.input.empty()) return items;
  std::ifstream f(a.input);
  if (!f) throw ConfigError("--input " + a.input + ": cannot be read");
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    ordered_json j;
    if (!parse_jsonl_line(line, a.input, n, j)) continue;
    items.push_back(parse_line(j, a.input + ":" + std::to_string(n)));
  }
  if (items.empty()) throw ConfigError("--input " + a.input + ": no lines");
  return items;
}

// A SEQ_CLS adapter on a causal LM (PEFT: AutoModelForSequenceClassification on the base, then
// the adapter, whose modules_to_save hold the trained score head).
std::map<std::string, v1::OptionValue> adapter_overrides(const std::string& adapter) {
  std::map<std::string, v1::OptionValue> overrides;
  if (adapter.empty()) return overrides;
  const fs::path ac = fs::path(adapter) / "adapter_config.json";
  std::ifstream f(ac);
  if (!f) throw ConfigError("--adapter " + adapter + ": no adapter_config.json");
  try {
    const ordered_json c = ordered_json::parse(f);
    if (c.value("task_type", ordered_json(nullptr)) == "SEQ_CLS")
      overrides["architecture"] = std::string("sequence_classification");
  } catch (const ordered_json::exception& e) {
    throw ConfigError(ac.string() + ": not valid JSON: " + e.what());
  }
  return overrides;
}

// The model's scores of one sequence.
std::vector<double> score_ids(v1::SequenceClassifier& sc, const std::vector<int32_t>& ids32,
                              const std::string& label) {
  v1::Batch b;
  b.input = at::tensor(std::vector<int64_t>(ids32.begin(), ids32.end()), at::kLong)
                .view({1, static_cast<int64_t>(ids32.size())});
  at::Tensor s;
  try {
    s = sc.scores(b);
  } catch (const std::exception& e) {
    throw std::runtime_error(label + ": scoring failed: " + e.what());
  }
  const at::Tensor row = s[0].to(at::kDouble).contiguous();
  return std::vector<double>(row.data_ptr<double>(), row.data_ptr<double>() + row.numel());
}

int score(const ScoreArgs& a) {
  check_model_dir(a.model_dir);
  if (a.threads > 0) at::set_num_threads(static_cast<int>(a.threads));
  const std::vector<Item> items = read_items(a);

  const text::Tokenizer tok = text::Tokenizer::from_directory(a.model_dir);
  std::optional<text::ChatTemplate> tmpl;
  LoadedModel loaded = load_hf_model("trainrun score", a.model_dir, a.model_plugin, a.plugin_paths,
                                     "reward", adapter_overrides(a.adapter));
  const std::string& label = loaded.label;
  auto* sc = dynamic_cast<v1::SequenceClassifier*>(loaded.model.get());
  if (sc == nullptr || sc->num_labels() < 1)
    throw ConfigError(
        a.adapter.empty()
            ? "--model " + a.model_dir + ": " + label +
                  " has no sequence-classification head (config.json's architectures "
                  "must name a *ForSequenceClassification model, as a full reward run's "
                  "<run_dir>/hf does; for a LoRA reward run give its base model and "
                  "--adapter <run_dir>/adapter)"
            : "--adapter " + a.adapter +
                  ": not a reward model's adapter (adapter_config.json's task_type is "
                  "not \"SEQ_CLS\"), and --model " +
                  a.model_dir + " has no score head");
  std::string base_note;
  const int merged =
      prepare_for_inference(loaded, a.adapter, {a.plain_base, a.plugin_paths, "score"}, &base_note);
  std::cerr << "score: " << describe_loaded(loaded, merged, a.adapter) << std::endl;
  if (!base_note.empty()) std::cerr << "score: " << base_note << std::endl;

  at::NoGradGuard no_grad;
  int64_t pairs = 0, right = 0;
  for (const Item& it : items) {
    ordered_json out = ordered_json::object();
    out["where"] = it.where;
    std::vector<double> got;
    for (const auto& [name, completion] : it.parts) {
      const std::vector<int32_t> ids32 = encode(it, completion, tok, tmpl, a.model_dir);
      if (ids32.empty()) throw ConfigError(it.where + ": encodes to no tokens");
      const std::vector<double> v = score_ids(*sc, ids32, label);
      out[name] = v.size() == 1 ? ordered_json(v[0]) : ordered_json(v);
      out[name + "_tokens"] = ids32.size();
      got.push_back(v[0]);
    }
    if (it.parts.size() == 2) {
      ++pairs;
      right += got[0] > got[1];
      out["margin"] = got[0] - got[1];
    }
    if (a.jsonl) {
      std::cout << out.dump(-1, ' ', false, ordered_json::error_handler_t::replace) << std::endl;
    } else {
      std::cout << std::setprecision(7);
      if (it.parts.size() == 2)
        std::cout << got[0] << " " << got[1] << "  margin " << got[0] - got[1]
                  << (got[0] > got[1] ? "  chosen wins" : "  rejected wins") << "\n";
      else
        std::cout << got[0] << "\n";
    }
  }
  std::cout.flush();
  if (pairs > 0)
    std::cerr << "score: " << pairs << " pairs, accuracy " << std::setprecision(4)
              << static_cast<double>(right) / pairs << " (chosen scored above rejected)"
              << std::endl;
  return 0;
}

}  // namespace

int run_score_command(int argc, char** argv) {
  ScoreArgs a;
  po::options_description opts("trainrun score options");
  opts.add_options()("help,h", "show this help")(
      "model", po::value(&a.model_dir),
      "Hugging Face *ForSequenceClassification directory (config.json, safetensors, tokenizer "
      "files), e.g. <run_dir>/hf of a reward run; or, with --adapter, the causal LM a LoRA "
      "reward run started from")(
      "adapter", po::value(&a.adapter),
      "PEFT LoRA adapter directory of a reward model (task SEQ_CLS; its score head is saved "
      "whole), merged into the weights in memory (a QLoRA adapter into its base quantized as "
      "in training)")("plain-base", po::bool_switch(&a.plain_base),
                      "QLoRA adapters: merge into the full-precision base instead (a different "
                      "model from the one trained)")("text", po::value(&a.texts)->composing(),
                                                     "a text to score (repeatable)")(
      "input", po::value(&a.input),
      "JSONL file: per line {\"text\"}, {\"messages\"}, {\"prompt\"?, \"completion\"} or "
      "{\"prompt\"?, \"chosen\", \"rejected\"} (strings or lists of messages)")(
      "jsonl", "print one JSON object per input line instead of plain text")(
      "threads", po::value(&a.threads), "LibTorch intra-op threads (default: LibTorch's choice)")(
      "model-plugin", po::value(&a.model_plugin),
      "model component to load the directory with (default llama)")(
      "plugin-path", po::value(&a.plugin_paths)->composing(),
      "plugin directory or file, searched first (repeatable)");
  po::variables_map vm;
  if (const auto done =
          parse_command_line(argc, argv, "score",
                             "usage: trainrun score --model DIR [--adapter DIR] --text TEXT "
                             "[--text TEXT]... [--jsonl]\n"
                             "       trainrun score --model DIR --input FILE.jsonl [--jsonl]",
                             opts, vm))
    return *done;
  if (a.model_dir.empty()) return command_error("score", "--model DIR is required");
  if (a.texts.empty() == a.input.empty())
    return command_error("score", "give --text TEXT or --input FILE.jsonl (one of them)");
  a.jsonl = vm.count("jsonl") > 0;
  return run_model_command("score", [&] { return score(a); });
}

}  // namespace trainrun::app
