#!/usr/bin/env python3
"""Greedy generation speed on the CPU: `trainrun generate` (KV cache, LibTorch) vs transformers'
generate(do_sample=False) (DynamicCache, eager attention, fp32), same model, prompts, new tokens
and threads, in one run. Model loading is not timed on either side; prefill and decode are
reported apart (trainrun's own per-prompt rates; transformers' prefill = a forward of the prompt,
decode = the rest of generate()'s time). Also checks that both produced the same ids.

  python bench/generate.py [--model DIR] [--trainrun BIN] [--threads 1] [--new 64] [--prompts 8]

Default model: SmolLM2-135M-Instruct converted by scripts/gguf_to_hf.py into build/cache.
Needs the reference venv (scripts/venv).
"""
import argparse
import json
import os
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
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8)
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gguf_to_hf.py"), a.model], check=True)
    prompts = PROMPTS[: a.prompts]
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, attn_implementation="eager", dtype=torch.float32).eval()
    hf = {"prefill_s": 0.0, "decode_s": 0.0, "prompt": 0, "new": 0}
    hf_ids = []
    with torch.no_grad():
        model.generate(torch.tensor([tok(prompts[0])["input_ids"]]), do_sample=False, max_new_tokens=4)  # warm-up
        for p in prompts:
            ids = torch.tensor([tok(p)["input_ids"]])
            t0 = time.perf_counter()
            model(input_ids=ids)
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=a.new)
            total = time.perf_counter() - t0
            new = g.size(1) - ids.size(1)
            hf["prefill_s"] += prefill
            hf["decode_s"] += max(total - prefill, 1e-9)
            hf["prompt"] += ids.size(1)
            hf["new"] += new
            hf_ids.append(g[0, ids.size(1):].tolist())
    with tempfile.TemporaryDirectory() as d:
        pf = os.path.join(d, "p.jsonl")
        with open(pf, "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt": p}) + "\n")
        r = subprocess.run([a.trainrun, "generate", "--model", a.model, "--prompts-file", pf, "--max-new-tokens",
                            str(a.new), "--threads", str(a.threads), "--jsonl"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    rows = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    ours = {"prefill_s": 0.0, "decode_s": 0.0, "prompt": 0, "new": 0}
    for row in rows:
        ours["prompt"] += len(row["prompt_ids"])
        ours["new"] += len(row["ids"])
        ours["prefill_s"] += len(row["prompt_ids"]) / row["prefill_tokens_per_s"]
        if row["decode_tokens_per_s"]:
            ours["decode_s"] += (len(row["ids"]) - 1) / row["decode_tokens_per_s"]
    same = [row["ids"] for row in rows] == hf_ids
    print(f"model {a.model}, {len(prompts)} prompts x {a.new} new tokens, {a.threads} thread(s), fp32, greedy; "
          f"same ids: {same}")
    for name, s in (("trainrun", ours), ("transformers", hf)):
        print(f"  {name:13s} prefill {s['prompt'] / s['prefill_s']:8.1f} tokens/s   decode "
              f"{(s['new'] - len(prompts)) / s['decode_s']:7.1f} tokens/s   end to end "
              f"{s['new'] / (s['prefill_s'] + s['decode_s']):7.1f} new tokens/s")
    print(f"  ratio trainrun / transformers: prefill {(ours['prompt'] / ours['prefill_s']) / (hf['prompt'] / hf['prefill_s']):.2f}x, "
          f"end to end {(hf['prefill_s'] + hf['decode_s']) / (ours['prefill_s'] + ours['decode_s']):.2f}x")


if __name__ == "__main__":
    main()
