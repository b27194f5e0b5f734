#!/usr/bin/env python3
"""Batched generation speed on the CPU: `trainrun generate` (KV cache, LibTorch, left-padded
batches) vs transformers' generate (DynamicCache, eager attention, fp32) on the same model,
prompts, batch, new tokens and threads (torch.set_num_threads = --threads), in one run. Model
loading is not timed on either side: trainrun's time is its own prefill + decode (its summary
line), transformers' the generate() call. Greedy by default (then both must give the same ids);
--temperature T samples (with --top-k/--top-p) on both sides, and the ids are not compared.
Every row generates all --new tokens (min_new_tokens = --new on both sides: EOS suppressed) so both
decode the same work.

  python bench/generate.py [--model DIR] [--trainrun BIN] [--threads 1] [--new 128] [--batch 8]

Default model: SmolLM2-135M-Instruct converted by scripts/gguf_to_hf.py into build/cache.
Needs the reference venv (scripts/venv).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "Once upon a time, in a small village by the sea,",
    "The derivative of x squared is",
    "Translate to German: Good morning, how are you?",
    "Water boils at 100 degrees Celsius at sea level because",
    "1, 1, 2, 3, 5, 8, 13,",
    "The three primary colors are",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "cache", "smollm2-135m-instruct"))
    ap.add_argument("--trainrun", default=os.path.join(ROOT, "build", "bin", "trainrun"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gguf_to_hf.py"), a.model], check=True)
    prompts = (PROMPTS * (a.batch // len(PROMPTS) + 1))[: a.batch]
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model, padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(a.model, attn_implementation="eager", dtype=torch.float32).eval()
    enc = tok(prompts, return_tensors="pt", padding=True)
    sample = dict(do_sample=True, temperature=a.temperature, top_k=a.top_k or None, top_p=a.top_p) \
        if a.temperature > 0 else dict(do_sample=False)
    # No EOS on either side: every row decodes --new tokens.
    common = dict(max_new_tokens=a.new, min_new_tokens=a.new, pad_token_id=tok.pad_token_id, **sample)
    with torch.no_grad():
        model.generate(**enc, **dict(common, max_new_tokens=4, min_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        g = model.generate(**enc, **common)
        hf_s = time.perf_counter() - t0
    hf_ids = g[:, enc["input_ids"].size(1):].tolist()
    with tempfile.TemporaryDirectory() as d:
        pf = os.path.join(d, "p.jsonl")
        with open(pf, "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt": p}) + "\n")
        cmd = [a.trainrun, "generate", "--model", a.model, "--min-new-tokens", str(a.new), "--prompts-file", pf, "--max-new-tokens", str(a.new),
               "--threads", str(a.threads), "--batch-size", str(a.batch), "--jsonl", "--temperature",
               str(a.temperature), "--top-k", str(a.top_k), "--top-p", str(a.top_p)]
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    rows = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    m = re.search(r"prefill ([0-9.e+-]+) s; (\d+) new tokens, decode ([0-9.e+-]+) s", r.stderr)
    ours_s = float(m.group(1)) + float(m.group(3))
    new = int(m.group(2))
    hf_new = sum(len(x) for x in hf_ids)
    same = "n/a (sampled)" if a.temperature > 0 else [row["ids"] for row in rows] == hf_ids
    print(f"model {a.model}, batch {a.batch} x {a.new} new tokens, {a.threads} thread(s), fp32, "
          f"{'T ' + str(a.temperature) if a.temperature > 0 else 'greedy'}; same ids: {same}")
    print(f"  trainrun      {new / ours_s:8.1f} new tokens/s ({new} tokens in {ours_s:.2f} s, prefill "
          f"{float(m.group(1)):.2f} s)")
    print(f"  transformers  {hf_new / hf_s:8.1f} new tokens/s ({hf_new} tokens in {hf_s:.2f} s)")
    print(f"  ratio trainrun / transformers: {(new / ours_s) / (hf_new / hf_s):.2f}x")


if __name__ == "__main__":
    main()
