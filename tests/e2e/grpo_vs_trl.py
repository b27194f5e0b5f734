"""GRPO against TRL: trainrun's `grpo` objective (the `prompts` dataset, [[rewards]], batched
KV-cache rollouts) step by step against TRL 1.16's GRPOTrainer on the same tiny random Llama, the
same prompts and the same optimizer, TRL REPLAYING trainrun's rollouts: its generation returns
the completions trainrun generated for that step (read from <run_dir>/completions/rank-0.jsonl,
checked to continue the very prompt ids TRL tokenized) and its one reward function returns the
combined reward trainrun logged for each of them. So both sides train on the same completions
with the same rewards, and everything downstream is compared: advantages (through the loss and
the clip ratios), the loss, the KL, the entropy, the clip ratios, the reward statistics, the
completion lengths, the gradient norm, every step.

Cells (loss_type / adapter / num_iterations), each STEPS AdamW steps in fp32 on one CPU thread,
BATCH completions per step (BATCH / G prompts, G = 4 completions each) drawn in trainrun's prompt
order (TRL's sampler is given the same order, each prompt repeated G times, each prompt batch
num_iterations times, as its RepeatSampler does), max_completion_length 12 (some completions are
cut), temperature 0.9 (TRL scores logits / temperature, as trainrun):
  {grpo, bnpo, dr_grpo, dapo} x {none (full fine-tuning), lora} x {mu 1, mu 2}, beta 0, and
  kl/lora: dapo with beta 0.05 (reference: adapters off on both sides), scale_rewards batch,
  epsilon_high 0.28 and mask_truncated_completions; gspo/lora/2: GSPO's sequence-level ratio
  with its tiny clipping range (3e-4 / 4e-4), Dr. GRPO's unscaled advantages, delta 1.5.
Checked per cell: every figure TRL logs that trainrun's metrics.jsonl also has, |trainrun - TRL|
<= max(rel * |TRL|, 1e-6) with rel 1e-5 at step 1 and 1e-4 later (optimizer steps compound
float32 rounding, as in the preference checks).

With --strategy ddp|ring|fsdp|zero3 trainrun runs each cell at one rank and at --world ranks
(gloo-cpu) instead of TRL: the rollouts must be the same completions (a completion's draws are
seeded by its prompt's place in the step's global batch, not by its rank), and every figure of
rank 0's metrics equals the one-rank run's (1e-5 relative at step 1, 1e-4 after). bnpo is left
out there: its token mean is per micro-batch, and a rank's micro-batch holds other completions.

usage: grpo_vs_trl.py TRAINRUN WORK [--cells all|short|CELL,...] [--strategy S [--world N]]
  short (CI): grpo/none/1, dapo/lora/2, bnpo/lora/1, dr_grpo/none/2, kl/lora/1
  strategies short: grpo/none/2, dapo/lora/2, dr_grpo/lora/1, kl/lora/1
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from trl_harness import ADAMW, load_initial_lora_a, make_tiny_model, metrics_files, table  # noqa: E402

STEPS, SEED, LR, G, BATCH, MAX_NEW, TEMP = 4, 5, 2e-3, 4, 8, 12, 0.9
LORA_TABLE = {"plugin": "lora", "r": 4, "lora_alpha": 8.0, "target_modules": ["all-linear"]}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOL = {1: 1e-5}
TOL_LATER = 1e-4
ABS_FLOOR = 1e-6
METRIC_ALIAS = {"learning_rate": "lr"}
# Logged by TRL but not by trainrun (or not the same quantity): printed, not compared.
NOT_COMPARED = {"epoch", "step", "num_tokens", "step_time", "rewards/replay/mean", "rewards/replay/std"}
REQUIRED = ["loss", "grad_norm", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
            "clip_ratio/region_mean"]
# Logged at the steps that made a rollout (every num_iterations steps), as TRL logs them.
REQUIRED_ROLLOUT = ["reward", "reward_std", "frac_reward_zero_std", "completions/mean_length",
                    "completions/clipped_ratio"]
PROMPTS = ["The cat", "Once upon a time", "Q: what is two plus two? A:", "Rain falls on",
           "Hello, my name is", "A list of colours:", "In the beginning", "Summer nights are",
           "The quick brown fox", "Numbers: 1, 2,", "Dear friend,", "Why is the sky blue?"]


def cells():
    out = {}
    for loss in ("grpo", "bnpo", "dr_grpo", "dapo"):
        for adapter in ("none", "lora"):
            for mu in (1, 2):
                out[f"{loss}/{adapter}/{mu}"] = ({"loss_type": loss, "num_iterations": mu}, adapter)
    out["kl/lora/1"] = ({"loss_type": "dapo", "num_iterations": 1, "beta": 0.05, "scale_rewards": "batch",
                         "epsilon_high": 0.28, "mask_truncated_completions": True}, "lora")
    out["gspo/lora/2"] = ({"loss_type": "grpo", "num_iterations": 2, "importance_sampling_level": "sequence",
                           "epsilon": 3e-4, "epsilon_high": 4e-4, "scale_rewards": "none", "delta": 1.5}, "lora")
    return out


CELLS = cells()
SHORT = ["grpo/none/1", "dapo/lora/2", "bnpo/lora/1", "dr_grpo/none/2", "kl/lora/1"]

ap = argparse.ArgumentParser()
ap.add_argument("trainrun")
ap.add_argument("work")
ap.add_argument("--cells", default="short")
ap.add_argument("--strategy", default="single", choices=["single", "ddp", "ring", "fsdp", "zero3"])
ap.add_argument("--world", type=int, default=2)
A = ap.parse_args()
STRATEGIES = {"ddp": ["strategy.plugin=ddp"], "ring": ["strategy.plugin=ring"], "fsdp": ["strategy.plugin=fsdp"],
              "zero3": ["strategy.plugin=zero", "strategy.stage=3"]}
SHORT_STRATEGIES = ["grpo/none/2", "dapo/lora/2", "dr_grpo/lora/1", "kl/lora/1"]
failures = []


def fail(msg):
    print("FAIL:", msg, flush=True)
    failures.append(msg)


def make_model(out, tokenizer_dir):
    """trl_harness's tiny Llama, EOS a little likelier, so that some completions end early."""
    from chat_data import write_tokenizer

    write_tokenizer(tokenizer_dir, seed=1, count=48)
    make_tiny_model(out, tokenizer_dir, eos_boost=0.25)


