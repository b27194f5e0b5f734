// Unit tests of the chat-template engine (trainrun/text/chat_template.hpp): Jinja whitespace
// rules, Python value semantics, rendering, errors that name the construct and line, the
// tokenizer-directory loader and the built-in templates. The equality with transformers on real
// templates is tests/e2e/chat_template_reference.py.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "jinja_value.hpp"
#include "trainrun/text/chat_template.hpp"

using json = nlohmann::ordered_json;
using trainrun::text::ChatTemplate;
using trainrun::text::ChatTemplateError;

namespace {

std::string render(const std::string& src, const json& vars = json::object()) {
  return ChatTemplate(src).render(vars).text;
}

// The error a template gives (compiling or rendering), or "" when it renders.
ChatTemplateError error_of(const std::string& src, const json& vars = json::object()) {
  try {
    render(src, vars);
  } catch (const ChatTemplateError& e) {
    return e;
  }
  FAIL("expected a ChatTemplateError from: " << src);
  return ChatTemplateError("", "", 0, false);
}

const json kChat = json::parse(R"([{"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])");

std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("trainrun-unit-chat-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

}  // namespace

TEST_SUITE("syntax") {
  TEST_CASE("trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before it") {
    CHECK(render("{% if true %}\nA\n{% endif %}\nB") == "A\nB");
    CHECK(render("  {% if true %}\n  x\n  {% endif %}\n") == "  x\n");
    // not before {{ }}, and not when the line holds other text before the tag
    CHECK(render("  {{ 'v' }}\n") == "  v");
    CHECK(render("a {% if true %}b{% endif %}") == "a b");
  }
  TEST_CASE("- strips all whitespace on its side, + keeps it") {
    CHECK(render("a  \n {%- if true -%} \n b \n {%- endif %}") == "ab");
    CHECK(render("x\n  {%+ if true %}y{% endif %}") == "x\n  y");
    CHECK(render("{% if true +%}\nz{% endif %}") == "\nz");
    CHECK(render("[ {{- 'v' -}} ]") == "[v]");
  }
  TEST_CASE("one trailing newline of the template is dropped, comments vanish, raw is literal") {
    CHECK(render("x\n") == "x");
    CHECK(render("x\n\n") == "x\n");
    CHECK(render("a{# note #}\nb") == "ab");
    CHECK(render("{% raw %}{{ x }}{% endraw %}") == "{{ x }}");
    CHECK(render("a\r\nb") == "a\nb");
  }
  TEST_CASE("string literals take Python escapes; adjacent literals join") {
    CHECK(render(R"({{ 'a\tb\x41\u00e9\\d' }})") == "a\tbA\xc3\xa9\\d");
    CHECK(render(R"({{ "x" 'y' }})") == "xy");
  }
  TEST_CASE("operator precedence follows jinja2: filters bind tighter than +, ~ below *") {
    CHECK(render("{{ 'a' + ' b '|trim + 'c' }}") == "abc");
    CHECK(render("{{ 1 + 2 * 3 }}{{ 'a' ~ 2 * 3 }}") == "7a6");
    CHECK_THROWS_AS(render("{{ 1 + 2 ~ 3 }}"), ChatTemplateError);  // 1 + (2 ~ 3): int + str
    CHECK(render("{{ -2 ** 2 }}") == "4");  // jinja2's unary minus binds tighter than **
    CHECK(render("{{ not 1 == 2 }}") == "True");
  }
}

