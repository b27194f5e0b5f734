"""A QLoRA user's first hour (issue 51): the five findings of a new user's try, each reproduced
on a tiny Llama made here by transformers (one layer, hidden 576 like SmolLM2's, so that the
attention projections have the block counts that misled merge-lora) with a byte-level BPE
tokenizer and a chat template, as the first hour's commands meet them.

  targets   `trainrun check` refuses LoRA target_modules ["query_key_value"] and
            ["q_proj", "query_key_value"] (the second passed before and trained q_proj only),
            naming the entry and the short layer names (q_proj, k_proj, ...) in one short
            message that is the only output; quant-nf4's target_modules likewise (convert()
            was not run by check before, so a misspelt quant target only failed in the run).
  output    `check` prints "valid" as its last line (it was first, 168 lines above an error),
            shows the model as built from [model] path (its real hidden size) instead of the
            inline keys' defaults (hidden_size = 256), keeps the plugins' log lines out of the
            estimate table; a key above every table gets "did you mean [trainer] max_steps?".
  errors    a chat row with an unknown role, at 2 ranks: the error is printed once, and the
            failure report names both ranks (it was printed three times).
  qlora     QLoRA (quant-nf4 + lora, 3 steps), then merge-lora: no per-layer warnings (120 of
            them before, for 576 x 576 weights whose double-quantization blocks were
            mis-inferred); `generate --adapter` on the full-precision base gives the tokens of
            the merged model (the base the adapter was trained against, as merge-lora uses;
            before, generate added the adapter to the full-precision weights), says so in one
            line, and `--plain-base` says it is not the trained model.
  estimate  `check`'s stage-3 model state for QLoRA under fsdp at 2 ranks within 20% of the
            measured mem_model_state_bytes of both ranks (before: the NF4 base counted as fp32,
            about 3.5x here), and the rank-0 metrics carry every rank's memory.
  peak      `check`'s peak per rank (model state + the model's activation estimate) within
            [0.85, 1.25] of the measured mem_peak_bytes for LoRA at 512 tokens, fp32 and
            bf16-mixed (before: under autocast every activation was counted at 2 bytes, while
            the residual stream, adapted outputs and attention scores stay float32 and the
            weights' bf16 copies live until the backward: x0.68 for SmolLM2 at 1024 tokens).

usage: first_hour.py TRAINRUN WORK CASE
"""
import json
import os
import re
import subprocess
import sys

import torch

TR, WORK, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_models import CHAT_TEMPLATE, bpe_tokenizer, stable_text  # noqa: E402


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(args, expect=0, env=None):
    p = subprocess.run([TR] + args, capture_output=True, text=True, env=env, timeout=400)
    out = p.stdout + p.stderr
    if expect is not None and p.returncode != expect:
        fail(f"trainrun {' '.join(args)}: exit {p.returncode}, expected {expect}\n{out[-4000:]}")
    return p, out


def make_model(out, layers=1):
    from transformers import LlamaConfig, LlamaForCausalLM

    fast = bpe_tokenizer([stable_text()])
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=576, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=256,
                      rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)  # sharper distributions than the default init: fewer near-ties
    model.save_pretrained(out)
    fast.save_pretrained(out)
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)


def chat_data(path, rows=64, bad_row=None):
    words = "the cat sat on a mat while we read every line of the tests here".split()
    with open(path, "w") as f:
        for i in range(rows):
            q = " ".join(words[(i + k) % len(words)] for k in range(5))
            a = " ".join(words[(3 * i + k) % len(words)] for k in range(7))
            role = "assistent" if i == bad_row else "assistant"
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": role, "content": a}]}) + "\n")


def job(path, model, data, run_dir, extra="", lora_targets='["all-linear"]', strategy="single", nproc=1,
        steps=3, top=""):
    text = f"""{top}
[launch]
nproc_per_node = {nproc}

[trainer]
max_steps = {steps}
global_batch_size = {2 * nproc}
micro_batch_size = 2
seed = 1
run_dir = "{run_dir}"
log_every = 1
eval_every = 0
eval_max_batches = 2

[model]
plugin = "llama"
path = "{model}"

[data]
plugin = "chat"
paths = ["{data}"]
tokenizer = "{model}"
max_seq_len = 64
packing = true
validation_fraction = 0.1

[strategy]
plugin = "{strategy}"

[accelerator]
plugin = "{'gloo-cpu' if nproc > 1 else 'cpu'}"
threads = 1

[optimizer]
plugin = "adamw"
lr = 1e-2

[[callbacks]]
plugin = "lora"
r = 4
lora_alpha = 8
target_modules = {lora_targets}
{extra}
"""
    with open(path, "w") as f:
        f.write(text)