def write_job(path, model_dir, data_path, run_dir, objective, adapter, lr=LR, steps=STEPS):
    job = table("trainer", {"max_steps": steps, "global_batch_size": BATCH, "seed": SEED, "log_every": 1,
                            "run_dir": run_dir})
    job += table("model", {"plugin": "llama", "path": model_dir})
    job += table("data", {"plugin": "prompts", "paths": [data_path], "tokenizer": model_dir})
    job += table("objective", dict({"plugin": "grpo", "num_generations": G, "max_completion_length": MAX_NEW,
                                    "temperature": TEMP}, **objective))
    job += table("optimizer", {"plugin": "adamw", "lr": lr})
    job += table("accelerator", {"plugin": "cpu", "threads": 1})
    job += table("rewards", {"plugin": "length", "kind": "linear", "max_completion_length": MAX_NEW}, array=True)
    job += table("rewards", {"plugin": "format", "pattern": "[aeiou]", "whole": False, "weight": 0.5}, array=True)
    job += table("callbacks", {"plugin": "metrics"}, array=True)
    if adapter == "lora":
        job += table("callbacks", LORA_TABLE, array=True)
    with open(path, "w") as f:
        f.write(job)


def run_trainrun(job, world=1):
    cmd = [A.trainrun, "--config", job]
    if world > 1:
        for x in STRATEGIES[A.strategy] + [f"launch.nproc_per_node={world}", "accelerator.plugin=gloo-cpu",
                                           "accelerator.timeout_s=60"]:
            cmd += ["--set", x]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def read_rollouts(run_dir, rank=0):
    """{first step of the rollout: [completion rows in order]} of one rank."""
    out = {}
    for line in open(os.path.join(run_dir, "completions", f"rank-{rank}.jsonl")):
        row = json.loads(line)
        out.setdefault(row["step"], []).append(row)
    return out


