"""KTO against TRL: trainrun's `kto` objective with the `unpaired` dataset, step by step against
TRL 1.16's KTOTrainer on the same tiny random Llama, the same examples and the same optimizer
(docs/notes/trl-preference-spec.md (d) says what TRL computes).

The cells, each 10 AdamW steps in fp32 on one CPU thread, 8 examples per step drawn in
trainrun's order (core/src/sampler.cpp; TRL's trainer is given a sampler that draws the same),
the KL completions rotated within blocks of 8 consecutive examples on both sides (TRL:
per_device_train_batch_size 8; trainrun: kl_block_size 8), so a step's KL rows are those of
examples from several blocks, which checks that the pairing belongs to the example:

  kto/none     loss_type kto, 24 unpaired rows {prompt, completion, label} (14 desirable, 10
               undesirable), undesirable_weight 1.3; full fine-tuning (reference: a frozen copy
               in TRL, the initial model's values precomputed in trainrun)
  kto/lora     the same with LoRA r 4 on every linear layer (reference: adapters off on both
               sides); trainrun runs once with lr 0 first and TRL's model gets that lora_A
  apo/none     loss_type apo_zero_unpaired on 16 preference pairs {prompt, chosen, rejected}
               that both sides unpair (32 examples), no KL rows (kl_block_size 0)
  kto-chat/none  kto/none's examples as conversations (a user turn, a system turn on every
               fourth, the assistant's completion), rendered with the tokenizer's ChatML template

Checked, per cell: every figure of TRL's log_history at steps 1 and 10 that trainrun's
metrics.jsonl also has, |trainrun - TRL| <= max(rel * |TRL|, 1e-6), rel = 1e-5 at step 1 and
1e-4 at step 10 (and the loss and kl at every step in between, 1e-4); trainrun must log
REQUIRED. Then trainrun's own errors (exit 2): a row without a label, a label of the wrong type,
an empty completion, a paired row among unpaired ones (each naming FILE:LINE and the field),
kto without KL rows, the unpaired data without an objective, kto on the `preference` dataset.

With --strategy ddp|fsdp|zero3 trainrun runs at --world ranks (gloo-cpu; default 2 ranks, cells
kto/none and kto/lora, no error checks) and every rank's metrics file is compared with the one
single-process TRL run, as above. That comparison is exact in principle: each rank's micro-batch
has 8 / world examples with their KL rows (the rows belong to the examples, so the step's KL rows
are the same set), trainrun averages the ranks' KL means before clamping as TRL does
(ObjectiveForward::comm), which with equal counts per rank is the mean over the step's 8 KL rows,
TRL's single-process estimate, and every other figure is a sum over the ranks divided by a count.
--micro M below 8 / world accumulates: a micro-batch's KL estimate is then over the KL rows of the
ranks' micro-batches only (4 rows at 2 ranks of micro 2), which TRL computes with
per_device_train_batch_size 4 and gradient_accumulation_steps 2 (those 4 are the same examples,
positions 4k..4k+3 of the step, as trainrun's ranks take every world-th example of the step), so
TRL runs that way, the KL blocks are 4 on both sides, and loss, kl, rewards/margins, grad_norm and
lr are compared (TRL logs each as the mean over the micro-batches of a per-micro-batch figure, as
trainrun does); TRL logs the label and token means as unweighted means over the micro-batches,
trainrun as means over the step's examples (tokens), so those are printed, not compared.
--eval-filler adds an evaluation with filler batches, checked against one process's
(eval_with_filler).

usage: kto_vs_trl.py TRAINRUN WORK [--cells kto/none,kto/lora,apo/none,kto-chat/none] [--no-errors]
                     [--strategy single|ddp|fsdp|zero3 [--world N] [--micro M] [--eval-filler]]
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
from trl_harness import load_initial_lora_a, make_tiny_model, metrics_files, table, trainrun_order_sampler, trl_common_args  # noqa: E402

STEPS, SEED, LR, MAX_LENGTH, BATCH = 10, 3, 1e-3, 1024, 8
LORA_TABLE = {"plugin": "lora", "r": 4, "lora_alpha": 8.0, "target_modules": ["all-linear"]}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
METRIC_ALIAS = {"learning_rate": "lr"}
REQUIRED = ["loss", "kl", "entropy", "rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected",
            "logits/chosen", "logits/rejected"]
SKIP = {"epoch", "step"}
# With accumulation TRL logs these as unweighted means of the micro-batches' means (trainrun:
# over the step's examples or tokens), so they are printed and not compared.
PER_MICRO_MEANS = {"entropy", "logits/chosen", "logits/rejected", "logps/chosen", "logps/rejected",
                   "rewards/chosen", "rewards/rejected"}
STRATEGIES = {"single": [], "ddp": ["strategy.plugin=ddp"], "fsdp": ["strategy.plugin=fsdp"],
              "zero3": ["strategy.plugin=zero", "strategy.stage=3"]}
TOL = {1: 1e-5, STEPS: 1e-4}
ABS_FLOOR = 1e-6
# kl: the estimate is a mean of differences of float32 sums of log-probabilities of magnitude
# 29..538 here (the KL rows', in trainrun's reference/logps.safetensors), whose float32 spacing
# (ulp) averages 1.06e-5 over the rows, so it is compared to that absolute floor, not only
# relatively. At world > 1 a rank pads its micro-batch to its own longest row and the reference is
# precomputed in rank-strided batches, so those sums round otherwise than in one process (step 1,
# policy = reference: 2^-19 where one process gets 0, clamped). In one process the two libraries'
# own summation orders do the same: on an AMD Zen 4 (AVX-512, where PyPI torch takes wider
# kernels than Debian's LibTorch 1.13) step 10's kl of kto/lora differs by 6.7e-6 (4e-4
# relative) while its loss agrees to 1e-7. A KL estimate of the ranks' own micro-batches, not
# averaged over the ranks, misses TRL's by 4e-3 to 0.5.
KL_ABS_FLOOR = 1e-5
# cell -> (trainrun [objective], TRL KTOConfig fields, data kind, kl_block_size)
CELLS = {
    "kto/none": ({"plugin": "kto", "beta": 0.1, "loss_type": "kto", "desirable_weight": 1.0,
                  "undesirable_weight": 1.3},
                 {"beta": 0.1, "loss_type": "kto", "desirable_weight": 1.0, "undesirable_weight": 1.3},
                 "unpaired", BATCH),
    "apo/none": ({"plugin": "kto", "beta": 0.1, "loss_type": "apo_zero_unpaired"},
                 {"beta": 0.1, "loss_type": "apo_zero_unpaired"}, "paired", 0),
}
CELLS["kto/lora"] = CELLS["kto/none"]
CELLS["kto-chat/none"] = CELLS["kto/none"][:2] + ("chat", BATCH)

# 24 unpaired examples, 14 desirable. Two prompts end in a space ("A: "), where the tokenized
# prompt is not a prefix of prompt + completion and the completion starts one token early.
UNPAIRED = [
    ("What is the capital of France?", " The capital of France is Paris.", True),
    ("What is the capital of France?", " It is Berlin.", False),
    ("Name a primary colour.", " Red.", True),
    ("Q: How many legs does a spider have? A: ", "eight.", True),
    ("Q: How many legs does a spider have? A: ", "six, like every insect.", False),
    ("Complete the proverb: a stitch in time", " saves nine.", True),
    ("Translate 'merci' into English.", " Goodbye.", False),
    ("Why is the sky blue?", " Air scatters short (blue) wavelengths of sunlight more than long ones, "
     "so blue light reaches the eye from every direction of the sky.", True),
    ("Write a haiku about rain.", " Rain.", False),
    ("What is 12 times 12?", " 144.", True),
    ("What is 12 times 12?", " 124.", False),
    ("Give a synonym for 'quick'.", " Fast.", True),
    ("Q: Which planet is known as the red planet? A: ", "mars.", True),
    ("Summarise: The meeting moved from Monday to Wednesday because the room was booked.",
     " The room is booked on Monday, Tuesday and Wednesday, and nobody knows why.", False),
    ("Is water wet?", " Water makes other things wet; whether water itself is wet is a question of definitions.",
     True),
    ("List three even numbers.", " 2, 4 and 6.", True),
    ("List three even numbers.", " 1, 3 and 5.", False),
    ("How do you boil an egg?", " Fry it.", False),
    ("Spell 'necessary'.", " n-e-c-e-s-s-a-r-y.", True),
    ("Say hello.", " Hello!", True),
    ("Say hello.", " I would rather not say anything at all today, thank you very much.", False),
    ("Name a mammal that flies.", " The bat.", True),
    ("What colour is grass?", " Blue, mostly.", False),
    ("Count to three.", " One, two, three.", True),
]

ap = argparse.ArgumentParser()
ap.add_argument("trainrun")
ap.add_argument("work")
ap.add_argument("--cells", default="kto/none,kto/lora,apo/none,kto-chat/none")
ap.add_argument("--no-errors", action="store_true", help="skip the bad-input checks")
ap.add_argument("--strategy", default="single", choices=sorted(STRATEGIES),
                help="trainrun's strategy; other than single: at --world ranks (gloo-cpu)")
ap.add_argument("--world", type=int, default=2, help="ranks of a multi-rank --strategy")
ap.add_argument("--micro", type=int, default=0,
                help="trainrun's micro_batch_size (examples); below 8 / world it accumulates")
ap.add_argument("--eval-filler", action="store_true",
                help="with a multi-rank --strategy: also an evaluation with filler batches against "
                     "one process's (eval_with_filler)")
A = ap.parse_args()
WORLD = A.world if A.strategy != "single" else 1
if WORLD < 1 or BATCH % WORLD:
    sys.exit(f"--world {A.world} must divide the batch of {BATCH}")
MICRO = A.micro or BATCH // WORLD
if (BATCH // WORLD) % MICRO:
    sys.exit(f"--micro {A.micro} must divide the {BATCH // WORLD} examples per rank")
# Micro-batches per step; TRL then runs BATCH / ACCUM examples per forward, ACCUM forwards a step,
# and both sides rotate the KL completions within blocks of that many examples.
ACCUM = BATCH // WORLD // MICRO
KL_BLOCK = BATCH // ACCUM
if A.strategy != "single" and A.cells == ap.get_default("cells"):
    A.cells = "kto/none,kto/lora"
if A.strategy != "single":
    A.no_errors = True  # the bad-input checks are the same at any world size
failures = []


def fail(msg):
    print("FAIL:", msg, flush=True)
    failures.append(msg)


def make_model(out, tokenizer_dir):
    """trl_harness's tiny Llama (hidden 32, 2 layers, GQA 4/2, norms perturbed)."""
    from chat_data import write_tokenizer

    write_tokenizer(tokenizer_dir, seed=1, count=48)  # 320 ids, EOS <|im_end|>, ChatML
    make_tiny_model(out, tokenizer_dir)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def write_job(path, model_dir, data_path, run_dir, objective, kl_block, adapter, lr=LR, steps=STEPS):
    job = table("trainer", {"max_steps": steps, "global_batch_size": BATCH, "seed": SEED, "log_every": 1,
                            "run_dir": run_dir})
    job += table("model", {"plugin": "llama", "path": model_dir})
    job += table("data", {"plugin": "unpaired", "paths": [data_path], "tokenizer": model_dir,
                          "max_length": MAX_LENGTH, "kl_block_size": kl_block})
    job += table("objective", objective)
    job += table("optimizer", {"plugin": "adamw", "lr": lr})
    job += table("accelerator", {"plugin": "cpu", "threads": 1})
    job += table("callbacks", {"plugin": "metrics", "all_ranks": WORLD > 1}, array=True)
    if adapter == "lora":
        job += table("callbacks", LORA_TABLE, array=True)
    with open(path, "w") as f:
        f.write(job)


