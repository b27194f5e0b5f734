"""Conversation files for the chat dataset's tests, assembled from the fortune files Debian ships
(fortunes-min), deterministic for a given seed: OpenAI `messages` JSONL, ShareGPT
`conversations` JSONL and an Alpaca JSON array.

    chat_data.py OUT_DIR [--count N] [--seed S] [--tokenizer-out DIR]
writes openai.jsonl, sharegpt.jsonl, alpaca.json; with --tokenizer-out also a small byte-level BPE
tokenizer (320 ids, ChatML special tokens and template) trained on them with `tokenizers`, so
tests of training runs need no 100k-row embedding.
"""
import argparse
import json
import os
import random

FORTUNE_FILES = ["/usr/share/games/fortunes/fortunes", "/usr/share/games/fortunes/computers"]


def fortunes():
    out = []
    for path in FORTUNE_FILES:
        with open(path, encoding="utf-8", errors="replace") as f:
            out += [p.strip() for p in f.read().split("\n%\n") if p.strip()]
    return out


EXTRA = ["Grüße, 世界! 🙂 café naïve", "Привет, مرحبا, שלום 👋🏽", "tabs\tand  double  spaces",
         "quotes ' \" and \\ backslash", "   padded   ", "line1\nline2\n", "x = {\"a\": [1, 2]}"]


def conversations(count, seed):
    """`count` conversations: (kind, messages) with kind in openai / sharegpt / alpaca."""
    rng = random.Random(seed)
    texts = fortunes()
    pick = lambda: rng.choice(texts) if rng.random() > 0.15 else rng.choice(EXTRA)
    out = []
    for i in range(count):
        kind = ["openai", "openai", "sharegpt", "alpaca"][i % 4]
        msgs = []
        if rng.random() < 0.4:
            msgs.append({"role": "system", "content": "You answer briefly. " + pick()[:80]})
        turns = 1 if kind == "alpaca" else rng.choice([1, 1, 2, 3])
        for _ in range(turns):
            msgs.append({"role": "user", "content": pick()[: rng.choice([20, 60, 200, 400])]})
            msgs.append({"role": "assistant", "content": pick()[: rng.choice([10, 50, 150, 300])]})
        out.append((kind, msgs))
    return out


def write(out_dir, count, seed):
    os.makedirs(out_dir, exist_ok=True)
    files = {k: [] for k in ("openai", "sharegpt", "alpaca")}
    for kind, msgs in conversations(count, seed):
        if kind == "openai":
            files[kind].append({"messages": msgs})
        elif kind == "sharegpt":
            names = {"system": "system", "user": "human", "assistant": "gpt"}
            files[kind].append({"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in msgs]})
        else:
            rec = {"instruction": msgs[-2]["content"], "input": "", "output": msgs[-1]["content"]}
            if msgs[0]["role"] == "system":
                rec["system"] = msgs[0]["content"]
            files[kind].append(rec)
    paths = []
    for kind, recs in files.items():
        path = os.path.join(out_dir, kind + (".json" if kind == "alpaca" else ".jsonl"))
        with open(path, "w", encoding="utf-8") as f:
            if kind == "alpaca":
                json.dump(recs, f, ensure_ascii=False, indent=1)
            else:
                for r in recs:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths


def messages_of(path):
    """The conversations of a file as the chat dataset reads them (for the references)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    recs = json.loads(text) if text.lstrip().startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]
    out = []
    for r in recs:
        if "messages" in r:
            out.append(r["messages"])
        elif "conversations" in r:
            names = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                     "system": "system", "tool": "tool"}
            out.append([{"role": names[m["from"]], "content": m["value"]} for m in r["conversations"]])
        else:
            msgs = [{"role": "system", "content": r["system"]}] if r.get("system") else []
            user = r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")
            out.append(msgs + [{"role": "user", "content": user}, {"role": "assistant", "content": r["output"]}])
    return out


CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def write_tokenizer(out_dir, seed, count):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    texts = [m["content"] for _, msgs in conversations(count, seed) for m in msgs]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML}, f)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer-out")
    a = ap.parse_args()
    print("\n".join(write(a.out, a.count, a.seed)))
    if a.tokenizer_out:
        write_tokenizer(a.tokenizer_out, a.seed, a.count)
