// ChatTemplate (chat_template.hpp): loading a tokenizer's template and special tokens the way
// transformers does, the built-in templates, and apply_chat_template's preprocessing.
#include "trainrun/text/chat_template.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "jinja_render.hpp"
#include "trainrun/error.hpp"
#include "trainrun/json_depth.hpp"
#include "jinja_syntax.hpp"

namespace trainrun::text {
namespace {

using json = nlohmann::ordered_json;

std::string location(const std::string& origin, int line) {
  return line > 0 ? origin + ", line " + std::to_string(line) : origin;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json(const std::filesystem::path& p) {
  const std::string text = read_file(p);
  if (trainrun::v1::json_too_deep(text))
    throw std::runtime_error(p.string() + ": JSON nested deeper than " +
                             std::to_string(trainrun::v1::kMaxJsonDepth) + " levels");
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(p.string() + ": invalid JSON: " + trainrun::v1::parse_error_text(e.what()));
  }
}

// The built-in templates: chatml and alpaca are the common community formats; llama3, llama2 and
// mistral are the formats of Meta's and Mistral AI's instruct models as their tokenizers define
// them (Llama 3 Instruct headers, Llama 2 chat [INST]/<<SYS>>, Mistral [INST] with an optional
// system prompt joined to the first user turn).
const std::map<std::string, std::string>& builtins() {
  static const std::map<std::string, std::string> table = {
      {"chatml",
       "{% for message in messages %}"
       "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
       "{% endfor %}"
       "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
      {"llama3",
       "{% for message in messages %}"
       "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
       "message['content'] | trim + '<|eot_id|>' %}"
       "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
       "{{ content }}"
       "{% endfor %}"
       "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"},
      {"llama2",
       "{% if messages[0]['role'] == 'system' %}"
       "{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
       "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
       "{% for message in loop_messages %}"
       "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
       "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
       "{% endif %}"
       "{% if loop.index0 == 0 and system_message != false %}"
       "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
       "{% else %}{% set content = message['content'] %}{% endif %}"
       "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
       "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
       "{% endif %}"
       "{% endfor %}"},
      {"mistral",
       "{%- if messages[0]['role'] == 'system' %}\n"
       "    {%- set system_message = messages[0]['content'] %}\n"
       "    {%- set loop_messages = messages[1:] %}\n"
       "{%- else %}\n"
       "    {%- set loop_messages = messages %}\n"
       "{%- endif %}\n"
       "{{- bos_token }}\n"
       "{%- for message in loop_messages %}\n"
       "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
       "        {{- raise_exception('After the optional system message, conversation roles must alternate "
       "user/assistant/user/assistant/...') }}\n"
       "    {%- endif %}\n"
       "    {%- if message['role'] == 'user' %}\n"
       "        {%- if loop.first and system_message is defined %}\n"
       "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
       "        {%- else %}\n"
       "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n"
       "        {%- endif %}\n"
       "    {%- elif message['role'] == 'assistant' %}\n"
       "        {{- ' ' + message['content'] + eos_token }}\n"
       "    {%- else %}\n"
       "        {{- raise_exception('Only user and assistant roles are supported, with the exception of an "
       "initial optional system message!') }}\n"
       "    {%- endif %}\n"
       "{%- endfor %}\n"},
      {"alpaca",
       "{%- if messages[0]['role'] == 'system' %}\n"
       "    {%- set system_message = messages[0]['content'] %}\n"
       "    {%- set loop_messages = messages[1:] %}\n"
       "{%- else %}\n"
       "    {%- set system_message = 'Below is an instruction that describes a task. "
       "Write a response that appropriately completes the request.' %}\n"
       "    {%- set loop_messages = messages %}\n"
       "{%- endif %}\n"
       "{{- system_message + '\\n\\n' }}\n"
       "{%- for message in loop_messages %}\n"
       "    {%- if message['role'] == 'user' %}\n"
       "        {{- '### Instruction:\\n' + message['content'] + '\\n\\n' }}\n"
       "    {%- elif message['role'] == 'assistant' %}\n"
       "        {{- '### Response:\\n' + message['content'] + eos_token + '\\n\\n' }}\n"
       "    {%- else %}\n"
       "        {{- raise_exception('The alpaca template supports system, user and assistant roles, not ' + "
       "message['role']) }}\n"
       "    {%- endif %}\n"
       "{%- endfor %}\n"
       "{%- if add_generation_prompt %}\n"
       "    {{- '### Response:\\n' }}\n"
       "{%- endif %}\n"},
  };
  return table;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// transformers' _alias_reasoning_fields: {"thinking": r, **message, "reasoning_content": r}.
json alias_reasoning(const json& message) {
  static const char* fields[] = {"reasoning_content", "thinking", "reasoning"};
  const json* reasoning = nullptr;
  for (const char* f : fields) {
    auto it = message.find(f);
    if (it != message.end() && !it->is_null()) {
      reasoning = &*it;
      break;
    }
  }
  if (!reasoning) return message;
  json out = json::object();
  out["thinking"] = *reasoning;
  for (auto it = message.begin(); it != message.end(); ++it) out[it.key()] = it.value();
  out["reasoning_content"] = *reasoning;
  return out;
}

}  // namespace

ChatTemplateError::ChatTemplateError(const std::string& origin, const std::string& message, int line, bool raised)
    : std::runtime_error(raised ? origin + " raised: " + message + (line > 0 ? " (line " + std::to_string(line) + ")" : "")
                                : location(origin, line) + ": " + message),
      message_(message),
      line_(line),
      raised_(raised) {}

ChatTemplate::ChatTemplate(std::string source, nlohmann::ordered_json special_tokens,
                           std::string origin)
    : ChatTemplate(std::move(source), std::move(special_tokens), std::move(origin),
                   TemplateLimits{}) {}

ChatTemplate::ChatTemplate(std::string source, nlohmann::ordered_json special_tokens,
                           std::string origin, TemplateLimits limits)
    : source_(std::move(source)),
      special_tokens_(std::move(special_tokens)),
      origin_(std::move(origin)) {
  if (!special_tokens_.is_object())
    throw std::invalid_argument(origin_ + ": special tokens must be a JSON object");
  try {
    auto compiled = jinja::parse(source_);
    compiled->max_bytes = limits.max_bytes;
    compiled->max_operations = limits.max_operations;
    compiled_ = std::move(compiled);
  } catch (const jinja::Error& e) {
    throw ChatTemplateError(origin_, e.what(), e.line(), false);
  }
}

TemplateLimits ChatTemplate::limits() const {
  return TemplateLimits{compiled_->max_bytes, compiled_->max_operations};
}

RenderedChat ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  RenderCost unused;
  return render(variables, unused);
}

RenderedChat ChatTemplate::render(const nlohmann::ordered_json& variables, RenderCost& cost) const {
  if (!variables.is_object()) throw ChatTemplateError(origin_, "template variables must be a JSON object", 0, false);
  jinja::Dict vars;
  for (auto it = variables.begin(); it != variables.end(); ++it)
    vars.items.emplace_back(it.key(), jinja::Value::from_json(it.value()));
  try {
    jinja::RenderResult r =
        jinja::render(*compiled_, vars, {compiled_->max_bytes, compiled_->max_operations});
    cost = RenderCost{r.bytes_built, r.operations};
    return RenderedChat{std::move(r.text), std::move(r.generation_spans)};
  } catch (const jinja::Raised& e) {
    throw ChatTemplateError(origin_, e.what(), e.line(), true);
  } catch (const jinja::Error& e) {
    throw ChatTemplateError(origin_, e.what(), e.line(), false);
  }
}

RenderedChat ChatTemplate::apply(const nlohmann::ordered_json& messages, const ChatTemplateOptions& options) const {
  RenderCost unused;
  return apply(messages, options, unused);
}

RenderedChat ChatTemplate::apply(const nlohmann::ordered_json& messages,
                                 const ChatTemplateOptions& options, RenderCost& cost) const {
  auto bad = [&](const std::string& what) { return ChatTemplateError(origin_, what, 0, false); };
  if (!messages.is_array()) throw bad("messages must be a JSON array of message objects");
  if (messages.empty()) throw bad("cannot apply a chat template to an empty conversation; give at least one message");
  if (options.continue_final_message && options.add_generation_prompt)
    throw bad("continue_final_message and add_generation_prompt are not compatible");
  json chat = json::array();
  for (size_t k = 0; k < messages.size(); ++k) {
    const json& m = messages[k];
    if (!m.is_object()) throw bad("message " + std::to_string(k) + " is not a JSON object: " + m.dump());
    json clean = json::object();
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it.value().is_null()) clean[it.key()] = it.value();
    chat.push_back(alias_reasoning(clean));
  }
  if (!options.tools.is_null()) {
    if (!options.tools.is_array()) throw bad("tools must be a JSON array of JSON-schema objects");
    for (const auto& t : options.tools)
      if (!t.is_object()) throw bad("each tool must be a JSON-schema object, got: " + t.dump());
  }
  if (!options.documents.is_null()) {
    if (!options.documents.is_array()) throw bad("documents must be a JSON array of objects");
    for (const auto& d : options.documents)
      if (!d.is_object()) throw bad("documents should be a list of dicts with 'title' and 'text' keys");
  }
  if (!options.variables.is_object()) throw bad("extra template variables must be a JSON object");

