#!/usr/bin/env python3
"""LoRA fine-tuning of SmolLM2-135M-Instruct: trainrun against transformers + PEFT in a plain
torch loop, and QLoRA (nf4) against LoRA, in one run on this machine (issue 21, done-when 4).

    .venv/bin/python bench/llm.py [--build build] [--steps 3] [--warmup 1]
                                           [--batch 1] [--seq 512] [--threads 1] [--only lora|qlora]
                                           [--torch-attn sdpa|eager] [--rounds 1]
                                           [--precision fp32|bf16-mixed|bf16-true]
                                           [--profile] [--limit-python /usr/bin/python3]

Both sides: the HF directory scripts/gguf_to_hf.py makes (cached in BUILD/cache), float32
weights, LoRA r 16, lora_alpha 32, dropout 0, target_modules all-linear (every projection of
every decoder layer, not lm_head), AdamW lr 1e-4 on the adapters only, sequences of --seq
tokens, --batch sequences per rank per step, --threads intra-op threads per rank, at 1 rank and
at 2 ranks (trainrun: strategy single / ddp over gloo-cpu; torch: the model as is / DDP over
gloo). --precision bf16-mixed: trainrun's bf16-mixed precision plugin against the torch loop's
forward and loss under torch.autocast("cpu", dtype=torch.bfloat16) (float32 weights, bf16
matrix products); bf16-true: trainrun's bf16-true against the model cast to bfloat16 under the
same autocast; QLoRA runs under the same precision. The tokens are the fortunes file (fortunes-min) tokenized by the model's tokenizer.
The torch side uses transformers' default attention (--torch-attn sdpa: PyTorch's fused
scaled_dot_product_attention); trainrun built against LibTorch < 2.1 (Debian's 1.13) computes
attention as matmul + softmax, as transformers' "eager" path (--torch-attn eager) does.
Figures:
  tokens/s   global tokens of a step / its wall time, median over the steps after --warmup
             (trainrun: the difference of consecutive elapsed_s in metrics.jsonl, so
             everything between two steps counts; torch: forward, loss, backward, optimizer
             step, zero_grad, loss.item() timed per step on rank 0);
  tok/CPU-s  tokens of one rank's step / the CPU seconds its process used in that step (all
             threads; trainrun: step_cpu_s of metrics.jsonl; torch: time.process_time()),
             median over the same steps: the work per token, which other processes on the
             machine change far less than the wall time (they take cores away, not add work);
  peak RSS   the largest VmHWM of the run's processes (every rank, the launcher), polled
             from /proc every 0.2 s while it runs: one rank's peak resident memory;
  QLoRA      trainrun's median step time with precision quant-nf4 (blocksize 64, double
             quantization, all-linear) + the same LoRA, against LoRA on the float32 base.
--rounds N runs each rank count N times, trainrun first in odd rounds and torch first in even
ones, and prints the median of the rounds' ratios: this VM's speed drifts by several per cent
over minutes, so one pair of runs moves the ratio by about as much (1.27x and 1.40x in two runs
of the same build).
--profile: instead of the comparison, one 1-rank trainrun run with the profiler callback on one
step after the warm-up, printed as the step's decomposition (issue 45): the matrix products by
shape (calls, ms, GFLOPS) beside the same products timed alone in a microbenchmark (`--limit-python`,
default Debian's /usr/bin/python3 with its python3-torch: the LibTorch and oneDNN that trainrun's
Debian build links, one thread, the precision's dtype: the limit), then everything else by kind
(casts, element-wise, softmax and attention masks, normalisation, reductions, the rest), each
with its share of the step's wall time.
Goals (issue 21): trainrun/torch tokens/s >= 1.3x, peak RSS <= 0.8x; QLoRA/LoRA <= 1.5x.
The machine's load average is printed before and after: other processes skew the wall-clock
figures (on a loaded machine compare the tok/CPU-s ratios).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peak_rss import PeakRss  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# The torch side: this file re-run as one worker per rank (--worker).

def worker(a):
    import torch

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation=a.torch_attn)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    if a.precision == "bf16-true":
        model = model.to(torch.bfloat16)
    model.train()
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    import numpy as np
    toks = torch.from_numpy(np.fromfile(a.tokens, dtype="<u4").astype(np.int64))
    T, B = a.seq, a.batch
    times, cpu = [], []
    for step in range(a.warmup + a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        rows = [toks[((step * world + rank) * B + j) * T:((step * world + rank) * B + j) * T + T + 1]
                for j in range(B)]
        w = torch.stack(rows)
        x, y = w[:, :T], w[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision != "fp32"):
            logits = model(input_ids=x).logits
            # The core's convention: sum over targets, normalised by the global batch's targets.
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1),
                                                     reduction="sum") / (T * B * world)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    if rank == 0:
        print(json.dumps({"step_times": times, "step_cpu": cpu}), flush=True)


# ---------------------------------------------------------------------------------------------
# Orchestration

def run_polled(cmd, env):
    """Runs cmd, polling the largest VmHWM (bytes) of its process tree; returns (output, peak)."""
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    with PeakRss(p.pid) as rss:
        out = p.communicate()[0]
    if p.returncode != 0:
        sys.stderr.write(out[-6000:])
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return out, rss.peak


def trainrun_job(a, path, run_dir, world, qlora):
    with open(path, "w") as f:
        f.write(f"""[trainer]
