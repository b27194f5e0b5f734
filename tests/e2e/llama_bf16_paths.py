"""bf16-mixed's fast paths on a tiny random Llama (issue 45), each against the path it replaces,
and the profiler callback that measures them:

  copies   precision.frozen_weight_copies true (default) against false: LoRA's frozen base
           weights kept in bf16 for the run must give the same losses and gradient norms, bit
           for bit (the same cast, made once), and the log must say how many were kept; under
           fsdp (2 ranks) the sharded weights must not be copied (no such line).
  head     model.fused_head_loss true (default) against false under bf16-mixed: the vocabulary
           projection and cross-entropy in bf16 without float32 logits must give step 1's loss
           within 1e-4 and its gradient norm within 1e-3 (relative; bf16 rounding of the summed
           logits and gradient, measured ~1e-5 and ~5e-5), and later losses within 2 % (as the
           precision matrix's bf16 bound: Adam's first steps amplify rounding); the profile of
           the default run must show the fused head (HeadCrossEntropySum) ran.
  attention  model.blocked_attention true (default) against false under bf16-mixed: the blocked
           bf16 attention with its own backward (grouped heads, diagonal-only mask) against
           autograd through autocast's masked math form: step 1's loss within 1e-3 (relative)
           and later losses within 2 %; the default run's profile must show it ran.
  profile  the profiler callback on step 2: <run_dir>/profile-rank-0.json names the steps, the
           matrix products with FLOPs = 2 M K N of their recorded shapes, and operators whose
           self times sum to between 50 % and 105 % of the profiled wall time.

usage: llama_bf16_paths.py TRAINRUN WORK
"""
import json
import os
import re
import shutil
import subprocess
import sys

import torch

VOCAB, LENGTH, STEPS, BATCH = 320, 200, 3, 4
A_TRAINRUN, WORK = sys.argv[1], sys.argv[2]
failures = []


def fail(msg):
    print("FAIL:", msg, flush=True)
    failures.append(msg)


def make_base(out):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").save_pretrained(out)


def job(path, base, tokens, run_dir, extra=""):
    with open(path, "w") as f:
        f.write(f"""[trainer]
max_steps = {STEPS}
global_batch_size = {BATCH}
seed = 3
log_every = 1
eval_every = 0
run_dir = "{run_dir}"

[model]
plugin = "llama"
path = "{base}"
save_hf = false

[data]
plugin = "text"
format = "uint32"
vocab_size = {VOCAB}
block_size = {LENGTH}
eval_fraction = 0.0
paths = ["{tokens}"]

[optimizer]
plugin = "adamw"
lr = 1e-2

[accelerator]
plugin = "cpu"
threads = 1

[precision]
plugin = "bf16-mixed"

[[callbacks]]
plugin = "metrics"
all_ranks = true

[[callbacks]]
plugin = "lora"
r = 4
lora_alpha = 8.0
target_modules = ["all-linear"]
{extra}""")