  // continue_final_message: render with a tag after the final message, then cut at the tag.
  static const std::string tag = "CONTINUE_FINAL_MESSAGE_TAG ";
  std::string final_message;
  if (options.continue_final_message) {
    json& content = chat.back()["content"];
    if (content.is_string()) {
      final_message = content.get<std::string>();
      content = final_message + tag;
    } else if (content.is_array()) {
      bool found = false;
      for (auto it = content.rbegin(); it != content.rend() && !found; ++it)
        if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
          final_message = (*it)["text"].get<std::string>();
          (*it)["text"] = final_message + tag;
          found = true;
        }
      if (!found) throw bad("continue_final_message is set but the final message has no text to continue");
    } else {
      throw bad("continue_final_message is set but the final message has no \"content\" to continue");
    }
  }

  json vars = json::object();
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) vars[it.key()] = it.value();
  for (auto it = options.variables.begin(); it != options.variables.end(); ++it) vars[it.key()] = it.value();
  vars["messages"] = std::move(chat);
  vars["tools"] = options.tools;
  vars["documents"] = options.documents;
  vars["add_generation_prompt"] = options.add_generation_prompt;
  RenderedChat out = render(vars, cost);

  if (options.continue_final_message) {
    auto strip = [](const std::string& s) {
      const size_t b = s.find_first_not_of(" \t\n\r\f\v");
      if (b == std::string::npos) return std::string();
      return s.substr(b, s.find_last_not_of(" \t\n\r\f\v") - b + 1);
    };
    const std::string stripped_tag = strip(tag);
    if (out.text.find(strip(final_message)) == std::string::npos || out.text.find(stripped_tag) == std::string::npos)
      throw bad("continue_final_message is set but the final message does not appear in the rendered chat "
                "(the template changes or drops it)");
    const size_t at = out.text.rfind(stripped_tag);
    if (out.text.compare(at, tag.size(), tag) == 0) {
      out.text.resize(at);
    } else {
      out.text.resize(at);
      const size_t e = out.text.find_last_not_of(" \t\n\r\f\v");
      out.text.resize(e == std::string::npos ? 0 : e + 1);
    }
  }
  return out;
}