def run_trainrun(job, single=False):
    """trainrun on `job`: at WORLD ranks under --strategy (gloo-cpu), with --micro, unless single."""
    cmd = [A.trainrun, "--config", job]
    sets = []
    if WORLD > 1 and not single:
        sets += STRATEGIES[A.strategy] + [f"launch.nproc_per_node={WORLD}", "accelerator.plugin=gloo-cpu",
                                          "accelerator.timeout_s=60"]
    if A.micro and not single:
        sets.append(f"trainer.micro_batch_size={A.micro}")
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def read_metrics(run_dir):
    """{metrics file: {step: training row}}, one file per rank at WORLD > 1 (all_ranks)."""
    names = sorted(n for n in os.listdir(run_dir) if n.startswith("metrics") and n.endswith(".jsonl"))
    if len(names) != WORLD:
        fail(f"{len(names)} metrics*.jsonl in {run_dir} for {WORLD} rank(s): {names}")
    return metrics_files(run_dir)


def run_trl(cell, model_dir, data_path, out_dir, init_adapter):
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, PrinterCallback
    from trl import KTOConfig, KTOTrainer

    args = KTOConfig(**trl_common_args(out_dir, BATCH // ACCUM, LR, STEPS, SEED, MAX_LENGTH, accumulation=ACCUM),
                     **CELLS[cell][1])
    args.model_init_kwargs = {"dtype": torch.float32, "attn_implementation": "eager"}
    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = load_dataset("json", data_files=data_path, split="train")
    peft_config = (LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS, bias="none",
                              task_type="CAUSAL_LM") if cell.endswith("/lora") else None)

    class Trainer(KTOTrainer):  # TRL's trainer drawing trainrun's data order
        def _get_train_sampler(self, *a, **k):
            return trainrun_order_sampler(len(self.train_dataset), BATCH, SEED)

    trainer = Trainer(model=model_dir, args=args, train_dataset=ds, processing_class=tok, peft_config=peft_config)
    trainer.remove_callback(PrinterCallback)
    if init_adapter:
        print(f"    TRL: lora_A of {load_initial_lora_a(trainer.model, init_adapter)} modules from trainrun's")
    trainer.train()
    return {r["step"]: r for r in trainer.state.log_history if "loss" in r and "train_runtime" not in r}