def strategies_cell(cell, model_dir, data_path, cell_dir, objective, adapter):
    """One cell at one rank and at A.world ranks under A.strategy: the same completions, the
    same figures."""
    runs = {}
    for world in (1, A.world):
        job = os.path.join(cell_dir, f"job-{world}.toml")
        write_job(job, model_dir, data_path, os.path.join(cell_dir, f"run-{world}"), objective, adapter)
        rc, out = run_trainrun(job, world)
        open(os.path.join(cell_dir, f"log-{world}"), "w").write(out)
        if rc != 0:
            fail(f"{cell}: trainrun at {world} rank(s) exited {rc}:\n{out[-1500:]}")
            return
        runs[world] = os.path.join(cell_dir, f"run-{world}")
    def completions(run_dir, world):
        out = {}
        for rank in range(world):
            for step, rows in read_rollouts(run_dir, rank).items():
                out.setdefault(step, []).extend((r["prompt_ids"], r["completion_ids"]) for r in rows)
        return {k: sorted(v) for k, v in out.items()}
    one, many = completions(runs[1], 1), completions(runs[A.world], A.world)
    if one != many:
        fail(f"{cell}: the completions at {A.world} ranks are not those of one rank")
    ref = metrics_files(runs[1]).get("metrics.jsonl", {})
    ours = metrics_files(runs[A.world]).get("metrics.jsonl", {})
    worst = compare(cell, {s: dict(r, learning_rate=r["lr"]) for s, r in ref.items()}, ours)
    n = sum(len(v) for v in one.values())
    print(f"{cell}: {A.strategy} at {A.world} ranks vs one rank: {n} completions identical, "
          f"max rel diff {worst:.1e}", flush=True)


