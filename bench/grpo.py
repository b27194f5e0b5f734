#!/usr/bin/env python3
"""A GRPO step on the CPU: trainrun's `grpo` objective vs TRL 1.16's GRPOTrainer with PEFT, on
the same model (SmolLM2-135M-Instruct), LoRA (r 16, all linear layers), prompts, batch
(--prompts prompts x --generations completions per rank and step), max_completion_length
(--new), sampling (temperature 1), one reward (a length penalty: cheap, so the step is the
model's work), fp32, --threads threads per rank; at --world 1 and 2 ranks (trainrun: ddp over
gloo-cpu; TRL: torchrun + DDP over gloo). Each side runs --steps steps; the figure is the median
wall time of steps 2.. (the first includes warm-up), read from each side's own log (trainrun:
step_time_s in metrics.jsonl; TRL: a callback's wall time between on_step_end calls), with the
mean completion length each side generated (sampling differs, so the tokens per step are
printed beside the times, and the ratio is also given per generated token).

  python bench/grpo.py [--world 1,2] [--steps 5] [--prompts 2] [--generations 8] [--new 64]

Needs the reference venv (scripts/venv) and the SmolLM2 model in build/cache
(scripts/prepare-smollm2-grpo makes it).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROMPTS = ["Once upon a time, in a small village by the sea,", "The history of the bicycle begins",
           "Here is a recipe for a simple tomato soup:", "The most important rule of writing is",
           "A long walk through the forest taught me", "Dear diary, today something strange happened:",
           "The three laws of motion say that", "In the year 2150, cities were"]


def trl_worker(a):
    """One TRL process (under torchrun at world > 1): GRPOTrainer with PEFT, timed per step."""
    import time

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(a.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    n = a.prompts * world * (a.steps + 1)
    ds = Dataset.from_list([{"prompt": PROMPTS[i % len(PROMPTS)]} for i in range(n)])
    tok = AutoTokenizer.from_pretrained(a.model)

    def length_penalty(completions, completion_ids, **kw):
        return [-len(ids) / a.new for ids in completion_ids]

    stamps, lengths = [], []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    args = GRPOConfig(output_dir=a.out, per_device_train_batch_size=a.prompts * a.generations,
                      gradient_accumulation_steps=1, learning_rate=1e-5, max_steps=a.steps, logging_steps=1,
                      save_strategy="no", report_to="none", use_cpu=True, bf16=False, fp16=False,
                      num_generations=a.generations, max_completion_length=a.new, temperature=1.0,
                      disable_tqdm=True, dataloader_num_workers=0, seed=1)
    args.model_init_kwargs = {"dtype": torch.float32}
    peft = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=a.model, reward_funcs=[length_penalty], args=args, train_dataset=ds,
                          processing_class=tok, peft_config=peft, callbacks=[Clock()])
    stamps.append(time.perf_counter())
    trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        steps = [b - a_ for a_, b in zip(stamps, stamps[1:])]
        print("TRL_RESULT " + json.dumps({"steps": steps, "lengths": lengths}), flush=True)


def run_trl(a, world):
    out = tempfile.mkdtemp(prefix="grpo-bench-trl-")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    args = [__file__, "--trl-worker", "--model", a.model, "--threads", str(a.threads), "--steps", str(a.steps),
            "--prompts", str(a.prompts), "--generations", str(a.generations), "--new", str(a.new), "--out", out]
    cmd = [sys.executable] + args if world == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_port", "29611"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in r.stdout.splitlines():
        if line.startswith("TRL_RESULT "):
            return json.loads(line[len("TRL_RESULT "):])
    sys.exit(f"TRL at {world} rank(s) failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")


def run_trainrun(a, world):
    d = tempfile.mkdtemp(prefix="grpo-bench-trainrun-")
    data = os.path.join(d, "prompts.jsonl")
    with open(data, "w") as f:
        for i in range(a.prompts * world * (a.steps + 1)):
            f.write(json.dumps({"prompt": PROMPTS[i % len(PROMPTS)]}) + "\n")
    job = f"""
[launch]
nproc_per_node = {world}
[trainer]
max_steps = {a.steps}
global_batch_size = {a.prompts * a.generations * world}
seed = 1
run_dir = "{d}/run"
log_every = 1
save_final_model = false
[model]
plugin = "llama"
path = "{a.model}"
[data]
plugin = "prompts"
paths = ["{data}"]
tokenizer = "{a.model}"
[objective]
plugin = "grpo"
num_generations = {a.generations}
max_completion_length = {a.new}
[[rewards]]
plugin = "length"
kind = "linear"
max_completion_length = {a.new}
[strategy]
plugin = "{'ddp' if world > 1 else 'single'}"
[accelerator]
plugin = "{'gloo-cpu' if world > 1 else 'cpu'}"
threads = {a.threads}
[optimizer]
plugin = "adamw"
lr = 1e-5
[[callbacks]]
plugin = "lora"
r = 16
lora_alpha = 32
target_modules = ["all-linear"]
[[callbacks]]
plugin = "metrics"
"""
    path = os.path.join(d, "job.toml")
    open(path, "w").write(job)
    r = subprocess.run([a.trainrun, "--config", path], capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        sys.exit(f"trainrun at {world} rank(s) failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    rows = [json.loads(l) for l in open(os.path.join(d, "run", "metrics.jsonl")) if '"loss"' in l]
    return {"steps": [r["step_time_s"] for r in rows],
            "lengths": [r["completions/mean_length"] for r in rows if "completions/mean_length" in r],
            "generation_s": [r.get("generation_s", 0) for r in rows]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "cache", "smollm2-135m-instruct"))
    ap.add_argument("--trainrun", default=os.path.join(ROOT, "build", "bin", "trainrun"))
    ap.add_argument("--world", default="1,2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=2, help="prompts per rank and step")
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--trl-worker", action="store_true")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.trl_worker:
        return trl_worker(a)
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        subprocess.run([os.path.join(ROOT, "scripts", "prepare-smollm2-grpo")], check=True)
    print(f"GRPO step, SmolLM2-135M-Instruct + LoRA r16 all-linear, fp32, {a.threads} thread(s)/rank; per rank "
          f"and step: {a.prompts} prompts x {a.generations} completions of <= {a.new} tokens; median of steps "
          f"2..{a.steps}")
    for world in [int(w) for w in a.world.split(",")]:
        ours, trl = run_trainrun(a, world), run_trl(a, world)
        t_ours, t_trl = statistics.median(ours["steps"][1:]), statistics.median(trl["steps"][1:])
        l_ours, l_trl = statistics.mean(ours["lengths"]), statistics.mean(trl["lengths"])
        print(f"world {world}: trainrun {t_ours:.2f} s/step (generation {statistics.median(ours['generation_s'][1:]):.2f} s, "
              f"mean completion {l_ours:.1f} tokens), TRL + PEFT {t_trl:.2f} s/step (mean completion {l_trl:.1f} "
              f"tokens): {t_trl / t_ours:.2f}x; per generated token {(t_trl / l_trl) / (t_ours / l_ours):.2f}x",
              flush=True)


main()