QUANT = '\n[precision]\nplugin = "quant-nf4"\ntarget_modules = ["all-linear"]\ndouble_quant = true\n'

os.makedirs(WORK, exist_ok=True)
model = os.path.join(WORK, "model")
if not os.path.isfile(os.path.join(model, "config.json")):
    make_model(model, layers=4 if CASE == "estimate" else 1)
data = os.path.join(WORK, "chat.jsonl")
chat_data(data)

if CASE == "targets":
    for targets, entry in (('["query_key_value"]', "query_key_value"),
                           ('["q_proj", "query_key_value"]', "query_key_value")):
        j = os.path.join(WORK, "t.toml")
        job(j, model, data, os.path.join(WORK, "run"), lora_targets=targets)
        p, out = run(["check", "--config", j], expect=2)
        lines = [l for l in out.splitlines() if l.strip()]
        errs = [l for l in lines if "error:" in l]
        if len(errs) != 1 or f'target_modules entry "{entry}" matches no layer' not in errs[0]:
            fail(f"{targets}: no one-line error naming '{entry}':\n{out[-3000:]}")
        if "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj" not in errs[0]:
            fail(f"{targets}: the error does not list the short layer names: {errs[0]}")
        if len(errs[0]) > 1200 or "model.layers.0." in errs[0]:
            fail(f"{targets}: the error lists every layer path ({len(errs[0])} characters)")
        if any("valid" in l for l in lines):
            fail(f"{targets}: check printed 'valid' beside its error:\n{out[-3000:]}")
        print(f"ok: {targets}: {errs[0][:200]}...")
    j = os.path.join(WORK, "q.toml")
    job(j, model, data, os.path.join(WORK, "run"), extra=QUANT.replace('["all-linear"]', '["q_proj", "qkv"]'))
    p, out = run(["check", "--config", j], expect=2)
    if "precision 'quant-nf4'" not in out or 'target_modules entry "qkv" matches no layer' not in out:
        fail(f"quant-nf4 target 'qkv' not refused by check:\n{out[-3000:]}")
    print("ok: quant-nf4 target refused by check")

elif CASE == "output":
    j = os.path.join(WORK, "ok.toml")
    job(j, model, data, os.path.join(WORK, "run"), extra=QUANT)
    p, out = run(["check", "--config", j])
    lines = p.stdout.splitlines()
    if not re.fullmatch(r"# .*ok\.toml: valid", lines[-1]) or any(": valid" in l for l in lines[:-1]):
        fail(f"'valid' is not the last line (and only there):\n{p.stdout[:600]}...{p.stdout[-600:]}")
    model_sec = p.stdout.split("[model]\n", 1)[1].split("\n[", 1)[0]
    if "hidden 576" not in model_sec or "hidden_size = 256" in model_sec or "num_hidden_layers" in model_sec:
        fail(f"the [model] section does not show the model built from path:\n{model_sec}")
    table = p.stdout.split("# memory estimate", 1)[1]
    if any(not l.startswith("#") for l in table.splitlines()[1:]):
        fail(f"a line that is not the estimate's inside the table:\n{table}")
    if "stored weights: 7 Linear weight(s) as nf4+dq" not in table or "peak" not in table:
        fail(f"the estimate does not count the NF4 storage or the peak:\n{table}")
    print("ok: check output:", lines[-1])
    j = os.path.join(WORK, "top.toml")
    job(j, model, data, os.path.join(WORK, "run"), top="max_steps = 3\n")
    p, out = run(["check", "--config", j], expect=2)
    if "did you mean [trainer] max_steps?" not in out:
        fail(f"a key above every table got no hint:\n{out}")
    print("ok:", out.strip().splitlines()[-1][:160])

elif CASE == "errors":
    bad = os.path.join(WORK, "bad.jsonl")
    chat_data(bad, bad_row=5)
    j = os.path.join(WORK, "bad.toml")
    job(j, model, bad, os.path.join(WORK, "run-bad"), nproc=2, strategy="ddp")
    p, out = run(["--config", j], expect=2)
    shown = [l for l in out.splitlines() if 'unknown role "assistent"' in l]
    if len(shown) != 1:
        fail(f"the data error is printed {len(shown)} times:\n{out[-4000:]}")
    if "printed by ranks 0 and 1" not in out and "printed by ranks 1 and 0" not in out:
        fail(f"the failure report does not name both ranks:\n{out[-4000:]}")
    print("ok: printed once:", shown[0][:160])