std::vector<std::string> builtin_chat_template_names() {
  return {"chatml", "llama3", "llama2", "mistral", "alpaca"};
}

const std::string& builtin_chat_template(const std::string& name) {
  auto it = builtins().find(name);
  if (it == builtins().end())
    throw std::invalid_argument("unknown built-in chat template '" + name + "' (known: " +
                                joined(builtin_chat_template_names()) + ")");
  return it->second;
}

nlohmann::ordered_json load_special_tokens(const std::filesystem::path& dir) {
  static const char* named[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                "pad_token", "cls_token", "mask_token"};
  json config = json::object();
  const auto config_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) config = read_json(config_path);
  if (!config.is_object()) throw std::runtime_error(config_path.string() + ": expected a JSON object");
  auto token_text = [](const json& v, const std::string& where) -> json {
    if (v.is_string()) return v;
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"];
    if (v.is_null()) return nullptr;
    throw std::runtime_error(where + ": a special token must be a string or an object with \"content\"");
  };
  json tokens = json::object();
  std::vector<std::string> order(std::begin(named), std::end(named));
  for (const auto& key : order)
    if (config.contains(key)) tokens[key] = token_text(config[key], config_path.string() + ": key " + key);
  // Legacy layout: special_tokens_map.json counts only when the config has no added_tokens_decoder.
  const auto map_path = dir / "special_tokens_map.json";
  if (!config.contains("added_tokens_decoder") && std::filesystem::exists(map_path)) {
    const json map = read_json(map_path);
    for (const auto& key : order)
      if (map.contains(key)) tokens[key] = token_text(map[key], map_path.string() + ": key " + key);
  }
  // Model-specific named tokens (extra_special_tokens given as a mapping, e.g. "image_token").
  if (config.contains("extra_special_tokens") && config["extra_special_tokens"].is_object())
    for (auto it = config["extra_special_tokens"].begin(); it != config["extra_special_tokens"].end(); ++it) {
      tokens[it.key()] = token_text(it.value(), config_path.string() + ": key extra_special_tokens." + it.key());
      order.push_back(it.key());
    }
  json out = json::object();
  for (const auto& key : order)
    if (tokens.contains(key) && tokens[key].is_string()) out[key] = tokens[key];
  return out;
}