TEST_SUITE("values") {
  using namespace trainrun::text::jinja;
  TEST_CASE("floats print as Python's repr") {
    CHECK(float_repr(1.0) == "1.0");
    CHECK(float_repr(0.1 + 0.2) == "0.30000000000000004");
    CHECK(float_repr(1e16) == "1e+16");
    CHECK(float_repr(1.5e-7) == "1.5e-07");
    CHECK(float_repr(123456.789) == "123456.789");
    CHECK(float_repr(-0.0001) == "-0.0001");
    CHECK(float_repr(0.00001) == "1e-05");
  }
  TEST_CASE("str() and repr() of containers as Python prints them") {
    CHECK(render("{{ [1, 'a', none, true, 2.5, {'k': \"it's\"}] }}") == "[1, 'a', None, True, 2.5, {'k': \"it's\"}]");
    CHECK(render("{{ (1,) }}{{ ('x', 2) }}") == "(1,)('x', 2)");
  }
  TEST_CASE("strings are indexed, sliced and measured by code point") {
    CHECK(render("{{ 'h\xc3\xa9llo'|length }} {{ 'h\xc3\xa9llo'[1] }} {{ 'h\xc3\xa9llo'[::-1] }}") ==
          "5 \xc3\xa9 oll\xc3\xa9h");
  }
  TEST_CASE("tojson is json.dumps(ensure_ascii=False) with Python's separators") {
    CHECK(render("{{ {'a': [1, 2.0, none], 'b': '\xc3\xa9<'}|tojson }}") == "{\"a\": [1, 2.0, null], \"b\": \"\xc3\xa9<\"}");
    CHECK(render("{{ [1]|tojson(indent=2) }}") == "[\n  1\n]");
    CHECK(render("{{ 'x'|tojson(ensure_ascii=true) }}") == "\"x\"");
  }
  TEST_CASE("Python equality and ordering across int, float and bool") {
    CHECK(render("{{ 1 == 1.0 }}{{ true == 1 }}{{ [1, 2] < [1, 3] }}{{ 'a' < 'b' }}{{ (1, 2) == [1, 2] }}") ==
          "TrueTrueTrueTrueFalse");
  }
}

TEST_SUITE("render") {
  TEST_CASE("loop variables and loops over dict items") {
    CHECK(render("{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}"
                 "{{ loop.length }};{% endfor %}",
                 {{"messages", kChat}}) == "01TrueFalse3;12FalseFalse3;23FalseTrue3;");
    CHECK(render("{% for k, v in d.items() %}{{ k }}={{ v }} {% endfor %}", {{"d", {{"b", 1}, {"a", 2}}}}) ==
          "b=1 a=2 ");
  }
  TEST_CASE("a loop body is a scope of its own; namespaces carry state out of it") {
    CHECK(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}") == "1");
    CHECK(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = i %}{% endfor %}{{ ns.x }}") == "2");
    CHECK(render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}") == "3");
  }
  TEST_CASE("macros with defaults and keyword arguments") {
    CHECK(render("{% macro f(a, b='x') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(1, b=2) }}") == "[1x][12]");
  }
  TEST_CASE("string methods and filters chat templates use") {
    CHECK(render("{{ ' a '.strip() }}|{{ 'a</think>b'.split('</think>')[-1] }}|{{ '\\n\\nx'.lstrip('\\n') }}|"
                 "{{ 'abc'.startswith('a') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aXa'.replace('a', 'b') }}") ==
          "a|b|x|True|True|bXb");
    CHECK(render("{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}|"
                 "{{ messages|length }}|{{ (messages|first).role }}|{{ messages[1:]|length }}|{{ x|default('d') }}",
                 {{"messages", kChat}}) == "Hi|3|system|2|d");
  }
  TEST_CASE("inline if, in / not in, is-tests") {
    CHECK(render("{{ 'y' if 'a' in 'abc' else 'n' }}{{ 3 not in [1, 2] }}{{ x is defined }}{{ none is none }}"
                 "{{ 'a' is string }}{{ {} is mapping }}{{ 3 is divisibleby 3 }}") == "yTrueFalseTrueTrueTrueTrue");
  }
  TEST_CASE("{% generation %} reports the byte ranges of assistant text") {
    const auto out = ChatTemplate("<u>{% generation %}\xc3\xa9t\xc3\xa9{% endgeneration %}</u>").render(json::object());
    REQUIRE(out.generation_spans.size() == 1);
    CHECK(out.text.substr(out.generation_spans[0].first,
                          out.generation_spans[0].second - out.generation_spans[0].first) == "\xc3\xa9t\xc3\xa9");
  }
  TEST_CASE("apply() drops null message keys and passes tools, documents and variables") {
    ChatTemplate t("{% for m in messages %}{{ m.role }}:{{ m.content }}{{ m.tool_calls is defined }};{% endfor %}"
                   "{{ tools is none }}{{ documents is none }}{{ enable_thinking }}{{ add_generation_prompt }}{{ eos_token }}",
                   {{"eos_token", "</s>"}});
    trainrun::text::ChatTemplateOptions o;
    o.variables = {{"enable_thinking", false}};
    o.add_generation_prompt = true;
    CHECK(t.apply(json::parse(R"([{"role": "user", "content": "x", "tool_calls": null}])"), o).text ==
          "user:xFalse;TrueTrueFalseTrue</s>");
  }
  TEST_CASE("continue_final_message leaves the last message open") {
    ChatTemplate t("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}");
    trainrun::text::ChatTemplateOptions o;
    o.continue_final_message = true;
    CHECK(t.apply(json::parse(R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "Sure"}])"), o)
              .text == "<user>q</user>\n<assistant>Sure");
  }
}

