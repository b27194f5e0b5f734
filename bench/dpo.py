#!/usr/bin/env python3
"""LoRA DPO of SmolLM2-135M-Instruct: trainrun's `dpo` objective against TRL 1.16's DPOTrainer
with PEFT, on the same preference pairs, in one run on this machine, printed as ratios.

    .venv/bin/python bench/dpo.py [--trainrun build/bin/trainrun] [--steps 8] [--warmup 2]
                                  [--batch 4] [--max-length 256] [--threads 1] [--ranks 1,2]
                                  [--strategy ddp|fsdp] [--rounds 1] [--trl-attn sdpa|eager]

Both sides: SmolLM2-135M-Instruct (BUILD/cache/smollm2-135m-instruct, float32 weights, fp32
compute), LoRA r 16, lora_alpha 32, dropout 0, target_modules all-linear (every projection of
every decoder layer, not lm_head); DPO sigmoid, beta 0.1; the reference model is the policy with
its adapters switched off (trainrun: reference_model = "adapters_off"; TRL: no ref_model, which
with a PEFT model is TRL's default); AdamW lr 5e-4 constant, weight decay 0, gradient clipping
at norm 1.0 (TRL's default max_grad_norm; trainrun gradient_clip_val = 1.0); no gradient
checkpointing, no evaluation, no checkpoint or model saving, metrics logged every step
(TRL: logging_steps 1, report_to none; trainrun: the metrics file, tensorboard and report off);
--batch pairs per rank per step (2 x batch sequences: chosen rows, then rejected rows), no
accumulation; --threads intra-op threads per rank; at 1 rank and at 2 ranks (trainrun: strategy
single, then --strategy (ddp) over gloo-cpu; TRL: Trainer/Accelerate's MULTI_CPU, i.e. PyTorch
DistributedDataParallel over gloo, its ranks started by this script as bench/llm.py starts its
torch peer's, with the environment torchrun would set; ddp_find_unused_parameters False, since
every adapter is used: Trainer's default for a PEFT model is True, an extra graph walk per step).
trainrun pins each rank to a CPU (its default); the TRL ranks are not pinned.

The pairs: the first (warmup + steps) x batch x ranks lines of build/cache/smollm2-dpo/train.jsonl
(conversational pairs; the chat template of the model), written to a file both sides read, one
epoch. TRL draws trainrun's data order (core/src/sampler.cpp: epoch 0 is randperm(N) from a CPU
generator seeded seed * 1000003, rank r of W takes positions step * G + r + j * W), so every
rank gets the same pairs in the same step on both sides, hence the same padding (both pad each
batch to its longest row). Nothing is truncated at the default max_length 256 (the longest
prompt + completion of the file is 109 tokens).

Figures (warm-up steps excluded; the first --warmup steps run but are not measured):
  tokens/s   real (non-padding) tokens of the chosen and rejected rows of the measured steps, all
             ranks (prompt tokens counted in both rows, as TRL's num_tokens), / the wall time of
             those steps. trainrun: the time between the end of the last warm-up step and the end
             of the last step (elapsed_s in metrics.jsonl), tokens from its running counters
             (tokens_per_s x samples_done / samples_per_s; its count is the input positions, one
             per row fewer, so 2 x batch x ranks are added per step); TRL: the time between
             Trainer's on_step_end callbacks on rank 0, tokens from the num_tokens it logs
             (attention_mask sums gathered from every rank). The bench checks that the two sides
             counted the same tokens in every step (the same pairs), and says so;
  tok/CPU-s  the same tokens / (ranks x the CPU seconds rank 0's process used in those steps):
             the work per token, which other processes on the machine change far less than the
             wall time (trainrun: step_cpu_s; TRL: time.process_time() between callbacks);
  peak RSS   the largest VmHWM among the run's processes (every rank, the launcher), polled from
             /proc every 0.2 s while it runs, as bench/llm.py does: one rank's peak resident
             memory.
--rounds N runs each rank count N times, trainrun first in odd rounds and TRL first in even ones,
and prints the median of the rounds' ratios (this VM's speed drifts by several per cent within
minutes). The machine's load average is printed before and after.
Goals: trainrun / TRL tokens/s >= 1.3x, peak RSS <= 0.7x.
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
SEED, LR, BETA, MAX_GRAD_NORM = 1, 5e-4, 0.1, 1.0
LORA = dict(r=16, alpha=32, dropout=0.0)


def trainrun_order(n, world, batch, steps):
    """The pairs each rank takes in each step in trainrun (DistributedSampler::rank_batch):
    order[s][r] = [perm[s * G + r + j * W] for j < batch], perm = randperm(n) of epoch 0."""
    import torch
    g = torch.Generator().manual_seed(SEED * 1000003 + 0)
    perm = torch.randperm(n, generator=g).tolist()
    G = batch * world
    return [[[perm[s * G + r + j * world] for j in range(batch)] for r in range(world)] for s in range(steps)]


# ---------------------------------------------------------------------------------------------
# The TRL side: this file re-run as one worker per rank (--worker).

def worker(a):
    import torch

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    import datasets
    import transformers
    from peft import LoraConfig
    from transformers import AutoTokenizer, PrinterCallback, TrainerCallback
    import trl
    from trl import DPOConfig, DPOTrainer

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    total = a.warmup + a.steps
    order = trainrun_order(a.pairs_n, world, a.batch, total)
    # Accelerate cuts the sampler's stream into batches of `batch` and gives batch k to rank
    # k % W (BatchSamplerShard, split_batches False): step s, rank r is batch s * W + r.
    stream = [i for step in order for ranks in step for i in ranks]

    class TrainrunOrder(torch.utils.data.Sampler):
        def __len__(self):
            return len(stream)

        def __iter__(self):
            return iter(stream)

    class Bench(DPOTrainer):
        def _get_train_sampler(self, *args, **kwargs):
            return TrainrunOrder()

    class Timer(TrainerCallback):
        def __init__(self):
            self.t, self.cpu, self.threads = [], [], []

        def on_train_begin(self, args, state, control, **kw):
            self.t.append(time.perf_counter())
            self.cpu.append(time.process_time())

        def on_step_end(self, args, state, control, **kw):
            self.t.append(time.perf_counter())
            self.cpu.append(time.process_time())
            self.threads.append(torch.get_num_threads())

    rows = [json.loads(line) for line in open(a.pairs)]
    ds = datasets.Dataset.from_list(rows)
    args = DPOConfig(
        output_dir=os.path.join(a.work, "trl-out"), per_device_train_batch_size=a.batch,
        gradient_accumulation_steps=1, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, optim="adamw_torch",
        max_grad_norm=MAX_GRAD_NORM, max_steps=total, logging_steps=1, save_strategy="no", eval_strategy="no",
        report_to="none", seed=SEED, data_seed=SEED, use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, disable_dropout=True, dataloader_drop_last=True,
        dataloader_num_workers=0, dataloader_pin_memory=False, ddp_find_unused_parameters=False,
        max_length=a.max_length, disable_tqdm=True, beta=BETA, loss_type=["sigmoid"],
        model_init_kwargs={"dtype": torch.float32, "attn_implementation": a.trl_attn})
    peft_config = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                             target_modules="all-linear", bias="none", task_type="CAUSAL_LM")
    tok = AutoTokenizer.from_pretrained(a.model)
    timer = Timer()
    trainer = Bench(model=a.model, args=args, train_dataset=ds, processing_class=tok, peft_config=peft_config,
                    callbacks=[timer])
    trainer.remove_callback(PrinterCallback)
    trainable, total_params = trainer.model.get_nb_trainable_parameters()
    reference = "adapters disabled" if trainer.ref_model is None else type(trainer.ref_model).__name__
    trainer.train()
    logged = [r for r in trainer.state.log_history if "num_tokens" in r and "train_runtime" not in r]
    if rank == 0:
        print(json.dumps({"trl_result": {
            "t": timer.t, "cpu": timer.cpu, "threads": sorted(set(timer.threads)),
            "num_tokens": [r["num_tokens"] for r in logged], "steps_logged": [r["step"] for r in logged],
            "loss": [r.get("loss") for r in logged], "trainable": trainable, "params": total_params,
            "reference": reference, "world": trainer.accelerator.num_processes,
            "distributed_type": str(trainer.accelerator.distributed_type),
            "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                         "torch": torch.__version__}}}), flush=True)


# ---------------------------------------------------------------------------------------------
# Orchestration

def run_polled(cmd, env, log, shown=None):
    """Runs cmd (output to the file log), polling the largest VmHWM (bytes) of its process tree;
    returns (output, peak)."""
    print("$ " + (shown or " ".join(cmd)), file=sys.stderr, flush=True)
    with open(log, "w") as out_f:
        p = subprocess.Popen(cmd, stdout=out_f, stderr=subprocess.STDOUT, text=True, env=env)
        with PeakRss(p.pid) as rss:
            p.wait()
    out = open(log, errors="replace").read()
    if p.returncode != 0:
        sys.stderr.write(out[-6000:])
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)} (log: {log})")
    return out, rss.peak


def write_pairs(a, work, world):
    n = (a.warmup + a.steps) * a.batch * world
    src = [line for line in open(a.data) if line.strip()]
    if len(src) < n:
        sys.exit(f"{a.data} has {len(src)} pairs; {n} are needed ((warmup + steps) x batch x ranks)")
    path = os.path.join(work, f"pairs-{world}.jsonl")
    with open(path, "w") as f:
        f.writelines(src[:n])
    return path, n


def trainrun_job(a, path, run_dir, pairs, world):
    strategy = a.strategy if world > 1 else "single"
    with open(path, "w") as f:
        f.write(f"""[trainer]