max_steps = {a.warmup + a.steps}
global_batch_size = {a.batch * world}
micro_batch_size = {a.batch}
seed = 1
log_every = 1
eval_every = 0
run_dir = "{run_dir}"

[model]
plugin = "llama"
path = "{a.model}"
save_hf = false

[data]
plugin = "text"
format = "uint32"
vocab_size = 49152
block_size = {a.seq}
eval_fraction = 0.0
paths = ["{a.tokens}"]

[optimizer]
plugin = "adamw"
lr = 1e-4
weight_decay = 0.0

[strategy]
plugin = "{'ddp' if world > 1 else 'single'}"

[accelerator]
plugin = "{'gloo-cpu' if world > 1 else 'cpu'}"
threads = {a.threads}

[[callbacks]]
plugin = "lora"
r = 16
lora_alpha = 32.0
target_modules = ["all-linear"]
""" + ("""
[precision]
plugin = "quant-nf4"
target_modules = ["all-linear"]
blocksize = 64
double_quant = true
compute_dtype = "%s"
""" % ("bf16" if a.precision != "fp32" else "fp32") if qlora else """
[precision]
plugin = "%s"
""" % a.precision))


def run_trainrun(a, work, world, qlora=False):
    name = f"trainrun-{'qlora' if qlora else 'lora'}-{world}"
    run_dir = os.path.join(work, name)
    job = os.path.join(work, name + ".toml")
    trainrun_job(a, job, run_dir, world, qlora)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    _, peak = run_polled([a.trainrun, "--config", job, "--set", f"launch.nproc_per_node={world}"], env)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    rows = [r for r in rows if "step_time_s" in r and "eval_loss" not in r]
    # Wall time of step i: from the end of step i-1 to the end of step i (tokens_per_s in the
    # file is a running mean since the first step, warm-up included).
    wall = [b["elapsed_s"] - p["elapsed_s"] for p, b in zip(rows, rows[1:])][max(a.warmup, 1) - 1:]
    cpu = [r["step_cpu_s"] for r in rows[a.warmup:]]
    step = statistics.median(wall)
    return {"tokens_per_s": a.seq * a.batch * world / step, "step_s": step,
            "tokens_per_cpu_s": a.seq * a.batch / statistics.median(cpu), "peak_rss": peak}


def run_torch(a, work, world):
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), WORLD_SIZE=str(world))
    args = [sys.executable, os.path.abspath(__file__), "--worker", "--model", a.model, "--tokens", a.tokens,
            "--steps", str(a.steps), "--warmup", str(a.warmup), "--batch", str(a.batch), "--seq", str(a.seq),
            "--threads", str(a.threads), "--torch-attn", a.torch_attn, "--precision", a.precision]
    if world == 1:
        out, peak = run_polled(args, dict(env, RANK="0"))
    else:
        # One launcher process starting the ranks, so the polled tree holds all of them.
        launcher = ("import os, subprocess, sys\n"
                    f"ps = [subprocess.Popen({args!r}, env=dict(os.environ, RANK=str(r))) for r in range({world})]\n"
                    "sys.exit(max(p.wait() for p in ps))\n")
        out, peak = run_polled([sys.executable, "-c", launcher], env)
    line = json.loads([l for l in out.splitlines() if l.startswith('{"step_times"')][-1])
    step = statistics.median(line["step_times"][a.warmup:])
    return {"tokens_per_s": a.seq * a.batch * world / step, "step_s": step,
            "tokens_per_cpu_s": a.seq * a.batch / statistics.median(line["step_cpu"][a.warmup:]),
            "peak_rss": peak}


def ensure_inputs(a):
    if not os.path.isfile(os.path.join(a.model, "model.safetensors")):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gguf_to_hf.py"), a.model], check=True)
    if not os.path.isfile(a.tokens):
        from tokenizers import Tokenizer
        import numpy as np
        tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
        text = ""
        for f in ("/usr/share/games/fortunes/fortunes", "/usr/share/games/fortunes/literature"):
            if os.path.isfile(f):
                text += open(f, errors="replace").read()
        ids = np.array(tok.encode(text).ids, dtype="<u4")
        need = (a.warmup + a.steps) * 2 * a.batch * (a.seq + 1) * 2
        if ids.size < need:
            ids = np.resize(ids, need)  # repeat: the content does not change the speed
        ids.tofile(a.tokens)


def load():
    return open("/proc/loadavg").read().split()[:3]


# Operator names by kind, for the decomposition (self time; the first match wins).
KINDS = [("matrix products", lambda n: n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
         ("casts and copies", lambda n: n in ("aten::copy_", "aten::to", "aten::_to_copy", "aten::clone",
                                               "aten::contiguous", "aten::cat", "aten::index_select")),
         ("element-wise", lambda n: n in ("aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::sub",
                                          "aten::div", "aten::neg", "aten::silu", "aten::silu_backward",
                                          "aten::addcmul", "aten::addcmul_", "aten::addcdiv_", "aten::sqrt",
                                          "aten::rsqrt", "aten::pow", "aten::exp", "aten::exp_", "aten::sub_",
                                          "aten::where", "aten::lerp_", "aten::_foreach_add_")),
         ("softmax, masks", lambda n: "softmax" in n or "masked_fill" in n or "logsumexp" in n),
         ("fills, allocation", lambda n: n in ("aten::fill_", "aten::zero_", "aten::zeros", "aten::empty",
                                               "aten::empty_strided", "aten::empty_like", "aten::zeros_like")),
         ("reductions", lambda n: n in ("aten::sum", "aten::mean", "aten::norm", "aten::linalg_vector_norm",
                                        "aten::max", "aten::amax"))]


def limit_gflops(a, shapes, dtype):
    """GFLOPS of each [M,K]x[K,N] product alone, one thread, in a fresh process of --limit-python."""
    code = ("import json, sys, time, torch\n"
            "torch.set_num_threads(1)\n"
            f"dt = getattr(torch, {dtype!r})\n"
            "out = {}\n"
            "for m, k, n in json.loads(sys.argv[1]):\n"
            "    a, b = torch.randn(m, k).to(dt), torch.randn(k, n).to(dt)\n"
            "    torch.mm(a, b); torch.mm(a, b)\n"
            "    reps = max(3, int(2e10 / (2 * m * k * n)))\n"
            "    t = time.perf_counter()\n"
            "    for _ in range(reps): torch.mm(a, b)\n"
            "    out[f'{m}x{k}x{n}'] = 2 * m * k * n * reps / (time.perf_counter() - t) / 1e9\n"
            "print(json.dumps(out))\n")
    r = subprocess.run([a.limit_python, "-c", code, json.dumps(shapes)], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        print(f"(no microbenchmark: {a.limit_python} failed: {r.stderr.strip()[-300:]})")
        return {}
    return json.loads(r.stdout)


def profile(a, work):
    run_dir = os.path.join(work, "profile")
    job = os.path.join(work, "profile.toml")
    trainrun_job(a, job, run_dir, 1, False)
    with open(job, "a") as f:
        f.write(f'\n[[callbacks]]\nplugin = "profiler"\nstart_step = {a.warmup + 1}\nnum_steps = 1\n')
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    run_polled([a.trainrun, "--config", job], env)
    p = json.load(open(os.path.join(run_dir, "profile-rank-0.json")))
    wall = p["wall_s"]
    mm = {}
    for o in p["ops"]:
        if o["flops"] > 0:
            # The two multiplied operands, as the profiler counts them: addmm/baddbmm's follow
            # the bias, mm/bmm's come first (an out= variant records its output last).
            first = 1 if o["name"] in ("aten::addmm", "aten::baddbmm") else 0
            a_shape, b_shape = o["shapes"][first], o["shapes"][first + 1]
            key = (o["name"].replace("aten::", ""), tuple(a_shape), tuple(b_shape))
            e = mm.setdefault(key, [0, 0.0, 0.0])
            e[0] += o["calls"]
            e[1] += o["self_us"] / 1e6
            e[2] += o["flops"]
    dtype = "float32" if a.precision == "fp32" else "bfloat16"
    shapes2d = sorted({(s[1][-2], s[1][-1], s[2][-1]) for s in mm if len(s[1]) == 2})
    limits = limit_gflops(a, shapes2d, dtype)
    gemm_s = sum(e[1] for e in mm.values())
    gemm_f = sum(e[2] for e in mm.values())
    print(f"step {p['steps'][0]}: {wall:.3f} s wall, matrix products {gemm_s:.3f} s ({100 * gemm_s / wall:.0f} %), "
          f"{gemm_f / 1e9:.1f} GFLOP at {gemm_f / gemm_s / 1e9:.0f} GFLOPS")
    print(f"{'product':>8} {'shape':>26} {'calls':>6} {'ms':>8} {'GFLOPS':>7} {'alone':>7} {'of alone':>8}")
    limited_s = limited_alone_s = 0.0
    for key, (calls, s, f) in sorted(mm.items(), key=lambda kv: -kv[1][1])[:20]:
        name, x, y = key
        alone = limits.get(f"{x[-2]}x{x[-1]}x{y[-1]}") if len(x) == 2 else None
        got = f / s / 1e9
        if alone:
            limited_s += s
            limited_alone_s += f / (alone * 1e9)
        shape = "x".join(map(str, x)) + " @ " + "x".join(map(str, y))
        print(f"{name:>8} {shape:>26} {calls:>6} {1e3 * s:>8.1f} {got:>7.0f} "
              f"{(f'{alone:.0f}' if alone else '-'):>7} {(f'{100 * got / alone:.0f} %' if alone else '-'):>8}")
    if limited_s:
        print(f"the 2-D products with a microbenchmark: {1e3 * limited_s:.0f} ms in the step, "
              f"{1e3 * limited_alone_s:.0f} ms alone: {100 * limited_alone_s / limited_s:.0f} % of the "
              f"microbenchmark's speed ({a.limit_python}, {dtype}, 1 thread)")
    by_kind = {k: 0.0 for k, _ in KINDS}
    rest = {}
    for o in p["ops"]:
        for kind, match in KINDS:
            if match(o["name"]):
                by_kind[kind] += o["self_us"] / 1e6
                break
        else:
            rest[o["name"]] = rest.get(o["name"], 0.0) + o["self_us"] / 1e6
    for kind, s in by_kind.items():
        print(f"  {kind:<20} {1e3 * s:8.1f} ms {100 * s / wall:5.1f} %")
    top = sorted(rest.items(), key=lambda kv: -kv[1])[:5]
    rest_s = sum(rest.values())
    print(f"  {'the rest':<20} {1e3 * rest_s:8.1f} ms {100 * rest_s / wall:5.1f} % (largest: "
          + ", ".join(f"{n} {1e3 * s:.0f} ms" for n, s in top) + ")")
    outside = wall - sum(by_kind.values()) - rest_s
    print(f"  {'outside operators':<20} {1e3 * outside:8.1f} ms {100 * outside / wall:5.1f} % "
          "(the optimizer's own loops, data, callbacks, the framework)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("TRAINRUN_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", choices=["lora", "qlora"])
    ap.add_argument("--rounds", type=int, default=1,
                    help="LoRA rounds per rank count, alternating which side runs first; with more "
                         "than one, also the median of the rounds' ratios")
    ap.add_argument("--torch-attn", default="sdpa", choices=["sdpa", "eager"],
                    help="transformers' attn_implementation on the torch side (default sdpa, its own default)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed", "bf16-true"],
                    help="trainrun's precision plugin; the torch side runs under bf16 autocast "
                         "for either bf16 choice (see above)")
    ap.add_argument("--profile", action="store_true",
                    help="print one trainrun step's decomposition instead of the comparison (see above)")
    ap.add_argument("--limit-python", default="/usr/bin/python3",
                    help="python whose torch times the products alone (default Debian's, the same "
                         "LibTorch and oneDNN as trainrun's Debian build)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    a.trainrun = os.path.join(a.build, "bin", "trainrun")
    a.model = a.model or os.path.join(a.build, "cache", "smollm2-135m-instruct")
    a.tokens = a.tokens or os.path.join(a.build, "cache", "smollm2-fortunes.u32")
    ensure_inputs(a)
    work = tempfile.mkdtemp(prefix="bench-llm-")
    if a.profile:
        print(f"SmolLM2-135M, LoRA r 16 all-linear, precision {a.precision}, seq {a.seq}, {a.batch} "
              f"sequence(s), {a.threads} thread(s), 1 rank; load average {' '.join(load())}")
        return profile(a, work)
    print(f"load average before: {' '.join(load())}")
    print(f"SmolLM2-135M, LoRA r 16 all-linear, precision {a.precision}, seq {a.seq}, {a.batch} sequence(s) per rank per step, "
          f"{a.threads} thread(s) per rank, {a.steps} steps after {a.warmup} warm-up")
    lora1 = None
    if a.only != "qlora":
        print(f"torch side: transformers + PEFT, attn_implementation {a.torch_attn}")
        print(f"{'ranks':>5} {'trainrun tok/s':>15} {'torch tok/s':>12} {'ratio':>6}   "
              f"{'trainrun tok/CPU-s':>18} {'torch tok/CPU-s':>15} {'ratio':>6}   "
              f"{'trainrun RSS':>12} {'torch RSS':>10} {'ratio':>6}")
        for world in (1, 2):
            ratios = []
            for r in range(a.rounds):
                # Alternate which side goes first: this VM's speed drifts by several per cent
                # over minutes (same binary, same input), and a fixed order would give the drift
                # to one side.
                if r % 2 == 0:
                    t = run_trainrun(a, work, world)
                    p = run_torch(a, work, world)
                else:
                    p = run_torch(a, work, world)
                    t = run_trainrun(a, work, world)
                if world == 1 and lora1 is None:
                    lora1 = t
                ratios.append((t["tokens_per_s"] / p["tokens_per_s"], t["tokens_per_cpu_s"] / p["tokens_per_cpu_s"],
                               t["peak_rss"] / p["peak_rss"]))
                print(f"{world:>5} {t['tokens_per_s']:>15.1f} {p['tokens_per_s']:>12.1f} "
                      f"{t['tokens_per_s'] / p['tokens_per_s']:>5.2f}x   "
                      f"{t['tokens_per_cpu_s']:>18.1f} {p['tokens_per_cpu_s']:>15.1f} "
                      f"{t['tokens_per_cpu_s'] / p['tokens_per_cpu_s']:>5.2f}x   {t['peak_rss'] / 2**20:>9.0f} MiB "
                      f"{p['peak_rss'] / 2**20:>6.0f} MiB {t['peak_rss'] / p['peak_rss']:>5.2f}x", flush=True)
            if a.rounds > 1:
                med = [statistics.median(x[i] for x in ratios) for i in range(3)]
                print(f"{world:>5} median of {a.rounds} rounds: tokens/s {med[0]:.2f}x (rounds "
                      f"{', '.join(f'{x[0]:.2f}' for x in ratios)}), tok/CPU-s {med[1]:.2f}x, "
                      f"peak RSS {med[2]:.2f}x", flush=True)
    if a.only != "lora":
        lo = lora1 or run_trainrun(a, work, 1)
        q = run_trainrun(a, work, 1, qlora=True)
        print(f"QLoRA (nf4) step {q['step_s']:.2f} s vs LoRA {lo['step_s']:.2f} s on 1 rank: "
              f"{q['step_s'] / lo['step_s']:.2f}x; CPU per step {a.seq * a.batch / q['tokens_per_cpu_s']:.2f} s "
              f"vs {a.seq * a.batch / lo['tokens_per_cpu_s']:.2f} s: "
              f"{lo['tokens_per_cpu_s'] / q['tokens_per_cpu_s']:.2f}x (peak RSS {q['peak_rss'] / 2**20:.0f} MiB vs "
              f"{lo['peak_rss'] / 2**20:.0f} MiB)", flush=True)
    print(f"load average after: {' '.join(load())}")


if __name__ == "__main__":
    main()
