"""The llama precision matrix (issue 41): every precision plugin x adapter x sequence shape on one
strategy, on a tiny random Llama-3-style model (GQA 4/2 heads, untied head) that transformers
builds here, each cell a 3-step `trainrun` run:

  precisions  fp32 bf16-mixed bf16-true fp16-mixed auto quant-nf4 quant-int8
  adapters    none, lora (r 4 on all-linear)
  seqs        one     48-token rows: one query block of every attention path
              blocks  200-token rows: past the 64-query blocks of the float32 training attention
                      and the 128-query blocks of evaluation (a short last block in each)
              packed  the chat dataset, packing = true: rows of 200 positions holding several
                      conversations (segment ids: a block-diagonal mask, position ids restarting)

Each cell must end with finite losses (every logged step, on every rank) and a finite held-out
loss, and stay within TOLERANCE of the same strategy's fp32 cell (same adapter, same rows):
bf16 keeps 8 significant bits, so a 3-step run of this model moves its loss by well under 1 %;
the quantized bases start from other weights than fp32's (NF4: 16 levels per block of 16),
hence their wider bound. A reduced-precision cell must also differ from fp32 (one that silently
ran in fp32 fails); fp16-mixed computes in float32 on CPU with power-of-two loss scaling, so it
must equal fp32 exactly; `auto` is checked as what it says it chose on this CPU. A LoRA cell's
adapter must load in peft.PeftModel.from_pretrained over the base and give trainrun's logits for
it within 1e-5 (fp32, 200 tokens), and, through the bf16 compute of `llama_logits --bf16`,
stay within 5e-2 of them.

Without an adapter the quantized precisions train what they leave in float32 (embeddings, norms,
the head): their losses still track fp32's, within the quantized bound.

usage: llama_precision_matrix.py TRAINRUN LLAMA_LOGITS WORK STRATEGY
           [--precisions a,b,...] [--adapters none,lora] [--seqs one,blocks,packed]
STRATEGY: single (1 rank), ddp, fsdp, zero3 (2 ranks each, gloo-cpu).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

import torch

PRECISIONS = ["fp32", "bf16-mixed", "bf16-true", "fp16-mixed", "auto", "quant-nf4", "quant-int8"]
ADAPTERS = ["none", "lora"]
SEQS = ["one", "blocks", "packed"]
STRATEGIES = {"single": ([], 1), "ddp": (["strategy.plugin=ddp"], 2),
              "fsdp": (["strategy.plugin=fsdp"], 2),
              "zero3": (["strategy.plugin=zero", "strategy.stage=3"], 2)}
# Cells refused at setup by design, with exit 2 and this text: the sharded strategies flatten
# float32 parameters only, so bf16-true's bfloat16 weights cannot be sharded for full
# fine-tuning (with LoRA the bf16 base is frozen and stays whole, and the cell trains).
REFUSED = {("fsdp", "bf16-true", "none"): "the sharding engine flattens float32 parameters",
           ("zero3", "bf16-true", "none"): "the sharding engine flattens float32 parameters"}
TOLERANCE = {"bf16": 0.02, "quant": 0.05}  # relative to the fp32 cell's loss, any step
VOCAB = 320  # chat_data.py's tokenizer
LENGTH = {"one": 48, "blocks": 200, "packed": 200}
STEPS, BATCH = 3, 4
torch.set_num_threads(1)

ap = argparse.ArgumentParser()
ap.add_argument("trainrun")
ap.add_argument("logits_exe")
ap.add_argument("work")
ap.add_argument("strategy", choices=sorted(STRATEGIES))
ap.add_argument("--precisions", default=",".join(PRECISIONS))
ap.add_argument("--adapters", default=",".join(ADAPTERS))
ap.add_argument("--seqs", default=",".join(SEQS))
A = ap.parse_args()
failures = []


def fail(msg):
    print("FAIL:", msg, flush=True)
    failures.append(msg)


def native_bf16():
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = line.split(":", 1)[1].split()
            return [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return []


def make_base(out):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out)


def data_section(seq, work):
    if seq == "packed":
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run([sys.executable, os.path.join(here, "chat_data.py"), os.path.join(work, "chat"),
                              "--count", "96", "--seed", "5", "--tokenizer-out", os.path.join(work, "tokenizer")],
                             capture_output=True, text=True, check=True).stdout.split()
        paths = ", ".join(json.dumps(p) for p in out)
        return f"""[data]