max_steps = {a.warmup + a.steps}
global_batch_size = {a.batch * world}
micro_batch_size = {a.batch}
seed = {SEED}
log_every = 1
eval_every = 0
run_dir = "{run_dir}"
save_final_model = false
gradient_clip_val = {MAX_GRAD_NORM}
reference_model = "adapters_off"

[model]
plugin = "llama"
path = "{a.model}"
save_hf = false

[data]
plugin = "preference"
paths = ["{pairs}"]
tokenizer = "{a.model}"
max_length = {a.max_length}

[objective]
plugin = "dpo"
beta = {BETA}
loss_type = "sigmoid"

[optimizer]
plugin = "adamw"
lr = {LR}
weight_decay = 0.0

[strategy]
plugin = "{strategy}"

[accelerator]
plugin = "{'gloo-cpu' if world > 1 else 'cpu'}"
threads = {a.threads}

[[callbacks]]
plugin = "lora"
r = {LORA['r']}
lora_alpha = {float(LORA['alpha'])}
lora_dropout = {LORA['dropout']}
target_modules = ["all-linear"]
save_adapter = false

[[callbacks]]
plugin = "metrics"

[[callbacks]]
plugin = "tensorboard"
enabled = false

[[callbacks]]
plugin = "report"
enabled = false
""")


def measured(a, per_step_tokens, t_end, cpu_end, world):
    """Figures over the steps after the warm-up: t_end[i] / cpu_end[i] are the wall clock and
    rank 0's CPU time at the end of step i (index 0 = the end of the last warm-up step)."""
    tokens = sum(per_step_tokens[a.warmup:])
    wall = t_end[-1] - t_end[0]
    cpu = cpu_end[-1] - cpu_end[0]
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "tokens_per_cpu_s": tokens / (world * cpu), "step_tokens": per_step_tokens}


