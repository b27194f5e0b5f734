// Preference rows -> tokenized pairs -> next-token rows (see preference_samples.hpp).
#include "preference_samples.hpp"

#include <trainrun/error.hpp>

#include <algorithm>
#include <functional>
#include <set>
#include <stdexcept>

namespace trainrun::preference {

using json = nlohmann::ordered_json;
using v1::ConfigError;

std::string Row::where() const { return file + ":" + std::to_string(line); }

namespace {

// The roles the chat dataset accepts too (plugins/data/chat/chat_samples.cpp).
const std::set<std::string> kRoles = {"system", "user", "assistant", "tool"};

[[noreturn]] void bad(const std::string& where, const std::string& msg) {
  throw ConfigError(where + ": " + msg);
}

const char* kind_of(const json& v) {
  return v.is_string() ? "a string" : v.is_array() ? "a list of messages" : v.type_name();
}

// UTF-8 continuation byte (10xxxxxx).
bool continuation(const std::string& s, size_t i) {
  return i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80;
}

// TRL's extract_prompt on strings, in code points as Python indexes them: the first differing
// character ends the prompt, and a space just before it goes to the completions; when one string
// is a prefix of the other the prompt stops before the shorter one's last character.
size_t text_prompt_end(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  if (i == n) {  // no difference within the shorter: its last character starts the completions
    if (n == 0) return 0;
    size_t last = n - 1;
    while (last > 0 && continuation(a, last)) --last;
    return last;
  }
  while (i > 0 && (continuation(a, i) || continuation(b, i))) --i;  // start of the character
  if (i > 0 && a[i - 1] == ' ') --i;
  return i;
}

// The same on message lists: messages compare as Python dicts do (keys in any order).
size_t messages_prompt_end(const json& a, const json& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (nlohmann::json::parse(a[i].dump()) != nlohmann::json::parse(b[i].dump())) return i;
  return n == 0 ? 0 : n - 1;
}

Row parse_row(const json& rec, Row r) {
  const std::string where = r.where();
  if (!rec.is_object()) bad(where, "expected a JSON object, got " + std::string(rec.type_name()));
  auto field = [&](const char* key) -> const json& {
    auto it = rec.find(key);
    if (it == rec.end()) bad(where, std::string("no \"") + key + "\" field");
    if (!it->is_string() && !it->is_array())
      bad(where, std::string(key) +
                     " must be a string or a list of {\"role\", \"content\"} messages, got " +
                     excerpt(*it));
    return *it;
  };
  const json& chosen = field("chosen");
  const json& rejected = field("rejected");
  r.conversational = chosen.is_array();
  if (rejected.is_array() != r.conversational)
    bad(where, std::string("rejected is ") + kind_of(rejected) + " but chosen is " +
                   kind_of(chosen) + " (both strings, or both lists of messages)");
  r.implicit_prompt = !rec.contains("prompt");
  if (auto m = rec.find("margin"); m != rec.end()) {
    if (!m->is_number()) bad(where, "margin must be a number, got " + excerpt(*m));
    r.margin = m->get<double>();
  }
  if (!r.implicit_prompt) {
    const json& prompt = field("prompt");
    if (prompt.is_array() != r.conversational)
      bad(where, std::string("prompt is ") + kind_of(prompt) + " but chosen and rejected are " +
                     (r.conversational ? "lists of messages" : "strings") +
                     " (all three of one kind)");
    if (r.conversational) check_messages(prompt, "prompt", where);
    r.prompt = prompt;
  }
  if (r.conversational) {
    check_messages(chosen, "chosen", where);
    check_messages(rejected, "rejected", where);
  } else {
    if (chosen.get_ref<const std::string&>().empty()) bad(where, "chosen is empty");
    if (rejected.get_ref<const std::string&>().empty()) bad(where, "rejected is empty");
  }
  if (!r.implicit_prompt) {
    r.chosen = chosen;
    r.rejected = rejected;
  } else if (r.conversational) {
    const size_t end = messages_prompt_end(chosen, rejected);
    if (end == 0)
      bad(where,
          "no \"prompt\", and chosen and rejected share no leading message to take it from "
          "(they differ from the first message on)");
    r.prompt = json(chosen.begin(), chosen.begin() + static_cast<std::ptrdiff_t>(end));
    r.chosen = json(chosen.begin() + static_cast<std::ptrdiff_t>(end), chosen.end());
    r.rejected = json(rejected.begin() + static_cast<std::ptrdiff_t>(end), rejected.end());
  } else {
    const std::string& c = chosen.get_ref<const std::string&>();
    const std::string& j = rejected.get_ref<const std::string&>();
    const size_t end = text_prompt_end(c, j);
    if (end == 0)
      bad(where,
          "no \"prompt\", and chosen and rejected share no leading text to take it from "
          "(they differ from the first character on)");
    r.prompt = c.substr(0, end);
    r.chosen = c.substr(end);
    r.rejected = j.substr(end);
  }
  if (r.conversational) read_chat_extras(rec, r);
  return r;
}

}  // namespace

std::vector<std::string> expand_paths(const std::vector<std::string>& patterns,
                                      const std::string& context, const std::string& key) {
  if (patterns.empty()) throw ConfigError(context + ": " + key + " is empty: list the JSONL files");
  return chat::expand_paths(patterns, context, key);
}

std::string excerpt(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

void check_messages(const json& list, const std::string& field, const std::string& where) {
  if (list.empty()) bad(where, field + " is an empty list of messages");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = field + "[" + std::to_string(i) + "]";
    const json& m = list[i];
    if (!m.is_object())
      bad(where, path + " must be an object with \"role\" and \"content\", got " + excerpt(m));
    auto role = m.find("role");
    if (role == m.end()) bad(where, "no \"role\" in " + path);
    if (!role->is_string()) bad(where, path + ".role must be a string, got " + excerpt(*role));
    if (!kRoles.count(role->get<std::string>()))
      bad(where, path + ".role: unknown role \"" + role->get<std::string>() +
                     "\" (expected system, user, assistant or tool)");
    auto content = m.find("content");
    if (content == m.end()) bad(where, "no \"content\" in " + path);
    if (!content->is_string() && !(content->is_null() && *role == "assistant"))
      bad(where, path + ".content must be a string, got " + excerpt(*content));
  }
}

void read_chat_extras(const json& rec, Row& r) {
  const std::string where = r.where();
  if (auto t = rec.find("tools"); t != rec.end() && !t->is_null()) {
    if (t->is_string()) {  // TRL accepts the tools as a JSON string too
      try {
        r.tools = json::parse(t->get<std::string>());
      } catch (const json::exception& e) {
        bad(where, "tools: malformed JSON string: " + v1::parse_error_text(e.what()));
      }
    } else {
      r.tools = *t;
    }
    if (!r.tools.is_array())
      bad(where, "tools must be a list of JSON-schema objects, got " + excerpt(r.tools));
  }
  if (auto k = rec.find("chat_template_kwargs"); k != rec.end() && !k->is_null()) {
    if (!k->is_object()) bad(where, "chat_template_kwargs must be an object, got " + excerpt(*k));
    r.template_kwargs = *k;
  }
}

void for_each_jsonl_line(const std::vector<std::string>& files, const std::string& who,
                         const std::function<void(const json&, Row)>& f) {
  for (const auto& file : files) {
    auto row = [&](int64_t line, const json& rec) {
      Row r;
      r.file = file;
      r.line = line;
      f(rec, std::move(r));
    };
    chat::for_each_jsonl_record(file, chat::read_file(file, who), row);
  }
}

std::vector<Row> read_rows(const std::vector<std::string>& files) {
  std::vector<Row> out;
  for_each_jsonl_line(files, "preference",
                      [&](const json& rec, Row r) { out.push_back(parse_row(rec, std::move(r))); });
  return out;
}

Pair tokenize_row(const Row& row, const text::Tokenizer& tok, const text::ChatTemplate* tmpl) {
  const std::string where = row.where();
  Pair p;
  p.where = where;
  std::vector<int32_t> prompt, with_chosen, with_rejected;
  try {
    if (row.conversational) {
      if (tmpl == nullptr) bad(where, "conversational row but no chat template");
      text::ChatTemplateOptions o;
      o.tools = row.tools;
      o.variables = row.template_kwargs;
      auto ids = [&](const json& messages, bool generation_prompt) {
        o.add_generation_prompt = generation_prompt;
        return tok.encode(tmpl->apply(messages, o).text, /*add_special_tokens=*/false);
      };
      auto joined = [&](const json& completion) {
        json all = row.prompt;
        for (const auto& m : completion) all.push_back(m);
        return all;
      };
      prompt = ids(row.prompt, true);
      with_chosen = ids(joined(row.chosen), false);
      with_rejected = ids(joined(row.rejected), false);
    } else {
      const auto eos = tok.eos_token();
      if (!eos)
        bad(where, "the tokenizer (" + tok.directory() +
                       ") names no eos_token, which standard (text) rows end with");
      auto with_eos = [&](const std::string& s) {
        const bool ends =
            s.size() >= eos->size() && s.compare(s.size() - eos->size(), eos->size(), *eos) == 0;
        return ends ? s : s + *eos;
      };
      const std::string& pr = row.prompt.get_ref<const std::string&>();
      prompt = tok.encode(pr, /*add_special_tokens=*/true);
      with_chosen = tok.encode(pr + with_eos(row.chosen.get<std::string>()), true);
      with_rejected = tok.encode(pr + with_eos(row.rejected.get<std::string>()), true);
    }
  } catch (const text::ChatTemplateError& e) {
    bad(where, std::string("chat template: ") + e.what());
  } catch (const std::invalid_argument& e) {
    bad(where, std::string("tokenizer: ") + e.what());
  }
  const size_t keep = std::min(chat::common_prefix(prompt, with_chosen),
                               chat::common_prefix(prompt, with_rejected));
  p.prompt_diverged = keep < prompt.size();
  p.prompt_ids.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(keep));
  p.chosen_ids.assign(with_chosen.begin() + static_cast<std::ptrdiff_t>(keep), with_chosen.end());
  p.rejected_ids.assign(with_rejected.begin() + static_cast<std::ptrdiff_t>(keep),
                        with_rejected.end());
  return p;
}