def compare(cell, trl, ours_by_step):
    keys = sorted({k for row in trl.values() for k in row} - SKIP)
    worst = {}
    print(f"    {'step':>4} {'metric':<18} {'TRL':>16} {'trainrun':>16} {'diff':>10} {'tol':>8}")
    for step, ref in trl.items():
        every = step in (1, STEPS)  # every figure; in between the loss and the KL estimate
        ours = ours_by_step.get(step)
        if ours is None:
            fail(f"{cell}: trainrun has no row for step {step}")
            continue
        for k in REQUIRED if every else []:
            if METRIC_ALIAS.get(k, k) not in ours:
                fail(f"{cell}: trainrun's step {step} lacks '{k}'")
        for k in keys if every else ["loss", "kl"]:
            if k not in ref:
                continue
            r, v = ref[k], ours.get(METRIC_ALIAS.get(k, k))
            if ACCUM > 1 and k in PER_MICRO_MEANS:
                shown = "-" if v is None else f"{v:>16.9g}"
                print(f"    {step:>4} {k:<18} {r:>16.9g} {shown:>16} not compared (TRL: unweighted mean of "
                      f"{ACCUM} micro-batches' means)")
                continue
            if v is None:
                print(f"    {step:>4} {k:<18} {r:>16.9g} {'-':>16} not logged by trainrun"
                      + ("" if k == "num_tokens" else " (not compared)"))
                continue
            floor = KL_ABS_FLOOR if k == "kl" else ABS_FLOOR
            tol = max(TOL.get(step, TOL[STEPS]) * abs(r), floor)
            d = abs(v - r) if math.isfinite(v) else math.inf
            if every:
                worst[(step, k)] = (d / abs(r) if r else None, d)
            mark = "" if d <= tol else "  <-- FAIL"
            print(f"    {step:>4} {k:<18} {r:>16.9g} {v:>16.9g} {d:>10.2e} {tol:>8.1e}{mark}")
            if d > tol:
                fail(f"{cell}: step {step} {k}: trainrun {v!r}, TRL {r!r} (|diff| {d:.3g} > {tol:.3g})")
    for step in (1, STEPS):
        figures = [f"{k} {'abs' if rel is None else 'rel'} {d if rel is None else rel:.1e}"
                   for (s, k), (rel, d) in sorted(worst.items()) if s == step]
        print(f"    step {step} differences: " + ", ".join(figures))
    return worst