plugin = "chat"
paths = [{paths}]
tokenizer = "{work}/tokenizer"
max_seq_len = {LENGTH[seq]}
overlong = "truncate"
packing = true
validation_fraction = 0.1
"""
    g = torch.Generator().manual_seed(2)
    toks = torch.randint(3, VOCAB, (BATCH * STEPS * (LENGTH[seq] + 1) * 2,), generator=g)
    path = os.path.join(work, f"tokens-{seq}.u32")
    toks.to(torch.int32).numpy().astype("<u4").tofile(path)
    return f"""[data]
plugin = "text"
format = "uint32"
vocab_size = {VOCAB}
block_size = {LENGTH[seq]}
eval_fraction = 0.2
paths = ["{path}"]
"""


def job(path, base, data, run_dir, precision, adapter):
    prec = f'[precision]\nplugin = "{precision}"\n'
    if precision.startswith("quant"):
        prec += 'target_modules = ["all-linear"]\n'
        if precision == "quant-nf4":
            prec += "blocksize = 16\ndouble_quant = true\n"
    lora = ('\n[[callbacks]]\nplugin = "lora"\nr = 4\nlora_alpha = 8.0\ntarget_modules = ["all-linear"]\n'
            if adapter == "lora" else "")
    with open(path, "w") as f:
        f.write(f"""[trainer]
max_steps = {STEPS}
global_batch_size = {BATCH}
seed = 3
log_every = 1
eval_max_batches = 1
run_dir = "{run_dir}"

[model]
plugin = "llama"
path = "{base}"

{data}
[optimizer]
plugin = "adamw"
lr = 1e-2

[accelerator]
plugin = "cpu"
threads = 1