ChatTemplate load_chat_template(const std::filesystem::path& dir, const std::string& name) {
  return load_chat_template(dir, name, TemplateLimits{});
}

ChatTemplate load_chat_template(const std::filesystem::path& dir, const std::string& name,
                                const TemplateLimits& limits) {
  if (!std::filesystem::is_directory(dir)) throw std::runtime_error(dir.string() + ": not a tokenizer directory");
  std::map<std::string, std::string> templates;  // name -> source
  std::map<std::string, std::string> origins;
  if (std::filesystem::exists(dir / "chat_template.jinja")) {
    templates["default"] = read_file(dir / "chat_template.jinja");
    origins["default"] = (dir / "chat_template.jinja").string();
  }
  const auto extra_dir = dir / "additional_chat_templates";
  if (std::filesystem::is_directory(extra_dir))
    for (const auto& entry : std::filesystem::directory_iterator(extra_dir))
      if (entry.path().extension() == ".jinja") {
        templates[entry.path().stem().string()] = read_file(entry.path());
        origins[entry.path().stem().string()] = entry.path().string();
      }
  const auto config_path = dir / "tokenizer_config.json";
  if (templates.empty() && std::filesystem::exists(config_path)) {
    const json config = read_json(config_path);
    if (config.contains("chat_template")) {
      const json& t = config["chat_template"];
      if (t.is_string()) {
        templates["default"] = t.get<std::string>();
        origins["default"] = config_path.string() + " (chat_template)";
      } else if (t.is_array()) {
        for (const auto& entry : t) {
          if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
              !entry["name"].is_string() || !entry["template"].is_string())
            throw std::runtime_error(config_path.string() + ": chat_template entries must be {\"name\", \"template\"}");
          templates[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
          origins[entry["name"].get<std::string>()] =
              config_path.string() + " (chat_template " + entry["name"].get<std::string>() + ")";
        }
      } else if (!t.is_null()) {
        throw std::runtime_error(config_path.string() + ": chat_template must be a string or a list");
      }
    }
  }
  json special = load_special_tokens(dir);
  std::vector<std::string> own;
  for (const auto& kv : templates) own.push_back(kv.first);
  if (!name.empty()) {
    if (templates.count(name)) return ChatTemplate(templates[name], special, origins[name], limits);
    if (builtins().count(name))
      return ChatTemplate(builtins().at(name), special, "built-in chat template " + name, limits);
    if (std::filesystem::is_regular_file(name))
      return ChatTemplate(read_file(name), special, name, limits);
    throw std::runtime_error("no chat template named '" + name + "' (" + dir.string() +
                             (own.empty() ? " has none" : " has: " + joined(own)) +
                             "; built-ins: " + joined(builtin_chat_template_names()) + "; or a .jinja file path)");
  }
  if (templates.empty())
    throw std::runtime_error(dir.string() + " has no chat template (no chat_template.jinja, no \"chat_template\" in "
                             "tokenizer_config.json); name a built-in one: " + joined(builtin_chat_template_names()));
  if (templates.count("default"))
    return ChatTemplate(templates["default"], special, origins["default"], limits);
  throw std::runtime_error(dir.string() + " has several chat templates and no default; name one of: " + joined(own));
}

}  // namespace trainrun::text