def run_trainrun(a, work, world, pairs, tag):
    name = f"trainrun-{world}-{tag}"
    run_dir = os.path.join(work, name)
    job = os.path.join(work, name + ".toml")
    trainrun_job(a, job, run_dir, pairs, world)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    out, peak = run_polled([a.trainrun, "--config", job, "--set", f"launch.nproc_per_node={world}"], env,
                           os.path.join(work, name + ".log"))
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()]
    rows = [r for r in rows if "step_time_s" in r and "eval_loss" not in r]
    total = a.warmup + a.steps
    if [r["step"] for r in rows] != list(range(1, total + 1)):
        sys.exit(f"{run_dir}/metrics.jsonl: steps {[r['step'] for r in rows]}, expected 1..{total}")
    G = a.batch * world
    # Cumulative input positions counted by trainrun at the end of each step: its running mean
    # tokens_per_s over the loop times the loop's time (samples_done / samples_per_s).
    done = [r["tokens_per_s"] * (r["step"] * G) / r["samples_per_s"] for r in rows]
    inputs = [round(x - y) for x, y in zip(done, [0.0] + done[:-1])]
    step_tokens = [n + 2 * G for n in inputs]  # a row of L real tokens has L - 1 input positions
    t_end = [r["elapsed_s"] for r in rows][a.warmup - 1:]
    cpu_end = [0.0]
    for r in rows[a.warmup:]:
        cpu_end.append(cpu_end[-1] + r["step_cpu_s"])
    res = measured(a, step_tokens, t_end, cpu_end, world)
    res["peak_rss"] = peak
    res["mem_peak_bytes"] = max(r.get("mem_peak_bytes", 0) for r in rows)
    res["loss"] = [r["loss"] for r in rows]
    res["reference"] = "adapters off" if "reference: adapters off" in out else "?"
    res["trainable"] = next((l.split("trainable ")[1].split()[0] for l in out.splitlines()
                             if l.startswith("lora:") and "trainable " in l), "?")
    return res