namespace {

// The longest common start of `a` and `b` in whole UTF-8 characters (Python compares code points).
size_t common_text_prefix(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  if (i < a.size() && i < b.size())  // they differ inside a character: back to its first byte
    while (i > 0 && (continuation(a, i) || continuation(b, i))) --i;
  return i;
}

// One sequence of CPOTrainer.build_tokenized_answer: tok(prompt + answer) without special tokens,
// split where tok(prompt) ends, or one token earlier when tok(prompt) is not its prefix.
struct CpoSplit {
  std::vector<int32_t> prompt, answer;
  bool moved = false;  // the split moved one token earlier
};

CpoSplit split_sequence(const std::vector<int32_t>& prompt, const std::string& text,
                        const text::Tokenizer& tok, const std::string& where, const char* which) {
  const std::vector<int32_t> full = tok.encode(text, /*add_special_tokens=*/false);
  if (full.size() < prompt.size())
    bad(where, std::string("prompt + ") + which + " tokenizes to " + std::to_string(full.size()) +
                   " tokens, fewer than the prompt alone (" + std::to_string(prompt.size()) +
                   "): TRL's CPOTrainer and ORPOTrainer refuse such a row");
  CpoSplit s;
  size_t start = prompt.size();
  if (!std::equal(prompt.begin(), prompt.end(), full.begin())) {
    --start;
    s.moved = true;
  }
  s.prompt.assign(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(start));
  s.answer.assign(full.begin() + static_cast<std::ptrdiff_t>(start), full.end());
  return s;
}

}  // namespace

