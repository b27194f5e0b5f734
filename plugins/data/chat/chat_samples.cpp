// Conversation files -> rendered, tokenized samples with loss masks (see chat_samples.hpp).
#include "chat_samples.hpp"

#include <glob.h>
#include <sys/stat.h>

#include <trainrun/error.hpp>
#include <trainrun/json_depth.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

namespace trainrun::chat {

using json = nlohmann::ordered_json;
using v1::ConfigError;

std::string Conversation::where() const {
  return jsonl ? file + ":" + std::to_string(line) : file + ": record " + std::to_string(line);
}

int64_t ChatSample::num_counted() const {
  return std::count(counted.begin(), counted.end(), uint8_t{1});
}

namespace {

// Appended to an assistant message's content to find where the template puts its end: a
// private-use character (U+E000) no template strips or tests for.
constexpr const char* kMarker = "\xEE\x80\x80";

const std::set<std::string> kRoles = {"system", "user", "assistant", "tool"};
// ShareGPT's "from" values and the roles they stand for.
const std::map<std::string, std::string> kShareGptRoles = {
    {"human", "user"}, {"user", "user"},     {"gpt", "assistant"},
    {"assistant", "assistant"}, {"system", "system"}, {"tool", "tool"}};

[[noreturn]] void bad(const std::string& where, const std::string& msg) {
  throw ConfigError(where + ": " + msg);
}

const json& need_string(const json& obj, const char* key, const std::string& where, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end()) bad(where, "no \"" + std::string(key) + "\" in " + path);
  if (!it->is_string()) bad(where, path + "." + key + " must be a string, got " + it->dump());
  return *it;
}

json from_messages(const json& list, const std::string& where) {
  if (!list.is_array()) bad(where, "\"messages\" must be an array of {\"role\", \"content\"} objects");
  json out = json::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = "messages[" + std::to_string(i) + "]";
    const json& m = list[i];
    if (!m.is_object()) bad(where, path + " must be an object with \"role\" and \"content\"");
    const std::string role = need_string(m, "role", where, path).get<std::string>();
    if (!kRoles.count(role))
      bad(where, path + ".role: unknown role \"" + role + "\" (expected system, user, assistant or tool)");
    auto c = m.find("content");
    if (c == m.end()) bad(where, "no \"content\" in " + path);
    if (!c->is_string() && !(c->is_null() && role == "assistant"))
      bad(where, path + ".content must be a string, got " + c->dump());
    out.push_back(m);
  }
  return out;
}

json from_sharegpt(const json& list, const std::string& where) {
  if (!list.is_array()) bad(where, "\"conversations\" must be an array of {\"from\", \"value\"} objects");
  json out = json::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = "conversations[" + std::to_string(i) + "]";
    const json& m = list[i];
    if (!m.is_object()) bad(where, path + " must be an object with \"from\" and \"value\"");
    const std::string from = need_string(m, "from", where, path).get<std::string>();
    auto r = kShareGptRoles.find(from);
    if (r == kShareGptRoles.end())
      bad(where, path + ".from: unknown role \"" + from + "\" (expected human, user, gpt, assistant, system or tool)");
    out.push_back({{"role", r->second}, {"content", need_string(m, "value", where, path)}});
  }
  return out;
}

json from_alpaca(const json& rec, const std::string& where) {
  json out = json::array();
  if (auto s = rec.find("system"); s != rec.end() && !s->is_null()) {
    if (!s->is_string()) bad(where, "\"system\" must be a string, got " + s->dump());
    if (!s->get<std::string>().empty()) out.push_back({{"role", "system"}, {"content", *s}});
  }
  std::string user = need_string(rec, "instruction", where, "the record").get<std::string>();
  if (auto in = rec.find("input"); in != rec.end() && !in->is_null()) {
    if (!in->is_string()) bad(where, "\"input\" must be a string, got " + in->dump());
    if (!in->get<std::string>().empty()) user += "\n\n" + in->get<std::string>();
  }
  out.push_back({{"role", "user"}, {"content", user}});
  out.push_back({{"role", "assistant"}, {"content", need_string(rec, "output", where, "the record")}});
  return out;
}

json to_messages(const json& rec, const std::string& where) {
  if (!rec.is_object()) bad(where, "expected a JSON object, got " + std::string(rec.type_name()));
  if (auto m = rec.find("messages"); m != rec.end()) return from_messages(*m, where);
  if (auto c = rec.find("conversations"); c != rec.end()) return from_sharegpt(*c, where);
  if (rec.contains("instruction")) return from_alpaca(rec, where);
  bad(where, "no \"messages\" (OpenAI), \"conversations\" (ShareGPT) or \"instruction\" (Alpaca) key");
}

}  // namespace

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

