"""The preference dataset against TRL 1.16's DPOTrainer, token for token:

* prompt_ids / chosen_ids / rejected_ids of every pair equal what DPOTrainer._prepare_dataset
  makes of the same rows (TRL's own code, called on a datasets.Dataset: extract_prompt for rows
  without a prompt, EOS appended to standard completions, _tokenize with the chat template or
  with special tokens, the common-prefix split), for standard, conversational and implicit-prompt
  rows (plus tools / chat_template_kwargs on qwen3), on the llama3, qwen3 and mistral fixtures
  and SmolLM2-135M-Instruct's tokenizer (--smollm2 DIR, when given);
* under max_length / truncation_mode (and max_prompt_length, trainrun's extension: the prompt's
  last N tokens, applied before everything else), the pairs kept equal those TRL's filter keeps,
  less the pairs the dataset drops for having no counted target after truncation (checked here to
  have none under TRL's collator), and the batch of the kept pairs equals DataCollatorForPreference's:
  target = input_ids[:, 1:] where completion_mask[:, 1:], else -100; input = input_ids[:, :-1]
  less each row's last token (the dataset's rows are ids[:-1], padded), the same pad, the same
  real-token count;
* with trainer = "cpo" and "orpo" (the dataset's option): every pair's two sequences and their
  labels equal what TRL's CPOTrainer.tokenize_row and ORPOTrainer.tokenize_row make of the rows
  after maybe_extract_prompt and maybe_apply_chat_template (each sequence split on its own, the
  BOS id before the prompt, the EOS id after each completion), rows TRL refuses refused too; under
  max_length (keep_start, CPOTrainer's completion cut) the pairs kept are those whose two
  sequences keep a counted label in TRL, and the batch equals DPODataCollatorWithPadding +
  concatenated_inputs (input = input_ids less the last token, target = labels[:, 1:]); for orpo
  rows 2B..3B-1 hold the chosen rows' prompt tokens as targets (ORPOTrainer's NLL labels less
  the completion's);
* bad rows exit 2 naming FILE:LINE and the field.

The mistral fixture goes through PreTrainedTokenizerFast on its tokenizer.json: transformers 5's
AutoTokenizer rebuilds that LlamaTokenizer with another pre-tokenizer (see chat_reference.py).

    preference_data_ref.py --dump PREFERENCE_DUMP --fixtures DIR --work DIR [--smollm2 DIR]
"""
import argparse
import json
import logging
import os
import subprocess
import sys
import types

import datasets
import jinja2
import torch
from accelerate import PartialState
from datasets import Dataset
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from trl.data_utils import maybe_apply_chat_template, maybe_extract_prompt
from trl.experimental.cpo import CPOTrainer
from trl.experimental.orpo import ORPOTrainer
from trl.experimental.utils import DPODataCollatorWithPadding
from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer

EOS = "\u0000EOS\u0000"  # replaced by the tokenizer's EOS text: a completion that already ends with it