Pair tokenize_row_cpo(const Row& row, const text::Tokenizer& tok, const text::ChatTemplate* tmpl) {
  const std::string where = row.where();
  std::string prompt, chosen, rejected;
  CpoSplit c, r;
  std::vector<int32_t> prompt_ids;
  try {
    if (row.conversational) {
      // maybe_apply_chat_template: the conversation rendered to text, then handled as text.
      if (tmpl == nullptr) bad(where, "conversational row but no chat template");
      const std::string last = row.prompt.back().at("role").get<std::string>();
      if (last == "system")
        bad(where,
            "prompt ends with a system message: TRL's CPOTrainer and ORPOTrainer render the "
            "prompt with the generation prompt (last message from the user or a tool) or "
            "continue it (last message from the assistant)");
      text::ChatTemplateOptions o;
      o.variables = row.template_kwargs;  // the row's tools are not passed (TRL passes none)
      auto render = [&](const json& messages) { return tmpl->apply(messages, o).text; };
      auto joined = [&](const json& completion) {
        json all = row.prompt;
        for (const auto& m : completion) all.push_back(m);
        return all;
      };
      o.add_generation_prompt = last != "assistant";
      o.continue_final_message = last == "assistant";
      prompt = render(row.prompt);
      o.add_generation_prompt = o.continue_final_message = false;
      const std::string with_chosen = render(joined(row.chosen));
      const std::string with_rejected = render(joined(row.rejected));
      // The prompt text is cut to what both conversations start with (TRL's DeepSeek-R1 case).
      prompt.resize(common_text_prefix(prompt, with_chosen));
      prompt.resize(common_text_prefix(prompt, with_rejected));
      chosen = with_chosen.substr(prompt.size());
      rejected = with_rejected.substr(prompt.size());
    } else {
      prompt = row.prompt.get<std::string>();
      chosen = row.chosen.get<std::string>();
      rejected = row.rejected.get<std::string>();
    }
    prompt_ids = tok.encode(prompt, /*add_special_tokens=*/false);
    c = split_sequence(prompt_ids, prompt + chosen, tok, where, "chosen");
    r = split_sequence(prompt_ids, prompt + rejected, tok, where, "rejected");
  } catch (const text::ChatTemplateError& e) {
    bad(where, std::string("chat template: ") + e.what());
  } catch (const std::invalid_argument& e) {
    bad(where, std::string("tokenizer: ") + e.what());
  }
  // TRL: "Chosen and rejected prompt_input_ids might only differ on the last token".
  size_t differing = 0;
  for (size_t i = 0; i < std::min(c.prompt.size(), r.prompt.size()); ++i)
    differing += c.prompt[i] != r.prompt[i];
  const size_t len_diff = c.prompt.size() > r.prompt.size() ? c.prompt.size() - r.prompt.size()
                                                            : r.prompt.size() - c.prompt.size();
  if (differing > 1 || len_diff > 1)
    bad(where,
        "the prompt tokenizes differently before chosen and before rejected beyond its last "
        "token: TRL's CPOTrainer and ORPOTrainer refuse such a row");
  if (const auto bos = tok.bos_token_id())
    for (CpoSplit* s : {&c, &r})
      if (s->prompt.empty() || s->prompt.front() != *bos) s->prompt.insert(s->prompt.begin(), *bos);
  const auto eos = tok.eos_token_id();
  if (!eos)
    bad(where, "the tokenizer (" + tok.directory() +
                   ") names no eos_token, which CPOTrainer and ORPOTrainer end every completion "
                   "with");
  for (CpoSplit* s : {&c, &r})
    if (s->answer.empty() || s->answer.back() != *eos) s->answer.push_back(*eos);
  Pair p;
  p.where = where;
  p.prompt_diverged = c.moved || r.moved;
  p.prompt_ids = std::move(c.prompt);
  p.chosen_ids = std::move(c.answer);
  p.rejected_ids = std::move(r.answer);
  if (r.prompt != p.prompt_ids) p.rejected_prompt_ids = std::move(r.prompt);
  return p;
}