std::vector<std::string> expand_paths(const std::vector<std::string>& patterns,
                                      const std::string& context, const std::string& key) {
  std::vector<std::string> files;
  for (const auto& p : patterns) {
    glob_t g{};
    const int rc = glob(p.c_str(), GLOB_BRACE | GLOB_TILDE | GLOB_ERR, nullptr, &g);
    std::vector<std::string> found(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
    globfree(&g);
    if (rc == GLOB_NOMATCH)
      throw ConfigError(context + ": '" + p + "' in " + key + " matches no file");
    if (rc != 0) throw ConfigError(context + ": cannot expand '" + p + "' in " + key);
    for (const auto& f : found) {
      struct stat st {};
      if (stat(f.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        throw ConfigError(context + ": '" + f + "' in " + key + " is a folder, not a file");
      files.push_back(f);
    }
  }
  return files;
}

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(perm[i], perm[rng() % static_cast<uint64_t>(i + 1)]);
  return perm;
}

std::array<std::vector<int64_t>, 2> hold_out(const std::vector<int64_t>& items, double fraction,
                                             uint64_t seed, const std::string& context,
                                             const std::string& unit) {
  const int64_t n = static_cast<int64_t>(items.size());
  const std::vector<int64_t> perm = seeded_permutation(n, seed);
  const int64_t n_eval = static_cast<int64_t>(fraction * static_cast<double>(n));
  TR_CHECK_TYPED(ConfigError, n - n_eval > 0, context, ": validation_fraction leaves no training ",
                 unit);
  std::array<std::vector<int64_t>, 2> parts;
  for (int64_t i = 0; i < n; ++i) parts[i < n_eval ? 1 : 0].push_back(items[perm[i]]);
  std::sort(parts[0].begin(), parts[0].end());
  std::sort(parts[1].begin(), parts[1].end());
  return parts;
}

std::string read_file(const std::string& path, const std::string& who) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(who + ": cannot open '" + path + "': " + std::strerror(errno));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void for_each_jsonl_record(const std::string& file, const std::string& text,
                           const std::function<void(int64_t, const json&)>& f) {
  std::istringstream lines(text);
  std::string line;
  for (int64_t n = 1; std::getline(lines, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file + ":" + std::to_string(n);
    if (v1::json_too_deep(line))
      bad(where, "JSON nested deeper than " + std::to_string(v1::kMaxJsonDepth) + " levels");
    json rec;
    try {
      rec = json::parse(line);
    } catch (const json::exception& e) {
      bad(where, "malformed JSON line: " + v1::parse_error_text(e.what()));
    }
    f(n, rec);
  }
}

std::vector<Conversation> read_conversations(const std::vector<std::string>& files) {
  std::vector<Conversation> out;
  for (const auto& file : files) {
    const std::string text = read_file(file, "chat");
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text[first] == '[') {
      if (v1::json_too_deep(text))
        throw ConfigError(file + ": JSON nested deeper than " + std::to_string(v1::kMaxJsonDepth) + " levels");
      json doc;
      try {
        doc = json::parse(text);
      } catch (const json::exception& e) {
        throw ConfigError(file + ": malformed JSON: " + v1::parse_error_text(e.what()));
      }
      for (size_t i = 0; i < doc.size(); ++i) {
        Conversation c;
        c.file = file;
        c.jsonl = false;
        c.line = static_cast<int64_t>(i) + 1;
        c.messages = to_messages(doc[i], c.where());
        out.push_back(std::move(c));
      }
      continue;
    }
    for_each_jsonl_record(file, text, [&](int64_t line, const json& rec) {
      Conversation c;
      c.file = file;
      c.line = line;
      c.messages = to_messages(rec, c.where());
      out.push_back(std::move(c));
    });
  }
  return out;
}

ChatSample render_sample(const Conversation& conv, const text::ChatTemplate& tmpl,
                         const text::Tokenizer& tok, TrainOn train_on) {
  const std::string& where = conv.where();
  auto render = [&](size_t n, bool generation_prompt) {
    json part = json::array();
    for (size_t i = 0; i < n; ++i) part.push_back(conv.messages[i]);
    text::ChatTemplateOptions o;
    o.add_generation_prompt = generation_prompt;
    try {
      return tmpl.apply(part, o);
    } catch (const text::ChatTemplateError& e) {
      bad(where, std::string("chat template: ") + e.what());
    }
  };
  const size_t n_messages = conv.messages.size();
  if (n_messages == 0) bad(where, "the conversation has no messages");
  const text::RenderedChat full = render(n_messages, false);
  ChatSample s;
  s.ids = tok.encode(full.text, /*add_special_tokens=*/false);
  s.counted.assign(s.ids.size(), 0);
  if (const auto bos = tok.bos_token_id(); bos && s.ids.size() >= 2 && s.ids[0] == *bos && s.ids[1] == *bos)
    bad(where, "the chat template (" + tmpl.origin() + ") renders the BOS token twice at the start");
  if (train_on == TrainOn::All) {
    for (size_t j = 1; j < s.ids.size(); ++j) s.counted[j] = 1;
    return s;
  }
  std::vector<size_t> assistant;
  for (size_t i = 0; i < n_messages; ++i)
    if (conv.messages[i]["role"] == "assistant") assistant.push_back(i);
  if (assistant.empty())
    bad(where, std::string("no assistant turn to train on (train_on = \"") +
                   (train_on == TrainOn::Last ? "last" : "assistant") + "\"; train_on = \"all\" trains on the whole text)");

  // Character position -> token index: the ids of text[:c] agree with the full ids up to there
  // (a token straddling c is not counted as before it).
  auto token_at = [&](size_t c) -> size_t {
    if (c == 0) return 0;
    if (c >= full.text.size()) return s.ids.size();
    return common_prefix(tok.encode(std::string_view(full.text).substr(0, c), false), s.ids);
  };
  auto mark = [&](size_t from, size_t to) {
    for (size_t j = std::max<size_t>(from, 1); j < to && j < s.ids.size(); ++j) s.counted[j] = 1;
  };
  if (!full.generation_spans.empty()) {
    // The template marks the assistant text itself ({% generation %}), as transformers'
    // return_assistant_tokens_mask uses it.
    auto spans = full.generation_spans;
    if (train_on == TrainOn::Last) spans = {spans.back()};
    for (const auto& [a, b] : spans) mark(token_at(a), token_at(b));
    return s;
  }
  if (train_on == TrainOn::Last) assistant = {assistant.back()};
  for (size_t k = 0; k < assistant.size(); ++k) {
    const size_t i = assistant[k];
    const std::string turn = "messages[" + std::to_string(i) + "] (assistant)";
    // Start: the rendering of the messages before it with the generation prompt must be a prefix
    // of the whole; the turn starts where that prompt ends.
    const std::string prompt = i == 0 ? std::string() : render(i, true).text;
    if (full.text.compare(0, prompt.size(), prompt) != 0)
      bad(where, "the chat template (" + tmpl.origin() + ") renders the prompt before " + turn +
                     " differently when the turn follows, so the turn's start cannot be found; use a template "
                     "with {% generation %} blocks or train_on = \"all\"");
    // End of the content: rendered once more with a marker character after this message's
    // content (before its trailing whitespace, which templates often trim); the text must equal
    // the plain rendering with the marker taken out.
    json marked = conv.messages;
    const std::string content = marked[i]["content"].is_string() ? marked[i]["content"].get<std::string>() : "";
    const size_t keep = content.find_last_not_of(" \t\n\r\f\v") + 1;  // npos + 1 == 0
    marked[i]["content"] = content.substr(0, keep) + kMarker + content.substr(keep);
    text::ChatTemplateOptions o;
    std::string with_marker;
    try {
      with_marker = tmpl.apply(marked, o).text;
    } catch (const text::ChatTemplateError& e) {
      bad(where, std::string("chat template: ") + e.what());
    }
    const size_t at = with_marker.find(kMarker);
    if (at == std::string::npos || with_marker.compare(0, at, full.text, 0, at) != 0 ||
        with_marker.compare(at + std::strlen(kMarker), std::string::npos, full.text, at, std::string::npos) != 0 ||
        at < prompt.size())
      bad(where, "the chat template (" + tmpl.origin() + ") does not render the content of " + turn +
                     " verbatim at its end, so the end of the turn cannot be found; use a template with "
                     "{% generation %} blocks or train_on = \"all\"");
    // The turn ends with the first special token after the content (end-of-turn or EOS: never
    // masked), looked for up to the next assistant turn's start.
    const size_t from = token_at(prompt.size()), content_end = token_at(at);
    const size_t limit = k + 1 < assistant.size() ? token_at(render(assistant[k + 1], true).text.size()) : s.ids.size();
    size_t end = content_end;
    for (size_t j = content_end; j < limit; ++j)
      if (tok.is_special(s.ids[j])) {
        end = j + 1;
        break;
      }
    mark(from, end);
  }
  return s;
}

}  // namespace trainrun::chat
