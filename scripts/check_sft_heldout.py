#!/usr/bin/env python3
"""The held-out loss of a `chat`-dataset LoRA job, recomputed with transformers + PEFT: the same
held-out conversations (the dataset's split: a Fisher-Yates permutation from std::mt19937_64
seeded with split_seed, after overlong/empty conversations are left out), the same tokens
(apply_chat_template(..., tokenize=True)) and the same counted targets (train_on = "assistant":
the assistant contents' tokens and the end-of-turn token after each, found from the tokenizer's
offsets), each conversation unpacked. Prints the loss of the base model ("before") and of the
base + the run's adapter ("after"), and compares them with trainrun's figures.

  python scripts/check_sft_heldout.py JOB.toml RUN_DIR [--set key=value]... [--before-run DIR]
      [--tolerance 1e-4] [--json OUT] [--list-heldout N]

RUN_DIR holds the adapter (adapter/) and metrics.jsonl with the final held-out loss; the model is
<RUN_DIR>/hf when it exists, else the job's model.path. --before-run names the run_dir of the
same job run for one step at lr 0 (its held-out loss is the base model's). --set overrides job
keys as trainrun's --set does (data.* and model.path). Exits 1 when trainrun and PEFT differ by
more than the tolerance (relative), 2 on bad input. Needs the reference venv (scripts/venv)."""
import argparse
import json
import math
import os
import sys
import tomllib