void clip_prompt(Pair& pair, const Limits& limits) {
  auto clip = [&](std::vector<int32_t>& prompt) {
    const auto n = static_cast<int64_t>(prompt.size());
    if (limits.max_prompt_length > 0 && n > limits.max_prompt_length)
      prompt.erase(prompt.begin(), prompt.begin() + (n - limits.max_prompt_length));
  };
  clip(pair.prompt_ids);
  if (pair.rejected_prompt_ids) clip(*pair.rejected_prompt_ids);
}

int64_t Sequence::counted_targets() const {
  const size_t first = std::max<size_t>(completion_begin, 1);
  return ids.size() > first ? static_cast<int64_t>(ids.size() - first) : 0;
}

Sequence make_sequence(const Pair& pair, bool rejected, const Limits& limits) {
  const std::vector<int32_t>& completion = rejected ? pair.rejected_ids : pair.chosen_ids;
  const std::vector<int32_t>& prompt = pair.prompt_of(rejected);
  Sequence s;
  s.ids = prompt;
  s.ids.insert(s.ids.end(), completion.begin(), completion.end());
  s.completion_begin = prompt.size();
  const auto max = static_cast<size_t>(limits.max_length);
  if (limits.max_length > 0 && s.ids.size() > max) {
    if (limits.keep_end) {
      const size_t cut = s.ids.size() - max;
      s.ids.erase(s.ids.begin(), s.ids.begin() + static_cast<std::ptrdiff_t>(cut));
      s.completion_begin = s.completion_begin > cut ? s.completion_begin - cut : 0;
    } else {
      s.ids.resize(max);
      s.completion_begin = std::min(s.completion_begin, max);
    }
  }
  return s;
}

