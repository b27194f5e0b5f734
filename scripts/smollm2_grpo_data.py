"""Prompts with checkable answers for configs/smollm2-grpo.toml: small arithmetic questions
(a + b, a - b, a x b with one- and two-digit numbers) as one-turn conversations, each row with
its answer in "solution" (the accuracy reward's field). Generated from a fixed seed, so every
machine builds the same files; nothing is downloaded.

usage: smollm2_grpo_data.py OUT_DIR   -> OUT_DIR/train.jsonl (2,000), heldout.jsonl (100), data.json
"""
import json
import os
import random
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = random.Random(20261207)
seen = set()


def question():
    while True:
        kind = rng.choice("+-x")
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        if kind == "x":
            a, b = rng.randint(2, 12), rng.randint(2, 9)
        if kind == "-" and b > a:
            a, b = b, a
        if (a, kind, b) in seen:
            continue
        seen.add((a, kind, b))
        answer = a + b if kind == "+" else a - b if kind == "-" else a * b
        text = f"What is {a} {'*' if kind == 'x' else kind} {b}? Reply with the number only."
        return {"prompt": [{"role": "user", "content": text}], "solution": str(answer)}


rows = [question() for _ in range(2100)]
for name, part in (("heldout.jsonl", rows[:100]), ("train.jsonl", rows[100:])):
    with open(os.path.join(out, name), "w") as f:
        for r in part:
            f.write(json.dumps(r) + "\n")
with open(os.path.join(out, "data.json"), "w") as f:
    json.dump({"train": 2000, "heldout": 100, "seed": 20261207,
               "source": "generated arithmetic (a + b, a - b: 2..40; a * b: 2..12 x 2..9), no download"}, f, indent=1)
print(f"smollm2-grpo data: 2000 train + 100 held-out prompts in {out}", file=sys.stderr)