elif CASE == "qlora":
    j = os.path.join(WORK, "qlora.toml")
    run_dir = os.path.join(WORK, "run")
    job(j, model, data, run_dir, extra=QUANT)
    run(["--config", j])
    adapter = os.path.join(run_dir, "adapter")
    merged = os.path.join(WORK, "merged")
    p, out = run(["merge-lora", "--base", model, "--adapter", adapter, "--output", merged])
    warnings = [l for l in out.splitlines() if "warning" in l]
    if warnings:
        fail(f"merge-lora warns ({len(warnings)} lines):\n" + "\n".join(warnings[:5]))
    gen = ["--prompt", "the cat sat on", "--max-new-tokens", "24"]
    _, from_merged = run(["generate", "--model", merged] + gen)
    p, with_adapter = run(["generate", "--model", model, "--adapter", adapter] + gen)
    text = lambda s: [l for l in s.splitlines() if not l.startswith("generate:")]
    if text(from_merged) != text(with_adapter):
        fail(f"generate --adapter and the merged model differ:\n{from_merged}\n---\n{with_adapter}")
    if "generate: base: nf4+dq-quantized as in training" not in with_adapter:
        fail(f"generate --adapter does not say which base it used:\n{with_adapter}")
    _, plain = run(["generate", "--model", model, "--adapter", adapter, "--plain-base"] + gen)
    if "NOT the nf4+dq-quantized base" not in plain:
        fail(f"--plain-base does not say it is another model:\n{plain}")
    print("ok: generate --adapter = merged model:", text(with_adapter)[:2])
    print("    plain base:", text(plain)[:2])

elif CASE == "estimate":
    j = os.path.join(WORK, "est.toml")
    run_dir = os.path.join(WORK, "run")
    job(j, model, data, run_dir, extra=QUANT, strategy="fsdp", nproc=2)
    p, out = run(["check", "--config", j])
    row = [l for l in p.stdout.splitlines() if l.startswith("#   3 (os+g+p)")]
    if not row:
        fail(f"no stage-3 row:\n{p.stdout[-2000:]}")
    cells = re.findall(r"([0-9.]+) (B|KiB|MiB|GiB)", row[0])
    unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    est = float(cells[4][0]) * unit[cells[4][1]]  # params, grads, optimizer, buffers, model state
    run(["--config", j])
    steps = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"loss"' in l]
    last = steps[-1]
    for r in (0, 1):
        got = last.get(f"mem_model_state_bytes/rank_{r}")
        if got is None:
            fail(f"rank 0's metrics carry no mem_model_state_bytes/rank_{r}: {sorted(last)}")
        ratio = est / got
        print(f"rank {r}: model state measured {got / 2**20:.2f} MiB, estimated {est / 2**20:.2f} MiB "
              f"(x{ratio:.3f})")
        if not 0.8 <= ratio <= 1.2:
            fail(f"rank {r}: the estimate is off by more than 20%")
    print("ok: estimate within 20%")
elif CASE == "peak":
    # A model of SmolLM2's layer shape (inline keys, random weights, the tiny tokenizer's
    # vocabulary), so that the layers' activations, not the head or the state, dominate.
    for precision in ("fp32", "bf16-mixed"):
        j = os.path.join(WORK, f"peak-{precision}.toml")
        run_dir = os.path.join(WORK, f"run-{precision}")
        job(j, model, data, run_dir, steps=2, extra=f'\n[precision]\nplugin = "{precision}"\n')
        text = open(j).read()
        text = text.replace(f'path = "{model}"', "hidden_size = 576\nintermediate_size = 1536\n"
                            "num_hidden_layers = 4\nnum_attention_heads = 9\nnum_key_value_heads = 3\n"
                            "max_position_embeddings = 1024\ntie_word_embeddings = true")
        text = text.replace("max_seq_len = 64", "max_seq_len = 512").replace("micro_batch_size = 2",
                                                                            "micro_batch_size = 1")
        text = text.replace("global_batch_size = 2", "global_batch_size = 1")
        with open(j, "w") as f:
            f.write(text)
        p, out = run(["check", "--config", j])
        row = [l for l in p.stdout.splitlines() if "<- what strategy single holds" in l]
        if not row:
            fail(f"{precision}: no row marked as the strategy's:\n{p.stdout[-2000:]}")
        cells = re.findall(r"([0-9.]+) (B|KiB|MiB|GiB)", row[0])
        unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
        if len(cells) < 7:
            fail(f"{precision}: no peak column: {row[0]}")
        est = float(cells[6][0]) * unit[cells[6][1]]
        run(["--config", j])
        steps = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"loss"' in l]
        got = max(s["mem_peak_bytes"] for s in steps)
        ratio = est / got
        print(f"{precision}: peak measured {got / 2**20:.1f} MiB, estimated {est / 2**20:.1f} MiB (x{ratio:.3f})")
        if not 0.85 <= ratio <= 1.25:
            fail(f"{precision}: the peak estimate is outside [0.85, 1.25] of the measured peak")
    print("ok: peak estimates within bounds")
else:
    fail("unknown case " + CASE)