def run_trl(a, work, world, pairs, n, tag):
    name = f"trl-{world}-{tag}"
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads),
               MKL_NUM_THREADS=str(a.threads), TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TQDM_DISABLE="1",
               HF_DATASETS_CACHE=os.path.join(work, "hf-datasets"))
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)  # one rank: no process group (Accelerate's DistributedType.NO)
    if world > 1:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000),
                   WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    args = [sys.executable, os.path.abspath(__file__), "--worker", "--model", a.model, "--pairs", pairs,
            "--pairs-n", str(n), "--work", os.path.join(work, name), "--steps", str(a.steps),
            "--warmup", str(a.warmup), "--batch", str(a.batch), "--max-length", str(a.max_length),
            "--threads", str(a.threads), "--trl-attn", a.trl_attn]
    log = os.path.join(work, name + ".log")
    if world == 1:
        out, peak = run_polled(args, env, log)
    else:
        # One launcher process starting the ranks, so the polled tree holds all of them (torchrun's
        # environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
        launcher = ("import os, subprocess, sys\n"
                    f"ps = [subprocess.Popen({args!r}, env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r))) "
                    f"for r in range({world})]\n"
                    "sys.exit(max(p.wait() for p in ps))\n")
        out, peak = run_polled([sys.executable, "-c", launcher], env, log,
                               shown=f"{world} x (RANK=r LOCAL_RANK=r WORLD_SIZE={world}) " + " ".join(args))
    lines = [l for l in out.splitlines() if l.startswith('{"trl_result"')]
    if not lines:
        sys.exit(f"no result from the TRL worker (log: {log})")
    r = json.loads(lines[-1])["trl_result"]
    total = a.warmup + a.steps
    if r["steps_logged"] != list(range(1, total + 1)) or len(r["t"]) != total + 1:
        sys.exit(f"TRL logged steps {r['steps_logged']} ({len(r['t']) - 1} timed), expected 1..{total} (log: {log})")
    if r["world"] != world:
        sys.exit(f"TRL ran on {r['world']} process(es) ({r['distributed_type']}), expected {world} (log: {log})")
    cum = [int(x) for x in r["num_tokens"]]
    step_tokens = [x - y for x, y in zip(cum, [0] + cum[:-1])]
    # t[0] is on_train_begin, t[i] the end of step i.
    res = measured(a, step_tokens, r["t"][a.warmup:], r["cpu"][a.warmup:], world)
    res.update(peak_rss=peak, loss=r["loss"], reference=r["reference"], trainable=r["trainable"],
               threads=r["threads"], versions=r["versions"], distributed_type=r["distributed_type"])
    return res


