"""The chat dataset's samples against transformers (issue 22, done-when 2 and 3b/3c):

* token ids of every rendered conversation equal apply_chat_template(..., tokenize=True);
* the targets counted in the loss equal a reference built on apply_chat_template: for a template
  with {% generation %} blocks transformers' return_assistant_tokens_mask itself; otherwise the
  same prefix construction the dataset documents (prompt prefix with add_generation_prompt, the
  content's end found with a marker character, the turn closed by the first special token),
  computed here from transformers' renderings and tokenizations;
* the marker construction on plain ChatML equals return_assistant_tokens_mask on the same
  template written with {% generation %} (an independent check of the construction);
* no conversation starts with BOS twice; under train_on = "assistant" every counted span ends
  with a special token (end-of-turn / EOS), and every EOS that closes an assistant turn counts.

* SmolLM2-135M-Instruct's tokenizer and template (--smollm2 DIR, the converted model directory;
  --gguf-to-hf SCRIPT makes it when missing), and the same template written with {% generation %}:
  both count the same targets.

The reference ids are transformers' apply_chat_template(..., tokenize=True), except for the
mistral fixture: transformers 5 loads that LlamaTokenizer with a Metaspace pre-tokenizer instead
of the file's normalizer, and there the reference is `tokenizers`' encoding of transformers'
rendering (trainrun follows `tokenizers`; docs/tokenizers-and-data.md).

    chat_reference.py --dump CHAT_DUMP --fixtures DIR --work DIR [--smollm2 DIR [--gguf-to-hf SCRIPT]]
"""
import argparse
import copy
import json
import os
import subprocess
import sys

from tokenizers import Tokenizer
from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_data  # noqa: E402