{prec}
[[callbacks]]
plugin = "metrics"
all_ranks = true
{lora}""")


def run(cell, args):
    sets, world = STRATEGIES[A.strategy]
    cmd = [A.trainrun] + args
    for s in sets:
        cmd += ["--set", s]
    if world > 1:
        cmd += ["--set", f"launch.nproc_per_node={world}", "--set", "accelerator.plugin=gloo-cpu",
                "--set", "accelerator.timeout_s=60"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def read_losses(run_dir):
    """{rank file: ({step: loss}, final eval loss)}"""
    out = {}
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("metrics") and name.endswith(".jsonl"):
            rows = [json.loads(l) for l in open(os.path.join(run_dir, name))]
            steps = {r["step"]: r["loss"] for r in rows if "loss" in r and "eval_loss" not in r}
            evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
            out[name] = (steps, evals[-1] if evals else None)
    return out


def logits(model_dir, ids_path, adapter, bf16=False):
    from safetensors.torch import load_file
    out = ids_path + (".bf16" if bf16 else "") + ".out.safetensors"
    cmd = [A.logits_exe, model_dir, ids_path, out, adapter] + (["--bf16"] if bf16 else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama_logits exited {r.returncode}: {r.stdout + r.stderr}")
    return load_file(out)["logits"]


def check_adapter(cell, base, adapter, cell_dir):
    from peft import PeftModel
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    ids = torch.randint(3, VOCAB, (2, 200), generator=torch.Generator().manual_seed(7))
    ids_path = os.path.join(cell_dir, "ids.safetensors")
    save_file({"input_ids": ids}, ids_path)
    model = AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager", dtype=torch.float32)
    model = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    ours = logits(base, ids_path, adapter)
    r = ((ours.double() - ref.double()).abs().max() / ref.double().abs().max()).item()
    ours16 = logits(base, ids_path, adapter, bf16=True)
    r16 = ((ours16.double() - ref.double()).abs().max() / ref.double().abs().max()).item()
    print(f"{cell}: PEFT loads the adapter; trainrun's logits vs PEFT's {r:.1e} (fp32, tolerance 1e-5), "
          f"{r16:.1e} (bf16 compute, tolerance 5e-2)")
    if not r <= 1e-5:
        fail(f"{cell}: the adapter in PEFT gives other logits than trainrun ({r:.2e})")
    if not (torch.isfinite(ours16).all() and r16 <= 5e-2):
        fail(f"{cell}: llama_logits --bf16 with the adapter is off by {r16:.2e}")


def main():
    shutil.rmtree(A.work, ignore_errors=True)
    os.makedirs(A.work)
    base = os.path.join(A.work, "base")
    make_base(base)
    flags = native_bf16()
    print(f"{A.strategy}: native bfloat16 on this CPU: {', '.join(flags) if flags else 'none (emulated through float32)'}")
    precisions = A.precisions.split(",")
    if "fp32" not in precisions:
        precisions.insert(0, "fp32")
    cells = 0
    for seq in A.seqs.split(","):
        data = data_section(seq, A.work)
        for adapter in A.adapters.split(","):
            reference = None
            for precision in precisions:
                cell = f"{A.strategy}/{seq}/{adapter}/{precision}"
                cell_dir = os.path.join(A.work, f"{seq}-{adapter}-{precision}")
                os.makedirs(cell_dir)
                run_dir = os.path.join(cell_dir, "run")
                job(os.path.join(cell_dir, "job.toml"), base, data, run_dir, precision, adapter)
                rc, out = run(cell, ["--config", os.path.join(cell_dir, "job.toml")])
                open(os.path.join(cell_dir, "log"), "w").write(out)
                cells += 1
                refusal = REFUSED.get((A.strategy, precision, adapter))
                if refusal:
                    if rc != 2 or refusal not in out:
                        fail(f"{cell}: expected exit 2 saying '{refusal}', got {rc}:\n{out[-800:]}")
                    else:
                        print(f"{cell}: refused as expected (exit 2: {refusal})")
                    continue
                if rc != 0:
                    fail(f"{cell}: trainrun exited {rc}:\n{out[-1500:]}")
                    continue
                resolved = precision
                if precision == "auto":
                    resolved = "bf16-mixed" if "precision auto: bf16-mixed" in out else "fp32"
                runs = read_losses(run_dir)
                world = STRATEGIES[A.strategy][1]
                if len(runs) != world:
                    fail(f"{cell}: {len(runs)} metrics files for {world} ranks")
                    continue
                worst = 0.0
                for name, (steps, ev) in runs.items():
                    if sorted(steps) != list(range(1, STEPS + 1)):
                        fail(f"{cell}: {name} logged steps {sorted(steps)}")
                    if not all(math.isfinite(v) for v in steps.values()) or ev is None or not math.isfinite(ev):
                        fail(f"{cell}: {name}: non-finite loss {steps} / eval {ev}")
                    if reference is not None:
                        ref = reference[name][0]
                        worst = max([worst] + [abs(steps[k] - ref[k]) / abs(ref[k]) for k in ref if k in steps])
                first = next(iter(runs.values()))[0]
                summary = " ".join(f"{first[k]:.5f}" for k in sorted(first))
                if precision == "fp32":
                    reference = runs
                    print(f"{cell}: losses {summary}")
                else:
                    kind = "quant" if precision.startswith("quant") else "bf16"
                    tol = 0.0 if resolved in ("fp32", "fp16-mixed") else TOLERANCE[kind]
                    print(f"{cell}{' -> ' + resolved if resolved != precision else ''}: losses {summary}; "
                          f"worst relative difference to fp32 {worst:.2e} (tolerance {tol:g})")
                    if worst > tol:
                        fail(f"{cell}: losses differ from fp32's by {worst:.2e} > {tol:g}")
                    if tol > 0 and worst == 0:
                        fail(f"{cell}: exactly fp32's losses: did it run in {resolved} at all?")
                if adapter == "lora":
                    ad = os.path.join(run_dir, "adapter")
                    if not os.path.isfile(os.path.join(ad, "adapter_model.safetensors")):
                        fail(f"{cell}: no adapter written")
                    else:
                        try:
                            check_adapter(cell, base, ad, cell_dir)
                        except Exception as e:  # noqa: BLE001 - a failure of the cell, reported
                            fail(f"{cell}: adapter check: {e}")
    print(f"{A.strategy}: {cells} cells, {len(failures)} failed")
    if failures:
        print("failed cells:\n  " + "\n  ".join(f.split(":")[0] for f in failures))
        sys.exit(1)
    print("OK")


main()