TEST_SUITE("errors") {
  TEST_CASE("raise_exception gives the template's own message") {
    const auto e = error_of("line one\n{{ raise_exception('Roles must alternate') }}");
    CHECK(e.raised());
    CHECK(e.message() == "Roles must alternate");
    CHECK(e.line() == 2);
    CHECK(std::string(e.what()).find("Roles must alternate") != std::string::npos);
  }
  TEST_CASE("unsupported constructs are named with their line") {
    auto e = error_of("a\nb\n{% include 'x.jinja' %}");
    CHECK(e.line() == 3);
    CHECK(!e.raised());
    CHECK(std::string(e.what()).find("{% include %}") != std::string::npos);
    e = error_of("\n{{ x|groupby('a') }}");
    CHECK(e.line() == 2);
    CHECK(std::string(e.what()).find("filter 'groupby'") != std::string::npos);
    e = error_of("{% if x is foo %}{% endif %}");
    CHECK(std::string(e.what()).find("test 'foo'") != std::string::npos);
    e = error_of("{% for x in y recursive %}{% endfor %}");
    CHECK(std::string(e.what()).find("recursive") != std::string::npos);
  }
  TEST_CASE("syntax errors and runtime type errors name the line") {
    auto e = error_of("{% if true %}\nno end");
    CHECK(std::string(e.what()).find("endif") != std::string::npos);
    e = error_of("\n\n{{ 'a' + 1 }}");
    CHECK(e.line() == 3);
    CHECK(std::string(e.what()).find("can only concatenate str") != std::string::npos);
    e = error_of("{{ messages[0].content }}", {{"messages", json::array()}});
    CHECK(std::string(e.what()).find("no element 0") != std::string::npos);
    e = error_of("{{ x.y }}");
    CHECK(std::string(e.what()).find("'x' is undefined") != std::string::npos);
  }
  TEST_CASE("the sandbox refuses mutation; namespaces refuse underscore names") {
    CHECK(std::string(error_of("{{ [1].append(2) }}").what()).find("unsafe") != std::string::npos);
    CHECK(std::string(error_of("{% set ns = namespace() %}{% set ns._x = 1 %}").what()).find("underscore") !=
          std::string::npos);
  }
  TEST_CASE("64-bit integer overflow and runaway macro recursion are refused, not wrapped or crashed") {
    CHECK(render("{{ 2 ** 62 }}") == "4611686018427387904");
    CHECK(std::string(error_of("{{ 2 ** 64 }}").what()).find("beyond 64 bits") != std::string::npos);
    CHECK(std::string(error_of("{{ 9223372036854775807 + 1 }}").what()).find("beyond 64 bits") != std::string::npos);
    CHECK(std::string(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").what())
              .find("recursion") != std::string::npos);
  }
  TEST_CASE("apply() refuses an empty conversation and non-object messages") {
    ChatTemplate t("{{ messages }}");
    CHECK_THROWS_AS(t.apply(json::array()), ChatTemplateError);
    CHECK_THROWS_AS(t.apply(json::parse("[1]")), ChatTemplateError);
  }
}

TEST_SUITE("loader") {
  TEST_CASE("the fixture tokenizers' templates and special tokens") {
    const std::string fixtures = TRAINRUN_TOKENIZER_FIXTURES;
    const auto llama3 = trainrun::text::load_chat_template(fixtures + "/llama3");
    CHECK(llama3.special_tokens() == json({{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|end_of_text|>"}}));
    CHECK(llama3.apply(json::parse(R"([{"role": "user", "content": " hi "}])")).text ==
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    const auto qwen3 = trainrun::text::load_chat_template(fixtures + "/qwen3");
    CHECK(!qwen3.special_tokens().contains("bos_token"));  // null in tokenizer_config.json
    CHECK(qwen3.special_tokens()["eos_token"] == "<|im_end|>");
    CHECK_THROWS_WITH_AS(trainrun::text::load_chat_template(fixtures + "/mistral"),
                         doctest::Contains("has no chat template"), std::runtime_error);
    CHECK(trainrun::text::load_chat_template(fixtures + "/mistral", "chatml").origin() == "built-in chat template chatml");
  }
  TEST_CASE("chat_template.jinja wins over tokenizer_config.json; named templates; legacy special_tokens_map") {
    const auto dir = temp_dir("loader");
    write(dir / "tokenizer_config.json",
          R"({"chat_template": [{"name": "default", "template": "D{{ bos_token }}"}, {"name": "tool_use", "template": "T"}],
              "bos_token": {"content": "<b>", "__type": "AddedToken"}, "eos_token": null})");
    write(dir / "special_tokens_map.json", R"({"bos_token": "<B>", "pad_token": "<p>"})");
    const json one = json::parse(R"([{"role": "user", "content": "x"}])");
    CHECK(trainrun::text::load_chat_template(dir).apply(one).text == "D<B>");
    CHECK(trainrun::text::load_chat_template(dir, "tool_use").apply(one).text == "T");
    CHECK(trainrun::text::load_special_tokens(dir) == json({{"bos_token", "<B>"}, {"pad_token", "<p>"}}));
    write(dir / "chat_template.jinja", "J");
    CHECK(trainrun::text::load_chat_template(dir).apply(one).text == "J");
    std::filesystem::remove_all(dir);
  }
}

TEST_SUITE("builtins") {
  TEST_CASE("every built-in compiles and renders a conversation") {
    const json tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    const json chat = json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])");
    for (const auto& name : trainrun::text::builtin_chat_template_names()) {
      CAPTURE(name);
      ChatTemplate t(trainrun::text::builtin_chat_template(name), tokens, name);
      const std::string text = t.apply(chat).text;
      CHECK(text.find("Hi") != std::string::npos);
      CHECK(text.find("Yo") != std::string::npos);
    }
    CHECK(ChatTemplate(trainrun::text::builtin_chat_template("chatml")).apply(chat, {true}).text ==
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>assistant\n");
    CHECK_THROWS_AS(trainrun::text::builtin_chat_template("vicuna"), std::invalid_argument);
  }
}

TEST_SUITE("limits") {
  // The budget of one rendering (TemplateLimits): what it counts, the error and the overrides.
  using trainrun::text::TemplateLimits;
  ChatTemplateError limit_error(const std::string& src, const TemplateLimits& limits) {
    try {
      ChatTemplate(src, json::object(), "t.jinja", limits).render(json::object());
    } catch (const ChatTemplateError& e) {
      return e;
    }
    FAIL("the template rendered within its limits: " << src);
    return ChatTemplateError("", "", 0, false);
  }

  TEST_CASE("a rendering reports its cost, and a budget of exactly that cost is enough") {
    const std::string src = "{% for x in [1, 2, 3] %}{{ x ~ '-' }}{% endfor %}";
    trainrun::text::RenderCost cost;
    const auto out = ChatTemplate(src).render(json::object(), cost);
    CHECK(out.text == "1-2-3-");
    CHECK(cost.bytes_built >= out.text.size());
    CHECK(cost.operations >= 3);  // three iterations
    TemplateLimits exact{cost.bytes_built, cost.operations};
    CHECK(ChatTemplate(src, json::object(), "t", exact).render(json::object()).text == "1-2-3-");
    CHECK(limit_error(src, {cost.bytes_built - 1, cost.operations})
              .message()
              .find("template_max_bytes") != std::string::npos);
    CHECK(limit_error(src, {cost.bytes_built, cost.operations - 1})
              .message()
              .find("template_max_operations") != std::string::npos);
  }

  TEST_CASE("the error names the template, its line, the limit and the override") {
    const auto e = limit_error(
        "{% set ns = namespace(s='ab') %}\n{% for i in range(40) %}\n"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        {1 << 20, 100000});
    CHECK(e.line() == 3);
    CHECK(std::string(e.what()).rfind(
              "t.jinja, line 3: the rendering exceeds template_max_bytes = 1048576", 0) == 0);
    CHECK(e.message().find("--template-max-bytes") != std::string::npos);
    CHECK_FALSE(e.raised());
  }

  TEST_CASE("sizes the template chooses are checked before anything is built") {
    const TemplateLimits small{1 << 20, 100000};
    for (const char* src :
         {"{{ 'a' * 1073741823 }}", "{{ [1, 2] * 536870911 }}", "{{ 'x' | center(1000000000) }}",
          "{{ 'x\ny' | indent(1000000000) }}", "{{ '%1000000000s' % 'x' }}",
          "{{ ('x' * 1000) | replace('x', 'y' * 10000) }}",
          "{{ range(1000) | join('-' * 100000) }}", "{{ [1] | batch(1000000000, 0) | list }}",
          "{% set a = [1] * 100 %}{% set b = [a] * 100 %}{{ [b] * 100 }}"})
      CHECK_MESSAGE(
          limit_error(src, small).message().find("template_max_bytes") != std::string::npos, src);
  }

  TEST_CASE("loops and calls count operations, weighted by what they scan") {
    const TemplateLimits ops{1 << 30, 10000};
    CHECK(limit_error("{% for i in range(200) %}{% for j in range(200) %}{% endfor %}{% endfor %}",
                      ops)
              .message()
              .find("template_max_operations") != std::string::npos);
    CHECK(limit_error("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% "
                      "endmacro %}{{ f(30) }}",
                      ops)
              .message()
              .find("template_max_operations") != std::string::npos);
    // 100 scans of a 1000-item list cost over 100,000: more than 10 iterations' worth each.
    CHECK(limit_error(
              "{% set l = range(1000) | list %}{% for i in range(100) %}{% if -1 in l %}{% endif %}"
              "{% endfor %}",
              ops)
              .message()
              .find("template_max_operations") != std::string::npos);
  }

  TEST_CASE("load_chat_template passes the limits on") {
    const auto dir = std::filesystem::temp_directory_path() / "trainrun_unit_template_limits";
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "chat_template.jinja")
        << "{% for m in messages %}{{ m.content * 1000 }}{% endfor %}";
    const json chat = json::array({{{"role", "user"}, {"content", "hello"}}});
    CHECK(trainrun::text::load_chat_template(dir).apply(chat).text.size() == 5000);
    const auto t = trainrun::text::load_chat_template(dir, "", {1000, 1000});
    CHECK(t.limits().max_bytes == 1000);
    CHECK_THROWS_WITH_AS(t.apply(chat),
                         doctest::Contains("chat_template.jinja, line 1: the rendering exceeds "
                                           "template_max_bytes = 1000"),
                         ChatTemplateError);
    std::filesystem::remove_all(dir);
  }
}