def run(name, sets=(), world=1, extra=""):
    run_dir = os.path.join(WORK, name)
    path = run_dir + ".toml"
    job(path, BASE, TOKENS, run_dir, extra)
    cmd = [A_TRAINRUN, "--config", path]
    for s in sets:
        cmd += ["--set", s]
    if world > 1:
        cmd += ["--set", f"launch.nproc_per_node={world}", "--set", "accelerator.plugin=gloo-cpu",
                "--set", "accelerator.timeout_s=60"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        fail(f"{name}: exit {r.returncode}\n{out[-3000:]}")
        return None, out
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics-rank-0.jsonl"))]
    rows = [r for r in rows if "loss" in r and "eval_loss" not in r]
    return rows, out


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
BASE = os.path.join(WORK, "base")
make_base(BASE)
g = torch.Generator().manual_seed(2)
TOKENS = os.path.join(WORK, "tokens.u32")
torch.randint(3, VOCAB, (BATCH * STEPS * (LENGTH + 1) * 2,), generator=g).to(torch.int32).numpy() \
    .astype("<u4").tofile(TOKENS)

profiler = '\n[[callbacks]]\nplugin = "profiler"\nstart_step = 2\nnum_steps = 1\n'
ref, ref_log = run("default", extra=profiler)
nocopy, _ = run("no-copies", ["precision.frozen_weight_copies=false"])
unfused, _ = run("unfused-head", ["model.fused_head_loss=false"])
autograd_attn, _ = run("autograd-attention", ["model.blocked_attention=false"])
sharded, sharded_log = run("fsdp", ["strategy.plugin=fsdp"], world=2)

def kept(log):
    m = re.search(r"(\d+) frozen Linear weights kept in BFloat16", log)
    return int(m.group(1)) if m else 0


if ref is not None:
    if kept(ref_log) != 15:
        fail(f"default: {kept(ref_log)} frozen weights kept in bf16, expected 15:\n" + ref_log[-2000:])
    print("default losses", [r["loss"] for r in ref])
if ref is not None and nocopy is not None:
    for a, b in zip(ref, nocopy):
        if a["loss"] != b["loss"] or a["grad_norm"] != b["grad_norm"]:
            fail(f"copies: step {a['step']} loss {a['loss']} grad_norm {a['grad_norm']} with the kept "
                 f"copies, {b['loss']} / {b['grad_norm']} without: must be equal")
    print("copies: losses and gradient norms equal with and without the kept copies")
if ref is not None and unfused is not None:
    a, b = ref[0], unfused[0]
    dl = abs(a["loss"] - b["loss"]) / abs(b["loss"])
    dg = abs(a["grad_norm"] - b["grad_norm"]) / abs(b["grad_norm"])
    print(f"head: step 1 loss {a['loss']} vs {b['loss']} (rel {dl:.2e}), grad_norm {a['grad_norm']} vs "
          f"{b['grad_norm']} (rel {dg:.2e})")
    if dl > 1e-4 or dg > 1e-3:
        fail(f"head: step 1 differs beyond 1e-4 (loss) / 1e-3 (grad_norm): {dl:.2e}, {dg:.2e}")
    for x, y in zip(ref, unfused):
        if abs(x["loss"] - y["loss"]) > 0.02 * abs(y["loss"]):
            fail(f"head: step {x['step']} loss {x['loss']} vs {y['loss']}: beyond 2 %")
if ref is not None and autograd_attn is not None:
    a, b = ref[0], autograd_attn[0]
    dl = abs(a["loss"] - b["loss"]) / abs(b["loss"])
    print(f"attention: step 1 loss {a['loss']} vs {b['loss']} (rel {dl:.2e}); last "
          f"{ref[-1]['loss']} vs {autograd_attn[-1]['loss']}")
    if dl > 1e-3:
        fail(f"attention: step 1 loss differs beyond 1e-3: {dl:.2e}")
    for x, y in zip(ref, autograd_attn):
        if abs(x["loss"] - y["loss"]) > 0.02 * abs(y["loss"]):
            fail(f"attention: step {x['step']} loss {x['loss']} vs {y['loss']}: beyond 2 %")
if sharded is not None:
    print(f"fsdp: {kept(sharded_log)} frozen weights kept (single process: {kept(ref_log)})")
    if kept(sharded_log) >= kept(ref_log):
        fail("fsdp: the sharded decoder layers' weights were copied:\n" + sharded_log[-2000:])

prof_path = os.path.join(WORK, "default", "profile-rank-0.json")
if ref is not None:
    if not os.path.isfile(prof_path):
        fail("profile: no " + prof_path)
    else:
        p = json.load(open(prof_path))
        if p["steps"] != [2, 2]:
            fail(f"profile: steps {p['steps']}, expected [2, 2]")
        if not any(o["name"].endswith("HeadCrossEntropySum>") for o in p["ops"]):
            fail("profile: the fused head (HeadCrossEntropySum) did not run")
        if not any(o["name"].endswith("BlockedCausalAttentionBf16>") for o in p["ops"]):
            fail("profile: the blocked bf16 attention (BlockedCausalAttentionBf16) did not run")
        mm = [o for o in p["ops"] if o["name"] == "aten::mm" and o["flops"] > 0]
        if not mm:
            fail("profile: no aten::mm with FLOPs")
        for o in mm:
            (m, k), (k2, n) = o["shapes"][0], o["shapes"][1]
            if k != k2 or abs(o["flops"] - 2 * m * k * n * o["calls"]) > 0.5:
                fail(f"profile: {o} has FLOPs that are not 2 M K N per call")
        self_s = sum(o["self_us"] for o in p["ops"]) / 1e6
        print(f"profile: {len(p['ops'])} operators, self {self_s:.3f} s of {p['wall_s']:.3f} s wall, "
              f"{len(mm)} matrix-product shapes")
        if not 0.5 * p["wall_s"] <= self_s <= 1.05 * p["wall_s"]:
            fail(f"profile: self times sum to {self_s:.3f} s, not within 50-105 % of the wall {p['wall_s']:.3f} s")

if failures:
    sys.exit(f"{len(failures)} failure(s)")
print("llama bf16 paths: all checks passed")