Verdict verdict(const Pair& pair, const Limits& limits) {
  if (limits.max_length > 0 && !limits.keep_end)
    for (bool rejected : {false, true})
      if (static_cast<int64_t>(pair.prompt_of(rejected).size()) >= limits.max_length)
        return Verdict::PromptFillsMaxLength;
  for (bool rejected : {false, true})
    if (make_sequence(pair, rejected, limits).counted_targets() == 0)
      return Verdict::NoCountedTarget;
  return Verdict::Keep;
}

Collated collate(const std::vector<const Pair*>& pairs, const Limits& limits, int32_t pad,
                 int64_t ignore_index, bool chosen_prompt_rows) {
  const size_t B = pairs.size();
  std::vector<Sequence> seqs;
  seqs.reserve(3 * B);
  for (bool rejected : {false, true})
    for (const Pair* p : pairs) seqs.push_back(make_sequence(*p, rejected, limits));
  if (chosen_prompt_rows)
    for (size_t i = 0; i < B; ++i) seqs.push_back(seqs[i]);
  Collated c;
  c.rows = static_cast<int64_t>(seqs.size());
  for (const auto& s : seqs)
    c.width = std::max<int64_t>(c.width, static_cast<int64_t>(s.ids.size()) - 1);
  const auto W = static_cast<size_t>(c.width);
  c.input.assign(seqs.size() * W, pad);
  c.target.assign(seqs.size() * W, ignore_index);
  for (size_t r = 0; r < seqs.size(); ++r) {
    const Sequence& s = seqs[r];
    const bool prompt_targets = r >= 2 * B;  // ORPO's copy of a chosen row: its prompt's targets
    for (size_t t = 0; t + 1 < s.ids.size(); ++t) {
      c.input[r * W + t] = s.ids[t];
      if ((t + 1 >= s.completion_begin) != prompt_targets) c.target[r * W + t] = s.ids[t + 1];
    }
    if (s.ids.size() > 1 && !prompt_targets) c.num_tokens += static_cast<int64_t>(s.ids.size()) - 1;
    c.lengths.push_back(std::max<int64_t>(static_cast<int64_t>(s.ids.size()) - 1, 0));
  }
  return c;
}

Collated packed(const Collated& padded) {
  Collated c;
  c.rows = 1;
  c.num_tokens = padded.num_tokens;
  const auto W = static_cast<size_t>(padded.width);
  for (size_t r = 0; r < padded.lengths.size(); ++r) {
    const auto row = static_cast<std::ptrdiff_t>(r * W);
    const auto n = static_cast<std::ptrdiff_t>(padded.lengths[r]);
    c.input.insert(c.input.end(), padded.input.begin() + row, padded.input.begin() + row + n);
    c.target.insert(c.target.end(), padded.target.begin() + row, padded.target.begin() + row + n);
    for (int64_t t = 0; t < n; ++t) {
      c.positions.push_back(t);
      c.segments.push_back(static_cast<int64_t>(r));
    }
  }
  c.width = static_cast<int64_t>(c.input.size());
  c.lengths = {c.width};
  return c;
}

}  // namespace trainrun::preference