def trainrun_prompt_order(n, prompts_per_step, steps):
    """trainrun's prompt batches (core/src/sampler.cpp, one rank): epoch e is randperm(n) from a
    generator seeded SEED * 1000003 + e, cut into batches of prompts_per_step (drop_last)."""
    batches, epoch = [], 0
    while len(batches) < steps:
        g = torch.Generator().manual_seed(SEED * 1000003 + epoch)
        perm = torch.randperm(n, generator=g).tolist()
        for k in range(n // prompts_per_step):
            batches.append(perm[k * prompts_per_step:(k + 1) * prompts_per_step])
        epoch += 1
    return batches[:steps]


def run_trl(cell, model_dir, data_path, out_dir, init_adapter, rollouts):
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    objective, adapter = CELLS[cell]
    mu = objective["num_iterations"]
    fields = {k: v for k, v in objective.items()}
    args = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=BATCH, gradient_accumulation_steps=1,
                      learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
                      weight_decay=ADAMW["weight_decay"], adam_beta1=ADAMW["beta1"], adam_beta2=ADAMW["beta2"],
                      adam_epsilon=ADAMW["eps"], optim="adamw_torch", max_grad_norm=0.0, max_steps=STEPS,
                      logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none", seed=SEED,
                      data_seed=SEED, use_cpu=True, bf16=False, fp16=False, disable_dropout=True,
                      dataloader_num_workers=0, disable_tqdm=True, num_generations=G,
                      max_completion_length=MAX_NEW, temperature=TEMP, **fields)
    args.model_init_kwargs = {"dtype": torch.float32, "attn_implementation": "eager"}
    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = load_dataset("json", data_files=data_path, split="train")
    peft_config = (LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS, bias="none",
                              task_type="CAUSAL_LM") if adapter == "lora" else None)
    order = trainrun_prompt_order(len(ds), BATCH // G, (STEPS + mu - 1) // mu)
    state = {"rollout": None}

    class Sampler(torch.utils.data.Sampler):  # trainrun's prompt batches, as RepeatSampler lays them out
        def __len__(self):
            return len(order) * mu * BATCH

        def __iter__(self):
            for batch in order:
                for _ in range(mu):
                    for i in batch:
                        yield from [i] * G

    def replay_reward(prompts, completions, completion_ids, **kw):
        return [r["reward"] for r in state["rollout"]]

    class Trainer(GRPOTrainer):
        def _get_train_sampler(self, *a, **k):
            return Sampler()

        def _generate_single_turn(self, prompt_ids, *a, **k):
            step = self.state.global_step + 1
            rows = rollouts.get(step)
            if rows is None or len(rows) != len(prompt_ids):
                raise RuntimeError(f"no rollout of {len(prompt_ids)} completions at step {step} in trainrun's log")
            for r, p in zip(rows, prompt_ids):
                if list(p) != r["prompt_ids"]:
                    raise RuntimeError(f"step {step}: TRL's prompt ids {list(p)} are not trainrun's {r['prompt_ids']}")
            state["rollout"] = rows
            return [r["completion_ids"] for r in rows], None

    replay_reward.__name__ = "replay"
    trainer = Trainer(model=model_dir, reward_funcs=[replay_reward], args=args, train_dataset=ds,
                      processing_class=tok, peft_config=peft_config)
    trainer.remove_callback(PrinterCallback)
    if init_adapter:
        load_initial_lora_a(trainer.model, init_adapter)
    trainer.train()
    return {r["step"]: r for r in trainer.state.log_history if "loss" in r and "train_runtime" not in r}


def compare(cell, trl, ours_by_step):
    mu = CELLS[cell][0]["num_iterations"]
    beta = CELLS[cell][0].get("beta", 0)
    worst = 0.0
    for step, ref in sorted(trl.items()):
        ours = ours_by_step.get(step)
        if ours is None:
            fail(f"{cell}: trainrun has no row for step {step}")
            continue
        for k in REQUIRED + (REQUIRED_ROLLOUT if (step - 1) % mu == 0 else []) + (["kl"] if beta else []):
            if k not in ours:
                fail(f"{cell}: trainrun's step {step} lacks '{k}'")
        for k, r in sorted(ref.items()):
            if k in NOT_COMPARED or k.endswith("_s") or k in ("lr", "rank", "elapsed_s", "samples_per_s",
                                                               "tokens_per_s", "step_cpu_s") \
                    or r is None or isinstance(r, str) or k.startswith("mem_") or k.startswith("comm_") \
                    or k.startswith("ddp_") or k.startswith("fsdp_") or k.startswith("zero_") \
                    or k.startswith("generation_"):
                continue
            v = ours.get(METRIC_ALIAS.get(k, k))
            if v is None:
                if step == 1:
                    print(f"    {cell} step {step}: {k} = {r:.6g} in TRL, not logged by trainrun")
                continue
            tol = max(TOL.get(step, TOL_LATER) * abs(r), ABS_FLOOR)
            d = abs(v - r) if math.isfinite(v) else math.inf
            if abs(r) > 1e-3:
                worst = max(worst, d / abs(r))
            if d > tol:
                fail(f"{cell}: step {step} {k}: trainrun {v!r}, TRL {r!r} (|diff| {d:.3g} > {tol:.3g})")
    return worst


def errors(model_dir, data_path):
    """Bad input: exit 2 before training, naming what is wrong."""
    def expect(name, needles, objective=None, sets=(), data=None, edit=None):
        d = os.path.join(A.work, "error-" + name)
        os.makedirs(d, exist_ok=True)
        job = os.path.join(d, "job.toml")
        write_job(job, model_dir, data or data_path, os.path.join(d, "run"), objective or {}, "none", steps=1)
        if edit:
            text = edit(open(job).read())
            open(job, "w").write(text)
        cmd = [A.trainrun, "--config", job]
        for x in sets:
            cmd += ["--set", x]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        out = r.stdout + r.stderr
        if r.returncode != 2:
            fail(f"error {name}: exit {r.returncode}, expected 2:\n{out[-800:]}")
            return
        for n in needles:
            if n not in out:
                fail(f"error {name}: the message does not say '{n}':\n{out[-800:]}")
        print(f"error {name}: exit 2, {out.strip().splitlines()[-1][:200]}")

    expect("groups", ["global_batch_size 8", "num_generations 3"], objective={"num_generations": 3})
    long_prompt = os.path.join(A.work, "long.jsonl")
    with open(long_prompt, "w") as f:
        f.write(json.dumps({"prompt": "short"}) + "\n" + json.dumps({"prompt": "word " * 200}) + "\n")
    expect("long-prompt", [f"{long_prompt}:2", "max_prompt_length = 64"], data=long_prompt,
           sets=["data.max_prompt_length=64"])
    no_prompt = os.path.join(A.work, "no-prompt.jsonl")
    with open(no_prompt, "w") as f:
        f.write(json.dumps({"question": "Hi"}) + "\n")
    expect("no-prompt-field", [f"{no_prompt}:1", '"prompt"'], data=no_prompt)
    expect("no-rewards", ["[[rewards]]"], edit=lambda t: "\n\n".join(
        b for b in t.split("\n\n") if not b.startswith("[[rewards]]")))
    expect("beta-full-finetune", ["beta > 0", "lora"], objective={"beta": 0.1})
    expect("missing-field", ["answer", "solution_text"],
           edit=lambda t: t + '[[rewards]]\nplugin = "accuracy"\nname = "answer"\nfield = "solution_text"\n')
    expect("prompts-without-objective", ["prompts", "grpo"], edit=lambda t: "\n\n".join(
        b for b in t.split("\n\n") if not b.startswith("[objective]")))


def main():
    t0 = time.time()
    import datasets
    import transformers
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    shutil.rmtree(A.work, ignore_errors=True)
    os.makedirs(A.work)
    model_dir = os.path.join(A.work, "llama")
    make_model(model_dir, os.path.join(A.work, "tokenizer"))
    data_path = os.path.join(A.work, "prompts.jsonl")
    with open(data_path, "w") as f:
        for i, p in enumerate(PROMPTS):
            f.write(json.dumps({"prompt": p, "solution": str(i)}) + "\n")
    short = SHORT if A.strategy == "single" else SHORT_STRATEGIES
    names = list(CELLS) if A.cells == "all" else short if A.cells == "short" else A.cells.split(",")
    if A.strategy != "single":
        names = [n for n in names if not n.startswith("bnpo/")]
    print(f"{len(PROMPTS)} prompts; {BATCH} completions ({BATCH // G} prompts x {G}) per step, {STEPS} steps, "
          f"lr {LR}, seed {SEED}, max_completion_length {MAX_NEW}, temperature {TEMP}; cells: {', '.join(names)}")
    for cell in names:
        if cell not in CELLS:
            sys.exit(f"unknown cell '{cell}' (known: {', '.join(CELLS)})")
        objective, adapter = CELLS[cell]
        cell_dir = os.path.join(A.work, cell.replace("/", "-"))
        os.makedirs(cell_dir)
        if A.strategy != "single":
            strategies_cell(cell, model_dir, data_path, cell_dir, objective, adapter)
            continue
        init_adapter = None
        if adapter == "lora":
            probe = os.path.join(cell_dir, "init-run")
            write_job(os.path.join(cell_dir, "init.toml"), model_dir, data_path, probe, objective, adapter,
                      lr=0.0, steps=1)
            rc, out = run_trainrun(os.path.join(cell_dir, "init.toml"))
            if rc != 0:
                fail(f"{cell}: the lr = 0 run for trainrun's initial adapter exited {rc}:\n{out[-1500:]}")
                continue
            init_adapter = os.path.join(probe, "adapter")
        job = os.path.join(cell_dir, "job.toml")
        write_job(job, model_dir, data_path, os.path.join(cell_dir, "run"), objective, adapter)
        t = time.time()
        rc, out = run_trainrun(job)
        open(os.path.join(cell_dir, "log"), "w").write(out)
        if rc != 0:
            fail(f"{cell}: trainrun exited {rc}:\n{out[-1500:]}")
            continue
        t_ours = time.time() - t
        rollouts = read_rollouts(os.path.join(cell_dir, "run"))
        cut = sum(r["finish"] == "length" for rows in rollouts.values() for r in rows)
        n = sum(len(rows) for rows in rollouts.values())
        t = time.time()
        try:
            trl = run_trl(cell, model_dir, data_path, os.path.join(cell_dir, "trl"), init_adapter, rollouts)
        except Exception as e:  # noqa: BLE001 - a failure of the cell, reported
            fail(f"{cell}: TRL failed: {type(e).__name__}: {e}")
            continue
        with open(os.path.join(cell_dir, "trl.json"), "w") as f:
            json.dump(trl, f, indent=1)
        if sorted(trl) != list(range(1, STEPS + 1)):
            fail(f"{cell}: TRL logged steps {sorted(trl)}")
        ours = metrics_files(os.path.join(cell_dir, "run")).get("metrics.jsonl", {})
        worst = compare(cell, trl, ours)
        last = trl.get(STEPS, {})
        print(f"{cell}: {n} completions ({cut} cut), trainrun {t_ours:.1f} s, TRL {time.time() - t:.1f} s; "
              f"max rel diff {worst:.1e}; step {STEPS}: loss {last.get('loss', float('nan')):.6g}, "
              f"clip_ratio/region_mean {last.get('clip_ratio/region_mean', float('nan')):.3g}"
              + (f", kl {last['kl']:.3g}" if "kl" in last else ""), flush=True)
    if A.strategy == "single" and A.cells == "short":
        errors(model_dir, data_path)
    print(f"{len(names)} cells, {len(failures)} failures, {time.time() - t0:.0f} s")
    if failures:
        print("failures:\n  " + "\n  ".join(f.splitlines()[0] for f in failures))
        sys.exit(1)
    print("OK")


main()