MARK = "\ue000"
CHATML_GENERATION = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}{% else %}{{ m['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# SmolLM2-135M-Instruct's template (its default system turn) with the assistant turns marked.
SMOLLM2_GENERATION = (
    "{% for m in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def ids_of(r):
    return list(r["input_ids"]) if not isinstance(r, list) else r


def lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def reference_counted(tok, enc, source, msgs, ids, mode, special):
    render = lambda m, gen: tok.apply_chat_template(m, chat_template=source, tokenize=False, add_generation_prompt=gen)
    full = render(msgs, False)

    def token_at(c):
        if c == 0:
            return 0
        if c >= len(full):
            return len(ids)
        return lcp(enc(full[:c]), ids)

    counted = [0] * len(ids)
    if mode == "all":
        return [0] + [1] * (len(ids) - 1)
    assistant = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if mode == "last":
        assistant = assistant[-1:]
    for k, i in enumerate(assistant):
        prompt = render(msgs[:i], True) if i else ""
        assert full.startswith(prompt), "prompt prefix"
        marked = copy.deepcopy(msgs)
        c = marked[i]["content"]
        keep = len(c.rstrip(" \t\n\r\f\v"))
        marked[i]["content"] = c[:keep] + MARK + c[keep:]
        wm = render(marked, False)
        at = wm.index(MARK)
        assert wm.replace(MARK, "", 1) == full, "marker"
        start, content_end = token_at(len(prompt)), token_at(at)
        limit = token_at(len(render(msgs[:assistant[k + 1]], True))) if k + 1 < len(assistant) else len(ids)
        end = content_end
        for j in range(content_end, limit):
            if ids[j] in special:
                end = j + 1
                break
        for j in range(max(start, 1), min(end, len(ids))):
            counted[j] = 1
    return counted


def run_dump(dump, tok_dir, template, mode, files):
    cmd = [dump, "--tokenizer", tok_dir, "--train-on", mode] + (["--template", template] if template else []) + files
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
    head = json.loads(out[0])
    return head, [json.loads(l) for l in out[1:]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--smollm2")
    ap.add_argument("--gguf-to-hf")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    if a.smollm2 and a.gguf_to_hf and not os.path.isfile(os.path.join(a.smollm2, "tokenizer.json")):
        subprocess.run([sys.executable, a.gguf_to_hf, a.smollm2], check=True)
    files = chat_data.write(os.path.join(a.work, "data"), 40, 7)
    convs = [m for f in files for m in chat_data.messages_of(f)]
    gen_template = os.path.join(a.work, "chatml_generation.jinja")
    with open(gen_template, "w", encoding="utf-8") as f:
        f.write(CHATML_GENERATION)
    smol_gen_template = os.path.join(a.work, "smollm2_generation.jinja")
    with open(smol_gen_template, "w", encoding="utf-8") as f:
        f.write(SMOLLM2_GENERATION)
    fx = lambda n: a.smollm2 if n == "smollm2" else os.path.join(a.fixtures, n)
    cases = [("llama3", "", "assistant"), ("qwen3", "", "assistant"), ("qwen3", "", "last"),
             ("mistral", "mistral", "assistant"), ("mistral", "llama2", "assistant"), ("mistral", "alpaca", "last"),
             ("llama3", "llama3", "assistant"), ("qwen3", "chatml", "assistant"), ("llama3", "chatml", "all"),
             ("qwen3", gen_template, "assistant")]
    if a.smollm2:
        cases += [("smollm2", "", "assistant"), ("smollm2", "", "last"), ("smollm2", smol_gen_template, "assistant")]
    failures = 0
    stats = []
    toks = {}
    dumps = {}
    for tname, template, mode in cases:
        tok = toks.setdefault(tname, AutoTokenizer.from_pretrained(fx(tname)))
        special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
        if tname == "mistral":
            raw = Tokenizer.from_file(os.path.join(fx(tname), "tokenizer.json"))
            enc = lambda t, raw=raw: raw.encode(t, add_special_tokens=False).ids
        else:
            enc = lambda t, tok=tok: tok(t, add_special_tokens=False)["input_ids"]
        head, samples = run_dump(a.dump, fx(tname), template, mode, files)
        source = head["template"] if template else None
        label = f"{tname} template={template or 'own'} train_on={mode}"
        assert len(samples) == len(convs), f"{label}: {len(samples)} samples for {len(convs)} conversations"
        n_ids = n_counted = n_turns = 0
        for msgs, s in zip(convs, samples):
            if "error" in s:
                failures += 1
                print(f"FAIL {label} {s['where']}: {s['error']}")
                continue
            if tname == "mistral":
                # transformers 5 rebuilds this LlamaTokenizer with a Metaspace pre-tokenizer
                # (prepend_scheme "always") instead of the file's Prepend/Replace normalizer, so
                # its ids differ from tokenizers' (which trainrun follows, tokenizer_reference):
                # the reference is tokenizers' encoding of transformers' rendering.
                text = tok.apply_chat_template(copy.deepcopy(msgs), chat_template=source, tokenize=False)
                ref_ids = enc(text)
            else:
                ref_ids = ids_of(tok.apply_chat_template(copy.deepcopy(msgs), chat_template=source, tokenize=True))
            if s["ids"] != ref_ids:
                failures += 1
                j = lcp(s["ids"], ref_ids)
                print(f"FAIL {label} {s['where']}: ids differ at {j}: {s['ids'][j:j + 5]} vs {ref_ids[j:j + 5]}")
                continue
            ids, counted = s["ids"], s["counted"]
            if template in (gen_template, smol_gen_template):
                r = tok.apply_chat_template(copy.deepcopy(msgs), chat_template=source, tokenize=True,
                                            return_dict=True, return_assistant_tokens_mask=True)
                ref = [0] + list(r["assistant_masks"])[1:]
            else:
                ref = reference_counted(tok, enc, source, copy.deepcopy(msgs), ids, mode, special)
            if counted != ref:
                failures += 1
                diff = [j for j in range(len(ids)) if counted[j] != ref[j]]
                print(f"FAIL {label} {s['where']}: counted targets differ at tokens {diff[:10]}")
                continue
            # (c) no doubled BOS; EOS / end-of-turn never masked under train_on = assistant
            bos = tok.bos_token_id
            if bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
                failures += 1
                print(f"FAIL {label} {s['where']}: BOS twice")
            turns = sum(m["role"] == "assistant" for m in msgs)
            if mode == "assistant":
                runs = [j for j in range(len(ids)) if counted[j] and (j + 1 == len(ids) or not counted[j + 1])]
                if any(ids[j] not in special for j in runs):
                    failures += 1
                    print(f"FAIL {label} {s['where']}: a counted span does not end with a special token")
                eos = tok.eos_token_id
                eos_counted = sum(1 for j in range(len(ids)) if ids[j] == eos and counted[j])
                eos_total = sum(1 for j in range(len(ids)) if ids[j] == eos)
                if eos_total >= turns and eos_counted != turns:
                    failures += 1
                    print(f"FAIL {label} {s['where']}: {eos_counted} EOS counted for {turns} assistant turns")
            n_ids += len(ids)
            n_counted += sum(counted)
            n_turns += turns
        # A sample whose ids equal the reference but whose checks cannot fail would be no test:
        # the modes must count different amounts.
        stats.append((label, n_ids, n_counted))
        dumps[label] = [(x.get("ids"), x.get("counted")) for x in samples]
        print(f"{label}: {len(samples)} conversations, {n_ids} tokens, {n_counted} counted targets, {n_turns} assistant turns")
    by_label = {l: c for l, _, c in stats}
    assert by_label["qwen3 template=own train_on=last"] < by_label["qwen3 template=own train_on=assistant"]
    chatml = by_label["qwen3 template=chatml train_on=assistant"]
    generation = by_label[f"qwen3 template={gen_template} train_on=assistant"]
    print(f"chatml marker construction: {chatml} counted; {{% generation %}} mask: {generation} counted")
    if chatml != generation:
        failures += 1
        print("FAIL the marker construction on ChatML and return_assistant_tokens_mask count differently (or give other ids)")
    if a.smollm2:
        own = by_label["smollm2 template=own train_on=assistant"]
        marked = by_label[f"smollm2 template={smol_gen_template} train_on=assistant"]
        print(f"smollm2: own template {own} counted; {{% generation %}} version: {marked} counted")
        same = dumps["smollm2 template=own train_on=assistant"] == dumps[f"smollm2 template={smol_gen_template} train_on=assistant"]
        if own != marked or not same:
            failures += 1
            print("FAIL SmolLM2's template and its {% generation %} version count differently (or give other ids)")
    print(f"{len(cases)} cases x {len(convs)} conversations: {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