MASK64 = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64 (the C++ standard's parameters), for the dataset's held-out choice."""

    def __init__(self, seed):
        self.mt = [seed & MASK64]
        for i in range(1, 312):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64)
        self.index = 312

    def __call__(self):
        if self.index >= 312:
            mt = self.mt
            for i in range(312):
                x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
                mt[i] = mt[(i + 156) % 312] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
            self.index = 0
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK64


def heldout_indices(n, fraction, seed):
    perm = list(range(n))
    rng = MT19937_64(seed)
    for i in range(n - 1, 0, -1):
        j = rng() % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return sorted(perm[:int(fraction * n)])


def jsonl_rows(patterns, prog):
    """(path, line number, row) of each non-blank line of the JSONL files that the glob patterns
    name, pattern by pattern, each pattern's files in sorted order (as the data plugins read
    paths). Exits with "PROG: PATTERN: no such file" for a pattern that names no file."""
    import glob
    for pattern in patterns:
        files = sorted(glob.glob(pattern))
        if not files:
            sys.exit(f"{prog}: {pattern}: no such file")
        for path in files:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        yield path, n, json.loads(line)


def read_conversations(paths):
    return [row["messages"] for _, _, row in jsonl_rows(paths, "check_sft_heldout")]


def sample(tok, msgs):
    """(ids, counted) as the chat dataset makes them under train_on = "assistant"."""
    text = tok.apply_chat_template(msgs, tokenize=False)
    ids = tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"]
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    if enc["input_ids"] != ids:
        sys.exit("check_sft_heldout: the template's text does not tokenize to apply_chat_template's ids")
    offsets = enc["offset_mapping"]
    special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
    counted = [0] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        start = len(tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True))
        content = m["content"].rstrip()
        if text[start:start + len(content)] != content:
            sys.exit(f"check_sft_heldout: assistant turn {i} is not where its prefix ends")
        end = start + len(content)
        last = -1
        for k, (b, e) in enumerate(offsets):
            if b < end and e > start:
                counted[k] = 1
                last = k
            elif b >= end and ids[k] in special:
                counted[k] = 1  # the end-of-turn token: EOS is never masked away
                break
        if last < 0 and content:
            sys.exit(f"check_sft_heldout: no token of assistant turn {i}")
    return ids, counted


def heldout_loss(model, samples, torch, what):
    total, count = 0.0, 0
    with torch.no_grad():
        for k, (ids, counted) in enumerate(samples):
            if k % 50 == 0:
                print(f"  {what}: conversation {k} of {len(samples)}", file=sys.stderr, flush=True)
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
            targets = torch.tensor(ids[1:])
            keep = torch.tensor(counted[1:], dtype=torch.bool)
            nll = torch.nn.functional.cross_entropy(logits[keep], targets[keep], reduction="sum")
            total += nll.item()
            count += int(keep.sum())
    return total / count, count


def final_eval_loss(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    last = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if "eval_loss" in r:
                last = r
    if last is None:
        sys.exit(f"check_sft_heldout: {path} has no evaluation record")
    return float(last["eval_loss"]), int(last["eval_targets"])


def set_key(job, assignment):
    key, _, value = assignment.partition("=")
    *path, last = key.split(".")
    node = job
    for p in path:
        node = node.setdefault(p, {})
    try:
        node[last] = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        node[last] = value


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("job")
    ap.add_argument("run_dir")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--before-run")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--json")
    ap.add_argument("--list-heldout", type=int, default=0, help="print the first N held-out user turns")
    a = ap.parse_args()
    with open(a.job, "rb") as f:
        job = tomllib.load(f)
    for s in a.set:
        set_key(job, s)
    data = job["data"]
    if data.get("train_on", "assistant") != "assistant" or data.get("overlong", "drop") != "drop":
        sys.exit("check_sft_heldout: only train_on = \"assistant\" and overlong = \"drop\" are reproduced")

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(data["tokenizer"])
    max_len = data.get("max_seq_len", 2048)
    samples = []
    for msgs in read_conversations(data["paths"]):
        ids, counted = sample(tok, msgs)
        if len(ids) - 1 > max_len or len(ids) < 2 or not any(counted[1:]):
            continue
        samples.append((ids, counted, msgs))
    held = heldout_indices(len(samples), data.get("validation_fraction", 0.0), data.get("split_seed", 0))
    print(f"{len(samples)} conversations kept: {len(samples) - len(held)} train / {len(held)} held out")
    if a.list_heldout:
        for i in held[:a.list_heldout]:
            print("  held out:", json.dumps(samples[i][2][0]["content"]))
    evaluated = [samples[i][:2] for i in held]

    hf = os.path.join(a.run_dir, "hf")
    base_dir = hf if os.path.isfile(os.path.join(hf, "config.json")) else job["model"]["path"]
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager").eval()
    before, count = heldout_loss(model, evaluated, torch, "base model")
    peft = PeftModel.from_pretrained(model, os.path.join(a.run_dir, "adapter")).eval()
    after, _ = heldout_loss(peft, evaluated, torch, "base + adapter")
    ours_after, targets = final_eval_loss(a.run_dir)
    ours_before = final_eval_loss(a.before_run)[0] if a.before_run else None
    rel = lambda x, y: abs(x - y) / abs(y)
    print(f"held-out: {len(evaluated)} conversations, {count} counted targets (trainrun's evaluation: "
          f"{targets}); model {base_dir}")
    if ours_before is not None:
        print(f"before (base model): trainrun {ours_before:.6f}  transformers {before:.6f}  "
              f"relative difference {rel(ours_before, before):.2e}")
    else:
        print(f"before (base model): transformers {before:.6f}")
    print(f"after (base + adapter): trainrun {ours_after:.6f}  transformers+PEFT {after:.6f}  "
          f"relative difference {rel(ours_after, after):.2e}")
    print(f"held-out loss {before:.4f} -> {after:.4f} ({100 * (before - after) / before:.1f}% lower)")
    result = {"trainrun_targets": targets, "conversations": len(samples), "heldout": len(evaluated), "counted": count,
              "before_transformers": before, "after_peft": after, "after_trainrun": ours_after,
              "before_trainrun": ours_before}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    bad = targets != count or rel(ours_after, after) > a.tolerance or (ours_before is not None and rel(ours_before, before) > a.tolerance)
    if bad or not math.isfinite(after):
        print(f"FAIL: trainrun and transformers differ by more than {a.tolerance} (relative)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