def load():
    return open("/proc/loadavg").read().split()[:3]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainrun", default=None, help="the trainrun binary (default BUILD/bin/trainrun)")
    ap.add_argument("--build", default=os.environ.get("TRAINRUN_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--steps", type=int, default=8, help="measured steps (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=2, help="steps run first and not measured (>= 1)")
    ap.add_argument("--batch", type=int, default=4, help="pairs per rank per step")
    ap.add_argument("--max-length", type=int, default=256, help="prompt + completion tokens kept per sequence")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--ranks", default="1,2", help="rank counts to run, e.g. 1 or 1,2")
    ap.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"], help="trainrun's strategy above 1 rank")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds per rank count, alternating which side runs first; with more than one, "
                         "also the median of the rounds' ratios")
    ap.add_argument("--trl-attn", default="sdpa", choices=["sdpa", "eager"],
                    help="transformers' attn_implementation on the TRL side (default sdpa, its own default)")
    ap.add_argument("--data", default=None, help="preference pairs (default BUILD/cache/smollm2-dpo/train.jsonl)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--pairs", help=argparse.SUPPRESS)
    ap.add_argument("--pairs-n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.warmup < 1:
        sys.exit("--warmup must be at least 1 (the first step's start is not timed on trainrun's side)")
    if a.worker:
        return worker(a)
    a.trainrun = os.path.abspath(a.trainrun or os.path.join(a.build, "bin", "trainrun"))
    a.model = os.path.abspath(a.model or os.path.join(a.build, "cache", "smollm2-135m-instruct"))
    a.data = os.path.abspath(a.data or os.path.join(a.build, "cache", "smollm2-dpo", "train.jsonl"))
    for path, how in ((a.trainrun, "build it: scripts/run or scripts/test"),
                      (os.path.join(a.model, "model.safetensors"), "scripts/prepare-smollm2-dpo (or scripts/run configs/smollm2-dpo.toml)"),
                      (a.data, "scripts/prepare-smollm2-dpo (or scripts/run configs/smollm2-dpo.toml)")):
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: {how}")
    ranks = [int(x) for x in a.ranks.split(",")]
    work = tempfile.mkdtemp(prefix="bench-dpo-")
    print(f"load average before: {' '.join(load())}")
    print(f"SmolLM2-135M-Instruct, DPO sigmoid beta {BETA}, LoRA r {LORA['r']} alpha {LORA['alpha']} all-linear "
          f"dropout 0, reference = adapters off, fp32; {a.batch} pairs per rank per step, max_length "
          f"{a.max_length}, {a.threads} thread(s) per rank, {a.steps} measured steps after {a.warmup} warm-up "
          f"step(s); above 1 rank trainrun {a.strategy} over gloo-cpu, TRL DDP over gloo; TRL attention "
          f"{a.trl_attn}; work dir {work}", flush=True)
    header = (f"{'ranks':>5} {'tok/pair':>8} {'trainrun tok/s':>15} {'TRL tok/s':>10} {'ratio':>6}   "
              f"{'trainrun tok/CPU-s':>18} {'TRL tok/CPU-s':>13} {'ratio':>6}   "
              f"{'trainrun RSS':>12} {'TRL RSS':>8} {'ratio':>6}  same tokens")
    printed_header = False
    summary, results = [], []
    for world in ranks:
        pairs, n = write_pairs(a, work, world)
        ratios = []
        for rnd in range(a.rounds):
            tag = f"r{rnd + 1}"
            if rnd % 2 == 0:
                t = run_trainrun(a, work, world, pairs, tag)
                p = run_trl(a, work, world, pairs, n, tag)
            else:
                p = run_trl(a, work, world, pairs, n, tag)
                t = run_trainrun(a, work, world, pairs, tag)
            results.append({"ranks": world, "round": rnd + 1, "trainrun": t, "trl": p})
            same = t["step_tokens"] == p["step_tokens"]
            if not printed_header:
                v = p["versions"]
                print(f"TRL {v['trl']}, transformers {v['transformers']}, torch {v['torch']}; TRL reference: "
                      f"{p['reference']}, trainrun reference: {t['reference']}; trainable parameters trainrun "
                      f"{t['trainable']}, TRL {p['trainable']}; TRL threads per rank {p['threads']}")
                print(header)
                printed_header = True
            tok_pair = t["tokens"] / (a.steps * a.batch * world)
            r3 = (t["tokens_per_s"] / p["tokens_per_s"], t["tokens_per_cpu_s"] / p["tokens_per_cpu_s"],
                  t["peak_rss"] / p["peak_rss"])
            ratios.append(r3)
            print(f"{world:>5} {tok_pair:>8.1f} {t['tokens_per_s']:>15.1f} {p['tokens_per_s']:>10.1f} {r3[0]:>5.2f}x   "
                  f"{t['tokens_per_cpu_s']:>18.1f} {p['tokens_per_cpu_s']:>13.1f} {r3[1]:>5.2f}x   "
                  f"{t['peak_rss'] / 2**20:>8.0f} MiB {p['peak_rss'] / 2**20:>4.0f} MiB {r3[2]:>5.2f}x  "
                  f"{'yes' if same else 'NO'}", flush=True)
            if not same:
                print(f"      tokens per step differ: trainrun {t['step_tokens']}, TRL {p['step_tokens']}", flush=True)
            print(f"      wall of the {a.steps} measured steps: trainrun {t['wall_s']:.1f} s, TRL {p['wall_s']:.1f} s "
                  f"({t['tokens']} tokens); trainrun mem_peak_bytes (tracked tensors) "
                  f"{t['mem_peak_bytes'] / 2**20:.0f} MiB; loss at the last step trainrun {t['loss'][-1]:.4f}, "
                  f"TRL {p['loss'][-1]:.4f} (LoRA A is drawn differently)", flush=True)
        med = [statistics.median(x[i] for x in ratios) for i in range(3)]
        if a.rounds > 1:
            print(f"{world:>5} median of {a.rounds} rounds: tokens/s {med[0]:.2f}x (rounds "
                  f"{', '.join(f'{x[0]:.2f}' for x in ratios)}), tok/CPU-s {med[1]:.2f}x, peak RSS {med[2]:.2f}x",
                  flush=True)
        summary.append((world, med))
    for world, med in summary:
        print(f"{world} rank(s): tokens/s {med[0]:.2f}x (goal >= 1.3x: {'met' if med[0] >= 1.3 else 'not met'}), "
              f"peak RSS {med[2]:.2f}x (goal <= 0.7x: {'met' if med[2] <= 0.7 else 'not met'})")
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump({"args": vars(a), "results": results}, f, indent=1)
    print(f"load average after: {' '.join(load())}")


if __name__ == "__main__":
    main()