def eval_with_filler(model_dir, unpaired_path):
    """Multi-rank evaluation against one process's: kto/none for 8 steps, then held out the first
    2 * WORLD + 1 examples in evaluation batches of 2 per rank. Rank r holds examples r, r + WORLD,
    ..., so evaluation batch k of all the ranks is examples 2 WORLD k .. 2 WORLD (k + 1) - 1, one
    process's batch k of 2 * WORLD: batch 0 has 2 examples on every rank (the ranks' KL means then
    average to the mean over the batch's KL rows), batch 1 example 2 * WORLD on rank 0 alone and
    a filler batch on every other rank, which must take part in the KL all-reduce without a value
    and leave kl and rewards/margins the mean over the 2 batches. Every eval_ figure must equal
    one process's (rel 1e-5; kl: KL_ABS_FLOOR). TRL's multi-process evaluation repeats examples
    to even the ranks' batches instead, so this compares trainrun with itself."""
    held = write_jsonl(os.path.join(A.work, "held-out.jsonl"),
                       [{"prompt": p, "completion": c, "label": lab} for p, c, lab in UNPAIRED[:2 * WORLD + 1]])
    figures = {}
    for name, world in (("one", 1), ("ranks", WORLD)):
        d = os.path.join(A.work, "eval-" + name)
        os.makedirs(d)
        job = os.path.join(d, "job.toml")
        write_job(job, model_dir, unpaired_path, os.path.join(d, "run"), CELLS["kto/none"][0], KL_BLOCK, "none",
                  steps=8)
        text = open(job).read().replace(
            "[model]", f"eval_every = 8\neval_batch_size = {2 * WORLD // world}\n\n[model]")
        open(job, "w").write(text.replace("kl_block_size =", f"eval_paths = [{json.dumps(held)}]\nkl_block_size ="))
        rc, out = run_trainrun(job, single=world == 1)
        open(os.path.join(d, "log"), "w").write(out)
        if rc != 0:
            fail(f"eval at {world} rank(s): trainrun exited {rc}:\n{out[-1500:]}")
            return
        run_dir = os.path.join(d, "run")
        for f in sorted(n for n in os.listdir(run_dir) if n.startswith("metrics") and n.endswith(".jsonl")):
            rows = [json.loads(l) for l in open(os.path.join(run_dir, f)) if "eval_loss" in l]
            if not rows:
                fail(f"eval at {world} rank(s): {f} has no evaluation")
                continue
            figures[(name, f)] = {k: v for k, v in rows[-1].items()
                                  if k.startswith("eval_") and k not in ("eval_time_s", "eval_samples_per_s")}
    one = [v for (n, _), v in figures.items() if n == "one"]
    ranks = {f: v for (n, f), v in figures.items() if n == "ranks"}
    if len(one) != 1 or len(ranks) != WORLD:
        fail(f"eval: {len(one)} one-process and {len(ranks)} rank metrics files with an evaluation")
        return
    ref = one[0]
    for k in ("eval_kl", "eval_rewards/margins", "eval_loss", "eval_rewards/chosen"):
        if k not in ref:
            fail(f"eval: one process did not log {k}")
    worst = 0.0
    for f, ours in ranks.items():
        for k, r in sorted(ref.items()):
            v = ours.get(k)
            floor = KL_ABS_FLOOR if k == "eval_kl" else ABS_FLOOR
            tol = max(1e-5 * abs(r), floor)
            if v is None or abs(v - r) > tol:
                fail(f"eval {f}: {k} {v!r} at {WORLD} ranks, {r!r} in one process (tol {tol:.3g})")
            elif r:
                worst = max(worst, abs(v - r) / abs(r))
    print(f"eval with a filler batch: {WORLD} ranks vs one process, {len(ref)} figures "
          f"(eval_kl {ref.get('eval_kl')}), max rel diff {worst:.1e}")