TEXT_EXPLICIT = [
    {"prompt": "The capital of France is", "chosen": " Paris.", "rejected": " Lyon."},
    {"prompt": "Q: What is 2+2?\nA: ", "chosen": "4", "rejected": "5"},  # tokens merge across the boundary
    {"prompt": "Translate to German: good morning", "chosen": " Guten Morgen" + EOS, "rejected": " Gute Nacht"},
    {"prompt": "", "chosen": "Once upon a time", "rejected": "In a galaxy far away"},
    {"prompt": "Café crème ou thé ? ", "chosen": "Thé vert, s'il vous plaît.", "rejected": "Café ☕"},
    {"prompt": "Same answer twice:", "chosen": " yes", "rejected": " yes"},
    # Without BOS (llama3, qwen3 and SmolLM2 add none) chosen is one token that nothing predicts:
    # TRL keeps the pair, the dataset drops it (no counted target).
    {"prompt": "", "chosen": EOS, "rejected": " Something else"},
    {"prompt": "Summarize: " + "the quick brown fox jumps over the lazy dog; " * 6, "chosen": " A fox jumps.",
     "rejected": " Dogs sleep a lot, and foxes are quick and brown."},
]
TEXT_IMPLICIT = [
    {"chosen": "Q: 2+2? A: 4", "rejected": "Q: 2+2? A: 5"},  # a space before the difference
    {"chosen": "The sky is blue", "rejected": "The sky is bluish green"},
    {"chosen": "Yes", "rejected": "Yes, absolutely"},  # one is a prefix of the other
    {"chosen": "Hi there", "rejected": "Hi there"},  # equal
    {"chosen": "Réponse : é", "rejected": "Réponse : è"},  # differ inside a 2-byte character
    {"chosen": "名前は田中です。", "rejected": "名前は鈴木です。"},
    {"chosen": "Mood 😀 ok", "rejected": "Mood 😃 ok"},  # differ in the last byte of a 4-byte character
    {"chosen": "Story: it ends well" + EOS, "rejected": "Story: it ends badly"},
]
U = lambda c: {"role": "user", "content": c}
A = lambda c: {"role": "assistant", "content": c}
S = lambda c: {"role": "system", "content": c}
CONV_EXPLICIT = [
    {"prompt": [U("What color is the sky?")], "chosen": [A("It is blue.")], "rejected": [A("It is green.")]},
    {"prompt": [S("You are terse."), U("Name a prime.")], "chosen": [A("7")], "rejected": [A("8")]},
    {"prompt": [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")],
     "chosen": [A("Why did the chicken cross the road? To get to the other side.")],
     "rejected": [A("No.")]},
    {"prompt": [U("Écris « bonjour » en japonais.")], "chosen": [A("こんにちは")], "rejected": [A("さようなら")]},
    {"prompt": [U("Say yes.")], "chosen": [A("Yes.")], "rejected": [A("Yes.")]},
]
CONV_IMPLICIT = [
    {"chosen": [U("What color is the sky?"), A("It is blue.")], "rejected": [U("What color is the sky?"), A("Green.")]},
    {"chosen": [S("Be kind."), U("Hi"), A("Hello!"), U("How are you?"), A("Fine, thanks.")],
     "rejected": [S("Be kind."), U("Hi"), A("Hello!"), U("How are you?"), A("Leave me alone.")]},
    {"chosen": [U("Count to two."), A("1, 2")], "rejected": [U("Count to two."), A("1, 2"), U("More"), A("3")]},
]
CONV_CONTINUE = [  # CPO/ORPO only: maybe_apply_chat_template continues the final message
    {"prompt": [U("Finish the rhyme."), A("Roses are red,")], "chosen": [A(" violets are blue.")],
     "rejected": [A(" grass is green.")]},
]
TOOLS = json.dumps([{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
CONV_QWEN3 = [
    {"prompt": [U("Weather in Paris?")], "chosen": [A("Let me check.")], "rejected": [A("It is always sunny.")],
     "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}},
    {"prompt": [U("2+2?")], "chosen": [A("4")], "rejected": [A("5")],
     "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": True}},
]

BAD = {  # file -> (lines, expected substrings of the error)
    "malformed": (['{"prompt": "a", "chosen": "b", "rejected": "c"}', "", '{"prompt": "a", "chosen": '],
                  [":3:", "malformed JSON"]),
    "missing": (['{"prompt": "a", "chosen": "b"}'], [":1:", "rejected"]),
    "mixed": (['{"prompt": "a", "chosen": [{"role": "assistant", "content": "b"}], '
               '"rejected": [{"role": "assistant", "content": "c"}]}'], [":1:", "prompt is a string"]),
    "mixed_completion": (['{"prompt": "a", "chosen": "b", "rejected": [{"role": "assistant", "content": "c"}]}'],
                         [":1:", "rejected is a list of messages"]),
    "wrong_type": (['{"prompt": "a", "chosen": 3, "rejected": "c"}'], [":1:", "chosen must be"]),
    "no_shared_prompt": (['{"chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], '
                          '"rejected": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "b"}]}'],
                         [":1:", "share no"]),
    "empty_text": (['{"prompt": "a", "chosen": "b", "rejected": "c"}', '{"prompt": "a", "chosen": "", "rejected": "c"}'],
                   [":2:", "chosen is empty"]),
    "empty_messages": (['{"prompt": [{"role": "user", "content": "a"}], "chosen": [], '
                        '"rejected": [{"role": "assistant", "content": "c"}]}'], [":1:", "chosen is an empty list"]),
    "bad_message": (['{"prompt": [{"content": "a"}], "chosen": [{"role": "assistant", "content": "b"}], '
                     '"rejected": [{"role": "assistant", "content": "c"}]}'], [":1:", "role", "prompt[0]"]),
    "not_object": (["[1, 2]"], [":1:", "JSON object"]),
}


def write_jsonl(path, rows, eos):
    with open(path, "w", encoding="utf-8") as f:
        for i, r in enumerate(rows):
            r = json.loads(json.dumps(r).replace(json.dumps(EOS)[1:-1], json.dumps(eos)[1:-1]))
            r["row"] = i  # an extra column: the dataset ignores it, TRL carries it through
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def trl_prepare(tok, path, max_length, truncation_mode):
    rows = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
    fake = types.SimpleNamespace(_tokenizer=tok)
    args = types.SimpleNamespace(dataset_num_proc=None, max_length=max_length, truncation_mode=truncation_mode)
    ds = DPOTrainer._prepare_dataset(fake, Dataset.from_list(rows), tok, args, "train")
    return {r["row"]: r for r in ds}


def run_dump(dump, tok_dir, files, *extra):
    cmd = [dump, "--tokenizer", tok_dir, *map(str, extra), *files]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr}")
    out = [json.loads(l) for l in p.stdout.splitlines()]
    batch = out.pop()["batch"] if out and "batch" in out[-1] else None
    return out, batch


def collate_reference(records, pad, max_length, truncation_mode):
    coll = DataCollatorForPreference(pad_token_id=pad, max_length=max_length or None, truncation_mode=truncation_mode)
    b = coll([{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in records])
    ids, cm, am = b["input_ids"], b["completion_mask"], b["attention_mask"]
    target = torch.where(cm[:, 1:] == 1, ids[:, 1:], torch.full_like(ids[:, 1:], -100))
    # The dataset's rows are each sequence but its last token (ids[:-1], as the chat dataset's), so
    # where TRL's input_ids[:, :-1] still holds a shorter row's last token, the dataset has padding.
    # That position predicts nothing in either (its target is padding) and, causal, no counted
    # position sees it: the log-probabilities are the same.
    inp = ids[:, :-1].clone()
    for row, n in enumerate(am.sum(dim=1).tolist()):
        if 0 < n <= inp.size(1):
            inp[row, n - 1] = pad
    return inp.tolist(), target.tolist(), int(am[:, 1:].sum()), cm


def trl_cpo_rows(tok, path, max_length, trainer):
    """CPOTrainer's (trainer "cpo") or ORPOTrainer's ("orpo") tokenize_row of every row of `path`,
    after maybe_extract_prompt and maybe_apply_chat_template as their __init__ maps the dataset:
    {row: batch dict, or the exception TRL raised}."""
    cls = CPOTrainer if trainer == "cpo" else ORPOTrainer
    PartialState()  # tokenize_row warns through accelerate's logger, which needs the state
    fake = types.SimpleNamespace(processing_class=tok, is_encoder_decoder=False,
                                 max_length=max_length or 10**9)
    fake.build_tokenized_answer = lambda prompt, answer: cls.build_tokenized_answer(fake, prompt, answer)
    out = {}
    for line in open(path, encoding="utf-8"):
        if not line.strip():
            continue
        row = json.loads(line)
        try:
            ex = maybe_apply_chat_template(maybe_extract_prompt(row), tok)
            out[row["row"]] = cls.tokenize_row(fake, ex)
        except (ValueError, jinja2.TemplateError) as e:  # a row TRL refuses
            out[row["row"]] = e
    return out


def cpo_collate_reference(records, pad, orpo):
    """The kept records through CPOTrainer's collator and concatenated_inputs, as the dataset's
    rows: input = input_ids[:, :-1] (a row's last real token padded, as in collate_reference),
    target = labels[:, 1:]; with orpo the chosen rows again, their targets the prompt tokens of
    ORPOTrainer's NLL labels (attention_mask == 1, labels == -100), but the first."""
    feats = [{k: r[k] for k in ("chosen_input_ids", "chosen_attention_mask", "chosen_labels",
                                "rejected_input_ids", "rejected_attention_mask", "rejected_labels")}
             for r in records]
    batch = DPODataCollatorWithPadding(pad_token_id=pad)(feats)
    cat = CPOTrainer.concatenated_inputs(batch, padding_value=pad)
    ids, labels, am = cat["concatenated_input_ids"], cat["concatenated_labels"], cat["concatenated_attention_mask"]
    target = labels[:, 1:]
    inp = ids[:, :-1].clone()
    for row, n in enumerate(am.sum(dim=1).tolist()):
        if 0 < n <= inp.size(1):
            inp[row, n - 1] = pad
    if orpo:
        B = len(records)
        prompt = (am[:B, 1:] == 1) & (labels[:B, 1:] == -100)
        target = torch.cat([target, torch.where(prompt, ids[:B, 1:], torch.full_like(ids[:B, 1:], -100))])
        inp = torch.cat([inp, inp[:B]])
    return inp.tolist(), target.tolist(), int(am[:, 1:].sum())


def check_cpo(a, name, tdir, tok, files, fail):
    """Section 4 of the docstring for one tokenizer; returns the number of pairs compared."""
    compared = 0
    if tok.pad_token is None:  # what CPOTrainer and ORPOTrainer do
        tok.pad_token = tok.eos_token
    pad = tok.pad_token_id
    files = dict(files)
    if tok.chat_template:  # a prompt ending with the assistant's message: continued, not prompted
        files["conv_continue"] = os.path.join(a.work, f"{name}-conv_continue.jsonl")
        write_jsonl(files["conv_continue"], CONV_CONTINUE, tok.eos_token)
    order = list(files)
    # orpo tokenizes as cpo (TRL's two tokenize_row are the same code) and lays out 3B rows.
    for trainer, lengths in (("cpo", (0, 8, 2)), ("orpo", (0, 16))):
        for max_length in lengths:
            label = f"{name} trainer={trainer} max_length={max_length}"
            ref = {s: trl_cpo_rows(tok, files[s], max_length, trainer) for s in order}
            out, batch = run_dump(a.dump, tdir, [files[s] for s in order], "--trainer", trainer,
                                  "--max-length", max_length, "--batch")
            records = [ref[s][i] for s in order for i in sorted(ref[s])]
            if len(out) != len(records):
                fail(f"{label}: {len(out)} pairs, TRL {len(records)}")
                continue
            kept, refused = [], 0
            for o, r in zip(out, records):
                if isinstance(r, Exception) or "error" in o:
                    if not (isinstance(r, Exception) and "error" in o):
                        fail(f"{label} {o['where']}: trainrun {o.get('error', 'tokenizes it')}; TRL "
                             f"{r if isinstance(r, Exception) else 'tokenizes it'}")
                    refused += 1
                    continue
                seqs = {"chosen": o["prompt_ids"], "rejected": o.get("rejected_prompt_ids", o["prompt_ids"])}
                if max_length == 0:
                    for k, prompt in seqs.items():
                        ids = prompt + o[f"{k}_ids"]
                        labels = [-100] * len(prompt) + o[f"{k}_ids"]
                        if ids != r[f"{k}_input_ids"] or labels != r[f"{k}_labels"]:
                            fail(f"{label} {o['where']} {k}: {ids} / {labels} vs TRL {r[f'{k}_input_ids']} / "
                                 f"{r[f'{k}_labels']}")
                    compared += 1
                trl_trains = all(any(x != -100 for x in r[f"{k}_labels"][1:]) for k in seqs)
                if (o["verdict"] == "keep") != trl_trains:
                    fail(f"{label} {o['where']}: verdict {o['verdict']}, TRL counts labels in both: {trl_trains}")
                elif o["verdict"] == "keep":
                    kept.append(r)
            summary = f"{label}: {len(kept)} pairs kept, {refused} refused; batch {batch['rows']}x{batch['width']}"
            if kept:
                inp, tgt, ntok = cpo_collate_reference(kept, pad, trainer == "orpo")
                for what, mine, theirs in (("input", batch["input"], inp), ("target", batch["target"], tgt)):
                    if mine != theirs:
                        bad_rows = [i for i in range(min(len(mine), len(theirs))) if mine[i] != theirs[i]]
                        i = bad_rows[0] if bad_rows else 0
                        fail(f"{label}: batch {what} differs from TRL's in rows {bad_rows[:8]} (of {len(mine)} / "
                             f"{len(theirs)}), e.g. row {i}: {mine[i] if mine else None} vs "
                             f"{theirs[i] if theirs else None}")
                if batch["num_tokens"] != ntok:
                    fail(f"{label}: num_tokens {batch['num_tokens']} vs {ntok}")
            print(summary)
    return compared


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--smollm2")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    datasets.disable_progress_bars()
    logging.getLogger("trl").setLevel(logging.ERROR)  # its once-per-run prefix warning, expected here
    failures = 0

    def fail(msg):
        nonlocal failures
        failures += 1
        print("FAIL", msg)

    toks = {"llama3": os.path.join(a.fixtures, "llama3"), "qwen3": os.path.join(a.fixtures, "qwen3"),
            "mistral": os.path.join(a.fixtures, "mistral")}
    if a.smollm2:
        toks["smollm2"] = a.smollm2
    compared = 0
    for name, tdir in toks.items():
        if name == "mistral":
            raw = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
            tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
        else:
            tok = AutoTokenizer.from_pretrained(tdir)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        sets = {"text_explicit": TEXT_EXPLICIT, "text_implicit": TEXT_IMPLICIT}
        if tok.chat_template:
            sets.update(conv_explicit=CONV_EXPLICIT, conv_implicit=CONV_IMPLICIT)
        if name == "qwen3":
            sets["conv_tools"] = CONV_QWEN3
        files = {}
        for set_name, rows in sets.items():
            files[set_name] = os.path.join(a.work, f"{name}-{set_name}.jsonl")
            write_jsonl(files[set_name], rows, tok.eos_token)

        # 1. Tokenization, no truncation.
        full = {s: trl_prepare(tok, f, None, "keep_start") for s, f in files.items()}
        for set_name, f in files.items():
            out, _ = run_dump(a.dump, tdir, [f])
            ref = full[set_name]
            if len(out) != len(ref):
                fail(f"{name} {set_name}: {len(out)} pairs, TRL {len(ref)}")
                continue
            for i, o in enumerate(out):
                if "error" in o:
                    fail(f"{name} {o['where']}: {o['error']}")
                    continue
                for k in ("prompt_ids", "chosen_ids", "rejected_ids"):
                    if o[k] != ref[i][k]:
                        fail(f"{name} {o['where']} {k}: {o[k]} vs TRL {ref[i][k]}")
                compared += 1

        # 2. Truncation, the drop rule and the batch layout.
        settings = [(0, "keep_start", 0), (8, "keep_start", 0), (8, "keep_end", 0), (16, "keep_start", 0),
                    (24, "keep_end", 0), (3, "keep_end", 0), (1, "keep_end", 0), (2, "keep_start", 0),
                    (12, "keep_start", 4), (0, "keep_start", 5), (20, "keep_end", 6)]
        for max_length, mode, max_prompt in settings:
            label = f"{name} max_length={max_length} {mode} max_prompt_length={max_prompt}"
            order = list(files)
            out, batch = run_dump(a.dump, tdir, [files[s] for s in order], "--max-length", max_length,
                                  "--truncation-mode", mode, "--max-prompt-length", max_prompt, "--batch")
            # TRL's records, in the dump's order; max_prompt_length applied as documented, then TRL's filter.
            records = []
            for s in order:
                for i in sorted(full[s]):
                    r = dict(full[s][i])
                    if max_prompt:
                        r["prompt_ids"] = r["prompt_ids"][-max_prompt:]
                    records.append(r)
            if max_prompt == 0 and max_length:  # TRL's own filter, through _prepare_dataset
                trl_kept = []
                for s in order:
                    survivors = trl_prepare(tok, files[s], max_length, mode)
                    trl_kept += [i in survivors for i in sorted(full[s])]
            else:
                trl_kept = [not (max_length and mode == "keep_start" and len(r["prompt_ids"]) >= max_length)
                            for r in records]
            ours = [o["verdict"] for o in out]
            kept = []
            for r, o, tk in zip(records, out, trl_kept):
                if o["prompt_ids"] != r["prompt_ids"]:
                    fail(f"{label} {o['where']}: prompt_ids {o['prompt_ids']} vs {r['prompt_ids']}")
                if (o["verdict"] != "prompt_fills_max_length") != tk:
                    fail(f"{label} {o['where']}: verdict {o['verdict']}, TRL keeps it: {tk}")
                elif o["verdict"] == "no_counted_target":
                    # TRL keeps it; its collator must indeed leave chosen or rejected with no target.
                    cm = collate_reference([r], pad, max_length, mode)[3]
                    if int(cm[0, 1:].sum()) > 0 and int(cm[1, 1:].sum()) > 0:
                        fail(f"{label} {o['where']}: dropped for no counted target, but TRL counts some")
                elif o["verdict"] == "keep":
                    kept.append(r)
            summary = (f"{label}: {len(kept)} pairs kept, {ours.count('prompt_fills_max_length')} prompt fills "
                       f"max_length, {ours.count('no_counted_target')} no counted target; "
                       f"batch {batch['rows']}x{batch['width']}")
            if not kept:
                if batch["rows"] != 0:
                    fail(f"{label}: {batch['rows']} rows for no kept pair")
                print(summary)
                continue
            inp, tgt, ntok, _ = collate_reference(kept, pad, max_length, mode)
            for what, mine, ref in (("input", batch["input"], inp), ("target", batch["target"], tgt)):
                if mine != ref:
                    bad_rows = [r for r in range(min(len(mine), len(ref))) if mine[r] != ref[r]]
                    r = bad_rows[0] if bad_rows else 0
                    fail(f"{label}: batch {what} differs from TRL's collator in rows {bad_rows[:8]} "
                         f"(of {len(mine)} / {len(ref)}), e.g. row {r}: {mine[r] if mine else None} vs "
                         f"{ref[r] if ref else None}")
            if batch["num_tokens"] != ntok:
                fail(f"{label}: num_tokens {batch['num_tokens']} vs {ntok}")
            print(summary)

        # 4. CPOTrainer's and ORPOTrainer's tokenization (trainer = "cpo" / "orpo").
        compared += check_cpo(a, name, tdir, tok, files, fail)

    # 3. Bad rows: exit 2 naming FILE:LINE and the field.
    for bad_name, (lines, expect) in BAD.items():
        path = os.path.join(a.work, f"bad-{bad_name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        p = subprocess.run([a.dump, "--tokenizer", toks["qwen3"], path], capture_output=True, text=True)
        msg = p.stderr.strip()
        if p.returncode != 2 or any(e not in msg for e in expect) or path not in msg:
            fail(f"bad input {bad_name}: exit {p.returncode}, {msg!r}; expected exit 2 naming {path} and {expect}")
        else:
            print(f"bad input {bad_name}: {msg}")

    print(f"{compared} pairs compared with TRL over {len(toks)} tokenizers; {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
