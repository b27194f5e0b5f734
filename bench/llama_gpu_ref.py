#!/usr/bin/env python3
"""The peer of scripts/device-check part (c): the same Llama-shaped model trained the way a
PyTorch user would, with transformers' LlamaForCausalLM (random init) and torch eager (no
torch.compile) on one GPU: float32 weights, bf16 autocast, AdamW, random tokens, seq 2048.

  llama_gpu_ref.py [--layers 22] [--steps 12] [--micro 4] [--attn sdpa] [--json OUT]

Prints and writes {"tokens_per_s", "peak_bytes", "attn", "params"}; tokens/s is the median
step time after two warm-up steps, as device-check reads trainrun's metrics."""
import argparse, json, statistics, time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=22)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--micro", type=int, default=4)
p.add_argument("--seq", type=int, default=2048)
p.add_argument("--attn", default="sdpa", help="transformers attn_implementation: sdpa or eager")
p.add_argument("--json")
a = p.parse_args()

torch.manual_seed(1)
cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                  num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=4,
                  max_position_embeddings=2048, tie_word_embeddings=False,
                  attn_implementation=a.attn)
dev = torch.device("cuda")
model = LlamaForCausalLM(cfg).to(dev)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
g = torch.Generator(device="cpu").manual_seed(0)
times = []
for step in range(a.steps):
    ids = torch.randint(0, 32000, (a.micro, a.seq), generator=g).to(dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        # transformers shifts the labels itself (position t predicts token t + 1).
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    print(f"step {step + 1}: loss {out.loss.item():.4f}, {times[-1] * 1000:.0f} ms", flush=True)
steady = times[2:] or times
res = {"tokens_per_s": a.micro * a.seq / statistics.median(steady),
       "peak_bytes": torch.cuda.max_memory_allocated(dev), "attn": a.attn,
       "params": sum(t.numel() for t in model.parameters())}
print(json.dumps(res))
if a.json:
    json.dump(res, open(a.json, "w"))