def errors(model_dir, unpaired_path, pairs_path):
    """Bad input: exit 2 and what the message names."""
    def run(name, data_path, objective=None, kl_block=BATCH, no_objective=False, pairs_dataset=False):
        d = os.path.join(A.work, "error-" + name)
        os.makedirs(d, exist_ok=True)
        job = os.path.join(d, "job.toml")
        write_job(job, model_dir, data_path, os.path.join(d, "run"),
                  objective or CELLS["kto/none"][0], kl_block, "none", steps=1)
        if pairs_dataset:  # the `preference` dataset's pairs instead
            text = open(job).read()
            open(job, "w").write(text.replace('plugin = "unpaired"', 'plugin = "preference"')
                                 .replace(f"kl_block_size = {kl_block}\n", ""))
        if no_objective:
            text = open(job).read()
            head, rest = text.split("[objective]", 1)
            open(job, "w").write(head + "[optimizer]" + rest.split("[optimizer]", 1)[1])
        return run_trainrun(job, single=True)

    def expect(name, needles, **kw):
        rc, out = run(name, **kw)
        if rc != 2:
            fail(f"error {name}: exit {rc}, expected 2:\n{out[-800:]}")
            return
        for n in needles:
            if n not in out:
                fail(f"error {name}: the message does not say '{n}':\n{out[-800:]}")
        print(f"error {name}: exit 2, {out.strip().splitlines()[-1][:170]}")

    lines = open(unpaired_path).read().splitlines()
    no_label = write_jsonl(os.path.join(A.work, "no-label.jsonl"),
                           [json.loads(l) for l in lines[:2]] + [{"prompt": "Hi.", "completion": " Hello."}])
    expect("no-label", [f"{no_label}:3", '"label"'], data_path=no_label)
    bad_label = write_jsonl(os.path.join(A.work, "bad-label.jsonl"),
                            [json.loads(l) for l in lines[:3]] + [{"prompt": "Hi.", "completion": " Hello.", "label": "yes"}])
    expect("label-type", [f"{bad_label}:4", "label must be true or false"], data_path=bad_label)
    empty = write_jsonl(os.path.join(A.work, "empty.jsonl"), [{"prompt": "Hi.", "completion": "", "label": True}])
    expect("empty-completion", [f"{empty}:1", "completion is empty"], data_path=empty)
    mixed = write_jsonl(os.path.join(A.work, "mixed.jsonl"),
                        [json.loads(l) for l in lines[:2]] + [{"prompt": "Hi.", "chosen": " Hello.", "rejected": " No."}])
    expect("mixed-kinds", [f"{mixed}:3", "paired row among unpaired"], data_path=mixed)
    expect("kto-without-kl-rows", ["kl_block_size", "apo_zero_unpaired"], data_path=unpaired_path, kl_block=0)
    expect("no-objective", ["[objective]", "kto"], data_path=unpaired_path, no_objective=True)
    expect("kto-on-pairs", ["kto trains on 'unpaired-preference' data", "'preference'"], data_path=pairs_path,
           pairs_dataset=True)


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
    unpaired = write_jsonl(os.path.join(A.work, "unpaired.jsonl"),
                           [{"prompt": p, "completion": c, "label": lab} for p, c, lab in UNPAIRED])
    chat = []
    for i, (p, c, lab) in enumerate(UNPAIRED):
        prompt = [{"role": "user", "content": p.strip()}]
        if i % 4 == 1:
            prompt.insert(0, {"role": "system", "content": "You answer briefly."})
        chat.append({"prompt": prompt, "completion": [{"role": "assistant", "content": c.strip()}], "label": lab})
    chat = write_jsonl(os.path.join(A.work, "unpaired-chat.jsonl"), chat)
    # 16 pairs from the unpaired examples' prompts and completions: desirable rows as chosen.
    good = [(p, c) for p, c, lab in UNPAIRED if lab]
    badc = [c for _, c, lab in UNPAIRED if not lab]
    pairs = write_jsonl(os.path.join(A.work, "pairs.jsonl"),
                        [{"prompt": p, "chosen": c, "rejected": badc[i % len(badc)]}
                         for i, (p, c) in enumerate(good + good[:2])])
    print(f"{len(UNPAIRED)} unpaired examples, 16 pairs; {BATCH} per step, {STEPS} steps, lr {LR}, seed {SEED}; "
          f"trainrun: strategy {A.strategy}, {WORLD} rank(s) of {MICRO} x {ACCUM} micro-batch(es); "
          f"TRL: 1 process, {BATCH // ACCUM} x {ACCUM}")
    summary = {}
    for cell in A.cells.split(","):
        if cell not in CELLS:
            sys.exit(f"unknown cell '{cell}' (known: {', '.join(CELLS)})")
        objective, _, kind, kl_block = CELLS[cell]
        kl_block = KL_BLOCK if kl_block else 0  # TRL's blocks are its per-device batches
        data_path = {"unpaired": unpaired, "paired": pairs, "chat": chat}[kind]
        adapter = "lora" if cell.endswith("/lora") else "none"
        cell_dir = os.path.join(A.work, cell.replace("/", "-"))
        os.makedirs(cell_dir)
        init_adapter = None
        if adapter == "lora":
            probe = os.path.join(cell_dir, "init-run")
            write_job(os.path.join(cell_dir, "init.toml"), model_dir, data_path, probe, objective, kl_block,
                      adapter, lr=0.0, steps=1)
            rc, out = run_trainrun(os.path.join(cell_dir, "init.toml"))
            if rc != 0:
                fail(f"{cell}: the lr = 0 run for trainrun's initial adapter exited {rc}:\n{out[-1500:]}")
                continue
            init_adapter = os.path.join(probe, "adapter")
        t = time.time()
        try:
            trl = run_trl(cell, model_dir, data_path, os.path.join(cell_dir, "trl"), init_adapter)
        except Exception as e:  # noqa: BLE001 - a failure of the cell, reported
            fail(f"{cell}: TRL failed: {type(e).__name__}: {e}")
            continue
        t_trl = time.time() - t
        if sorted(trl) != list(range(1, STEPS + 1)):
            fail(f"{cell}: TRL logged steps {sorted(trl)}")
        with open(os.path.join(cell_dir, "trl.json"), "w") as f:
            json.dump(trl, f, indent=1)
        job = os.path.join(cell_dir, "job.toml")
        write_job(job, model_dir, data_path, os.path.join(cell_dir, "run"), objective, kl_block, adapter)
        t = time.time()
        rc, out = run_trainrun(job)
        open(os.path.join(cell_dir, "log"), "w").write(out)
        if rc != 0:
            fail(f"{cell}: trainrun exited {rc}:\n{out[-1500:]}")
            continue
        print(f"{cell}: TRL {t_trl:.1f} s, trainrun {time.time() - t:.1f} s")
        for name, ours in read_metrics(os.path.join(cell_dir, "run")).items():
            label = cell if WORLD == 1 else f"{cell} {name}"
            print(f"  {label}")
            summary[label] = compare(label, trl, ours)
    if A.eval_filler:
        if WORLD == 1:
            fail("--eval-filler needs a multi-rank --strategy")
        else:
            eval_with_filler(model_dir, unpaired)
    if not A.no_errors:
        errors(model_dir, unpaired, pairs)
    print(f"{A.strategy}: {len(summary)} cells (rank files), {len(failures)} failures, {time.time() - t0:.0f} s")
    if failures:
        print("failures:\n  " + "\n  ".join(f.splitlines()[0] for f in failures))
        sys.exit(1)
    print("OK")


main()
