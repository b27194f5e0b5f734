"""Preference objectives against TRL: trainrun's `dpo` (and `simpo`, `orpo`) objectives with the
`preference` dataset, step by step against TRL's own trainers on the same tiny random model,
the same pairs and the same optimizer (docs/notes/trl-preference-spec.md says what TRL computes).

The cells, each 10 AdamW steps in fp32 on one CPU thread:

  objectives  dpo-sigmoid dpo-ipo dpo-hinge dpo-robust (trl.DPOTrainer, beta 0.1; robust with
              label_smoothing 0.1); simpo (trl.experimental.cpo.CPOTrainer, loss_type "simpo",
              beta 2, cpo_alpha 0), simpo-cpo (the same with TRL's default cpo_alpha 1 and
              label_smoothing 0.1) and orpo (trl.experimental.orpo.ORPOTrainer), not in the
              default list; their data go through the preference dataset's trainer = "cpo" /
              "orpo" (CPOTrainer's and ORPOTrainer's tokenization)
  adapters    none: full fine-tuning (DPO's reference: a frozen copy of the initial model)
              lora: r 4, alpha 8 on q,k,v,o,gate,up,down (DPO's reference: the base with its
              adapters switched off). PEFT draws lora_A with its own generator, trainrun with
              its own, so a LoRA cell first runs trainrun with lr = 0 for one step (an exact
              no-op of AdamW), reads the adapter it wrote (its initial one) and gives TRL's
              model that lora_A; lora_B is zero on both sides.
  extra cells qwen3 (a tiny Qwen3 instead of Llama, dpo-sigmoid, full fine-tuning),
              conversational (the pairs as chat messages, ChatML template, dpo-sigmoid, full),
              conversational-simpo and conversational-orpo (the same with simpo and orpo: the
              chat rendered to text, a second <|im_end|> appended after ChatML's "\n")

Model: transformers' LlamaForCausalLM / Qwen3ForCausalLM from config (hidden 32, 2 layers,
GQA 4/2 heads, untied head, norm weights perturbed), saved with chat_data.py's byte-level BPE
tokenizer (320 ids, EOS <|im_end|>, pad <|endoftext|>, ChatML template, no BOS).
Data: 16 fixed pairs (PAIRS below) of varied lengths; two prompts end in a space, so the
tokenized prompt is not a prefix of prompt + completion and TRL starts the completion where the
two diverge. One step is the whole set (global_batch_size 16), so the data order of neither side
matters; --batch B < 16 makes TRL draw trainrun's order (core/src/sampler.cpp).

Checked, per cell: every figure of TRL's log_history at steps 1 and 10 that trainrun's
metrics.jsonl also has (under TRL's name, or the alias in METRIC_ALIAS), on every rank's file:
|trainrun - TRL| <= max(rel * |TRL|, ABS_FLOOR), rel = 1e-5 at step 1 and 1e-4 at step 10,
ABS_FLOOR = 1e-6 (DPO's rewards are exactly 0 at step 1, where policy = reference). trainrun
must log REQUIRED. Figures TRL computes from the padded batch (NOT_COMPARABLE) are printed but
not compared. With --strategy ddp|fsdp|zero3 trainrun runs at 2 ranks (gloo-cpu) and must still
equal the single-process TRL run (step 1 at 1e-5, step 10 at 1e-4).

usage: preference_vs_trl.py TRAINRUN WORK [--objectives a,b,...] [--adapters none,lora]
           [--extra qwen3,conversational] [--strategy single|ddp|fsdp|zero3] [--batch B]
           [--trl-only] [--padding-free]
--trl-only runs and prints the TRL side alone (TRAINRUN is then not run).
--padding-free runs each cell's trainrun job a second time with [data] padding_free = true (one
packed row per micro-batch): every figure it logs at every step must equal the padded run's within
PACKED_TOL (1e-5 relative, floor ABS_FLOOR), and TRL's as above.
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

# ---------------------------------------------------------------------------------------------
# The contract with the C++ side, in one place: job-file names and the metric names trainrun
# logs. Adjust here when the plugins settle.
STEPS, SEED, LR, MAX_LENGTH = 10, 3, 1e-3, 1024
DATA_TABLE = {"plugin": "preference", "max_length": MAX_LENGTH}  # + paths, tokenizer
# objective name on the command line -> (trainrun [objective] table, TRL trainer, TRL config)
OBJECTIVES = {
    "dpo-sigmoid": ({"plugin": "dpo", "beta": 0.1, "loss_type": "sigmoid", "label_smoothing": 0.0},
                    "dpo", {"beta": 0.1, "loss_type": ["sigmoid"], "label_smoothing": 0.0}),
    "dpo-ipo": ({"plugin": "dpo", "beta": 0.1, "loss_type": "ipo", "label_smoothing": 0.0},
                "dpo", {"beta": 0.1, "loss_type": ["ipo"], "label_smoothing": 0.0}),
    "dpo-hinge": ({"plugin": "dpo", "beta": 0.1, "loss_type": "hinge", "label_smoothing": 0.0},
                  "dpo", {"beta": 0.1, "loss_type": ["hinge"], "label_smoothing": 0.0}),
    "dpo-robust": ({"plugin": "dpo", "beta": 0.1, "loss_type": "robust", "label_smoothing": 0.1},
                   "dpo", {"beta": 0.1, "loss_type": ["robust"], "label_smoothing": 0.1}),
    # SimPO as the SimPO paper runs it (beta 2, gamma 0.5, no NLL term); TRL's CPOConfig defaults
    # are beta 0.1, simpo_gamma 0.5, cpo_alpha 1.0 (CPO-SimPO).
    "simpo": ({"plugin": "simpo", "beta": 2.0, "simpo_gamma": 0.5, "cpo_alpha": 0.0, "label_smoothing": 0.0},
              "cpo", {"loss_type": "simpo", "beta": 2.0, "simpo_gamma": 0.5, "cpo_alpha": 0.0, "label_smoothing": 0.0}),
    # CPO-SimPO: TRL's CPOConfig default cpo_alpha 1.0 (the chosen NLL) and a smoothed sigmoid.
    "simpo-cpo": ({"plugin": "simpo", "beta": 2.0, "simpo_gamma": 0.5, "cpo_alpha": 1.0, "label_smoothing": 0.1},
                  "cpo", {"loss_type": "simpo", "beta": 2.0, "simpo_gamma": 0.5, "cpo_alpha": 1.0,
                          "label_smoothing": 0.1}),
    "orpo": ({"plugin": "orpo", "beta": 0.1}, "orpo", {"beta": 0.1}),
}
# The preference dataset's tokenization for each TRL trainer (its option `trainer`): CPOTrainer and
# ORPOTrainer tokenize alike; "orpo" adds the chosen rows again with their prompts as targets.
DATA_TRAINER = {"dpo": "dpo", "cpo": "cpo", "orpo": "orpo"}
# The rest of DPOTrainer's single loss types (exo_pair needs its epsilon > 0: label_smoothing).
for _lt, _ls in (("exo_pair", 1e-3), ("nca_pair", 0.0), ("bco_pair", 0.0), ("sppo_hard", 0.0),
                 ("apo_zero", 0.0), ("apo_down", 0.0), ("discopop", 0.0), ("sigmoid_norm", 0.0),
                 ("sft", 0.0)):
    OBJECTIVES["dpo-" + _lt] = ({"plugin": "dpo", "beta": 0.1, "loss_type": _lt, "label_smoothing": _ls},
                                "dpo", {"beta": 0.1, "loss_type": [_lt], "label_smoothing": _ls})
# DPO + the chosen NLL (RPO): TRL's combination of two loss types.
OBJECTIVES["dpo-sigmoid+sft"] = ({"plugin": "dpo", "beta": 0.1, "loss_type": "sigmoid", "sft_weight": 0.5},
                                 "dpo", {"beta": 0.1, "loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]})
DEFAULT_OBJECTIVES = ["dpo-sigmoid", "dpo-ipo", "dpo-hinge", "dpo-robust"]
LORA_TABLE = {"plugin": "lora", "r": 4, "lora_alpha": 8.0, "target_modules": ["all-linear"]}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
METRIC_ALIAS = {"learning_rate": "lr"}  # TRL's name -> trainrun's, where they differ
NOT_LOGGED_BY_TRAINRUN_OK = {"num_tokens"}  # compared when trainrun logs it, not required
REQUIRED = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
            "logps/chosen", "logps/rejected"]
# CPOTrainer and ORPOTrainer log the mean of the logits over every position of the padded
# batch (prompt and padding included): a figure of the batch's padding, not of the pairs.
NOT_COMPARABLE = {"cpo": {"logits/chosen", "logits/rejected"}, "orpo": {"logits/chosen", "logits/rejected"}}
SKIP = {"epoch", "step"}
TOL = {1: 1e-5, STEPS: 1e-4}
ABS_FLOOR = 1e-6
STRATEGIES = {"single": ([], 1), "ddp": (["strategy.plugin=ddp"], 2),
              "fsdp": (["strategy.plugin=fsdp"], 2),
              "zero3": (["strategy.plugin=zero", "strategy.stage=3"], 2)}
# ---------------------------------------------------------------------------------------------

# 16 pairs, plain text. Two prompts end in a space ("A: "): where the byte-level BPE has the merge
# (" e", " s", " m" but not " V"), the space joins the completion's first token, the tokenized
# prompt is not a prefix of prompt + completion, and TRL's completion starts one token early, for
# both completions of the pair (the shorter common prefix of the two; "Venus" alone would not).
PAIRS = [
    ("What is the capital of France?", " The capital of France is Paris.", " It is Berlin."),
    ("Name a primary colour.", " Red.", " Purple, which everyone agrees is primary and also a kind of fruit."),
    ("Q: How many legs does a spider have? A: ", "eight.", "six, like every insect."),
    ("Complete the proverb: a stitch in time", " saves nine.", " is a sewing pattern."),
    ("Translate 'merci' into English.", " Thank you.", " Goodbye."),
    ("Why is the sky blue?", " Air scatters short (blue) wavelengths of sunlight more than long ones, "
     "so blue light reaches the eye from every direction of the sky.", " Because it reflects the sea."),
    ("Write a haiku about rain.", " Soft rain on the roof\nthe gutters hum a low song\nthe street smells of stone",
     " Rain."),
    ("What is 12 times 12?", " 144.", " 124."),
    ("Give a synonym for 'quick'.", " Fast.", " Slow."),
    ("Q: Which planet is known as the red planet? A: ", "mars.", "Venus, the morning star."),
    ("Summarise: The meeting moved from Monday to Wednesday because the room was booked.",
     " The meeting is now on Wednesday.", " The room is booked on Monday, Tuesday and Wednesday, and nobody knows why."),
    ("Is water wet?", " Water makes other things wet; whether water itself is wet is a question of definitions.",
     " No."),
    ("List three even numbers.", " 2, 4 and 6.", " 1, 3 and 5."),
    ("How do you boil an egg?", " Put it in boiling water for about eight minutes, then cool it in cold water.",
     " Fry it."),
    ("Spell 'necessary'.", " n-e-c-e-s-s-a-r-y.", " n-e-s-e-c-a-r-y."),
    ("Say hello.", " Hello!", " I would rather not say anything at all today, thank you very much."),
]

ap = argparse.ArgumentParser()
ap.add_argument("trainrun")
ap.add_argument("work")
ap.add_argument("--objectives", default=",".join(DEFAULT_OBJECTIVES))
ap.add_argument("--adapters", default="none,lora")
ap.add_argument("--extra", default="qwen3,conversational",
                help="extra full fine-tuning cells: qwen3, conversational (dpo-sigmoid), "
                     "conversational-simpo, conversational-orpo ('' for none)")
ap.add_argument("--strategy", default="single", choices=sorted(STRATEGIES))
ap.add_argument("--batch", type=int, default=len(PAIRS), help="pairs per optimizer step (global)")
ap.add_argument("--world", type=int, default=2, help="ranks of a multi-rank --strategy")
ap.add_argument("--micro", type=int, default=0,
                help="trainrun's micro_batch_size (pairs); below batch / world it accumulates "
                     "(TRL runs without accumulation: the figures must not change)")
ap.add_argument("--qlora", action="store_true",
                help="instead of the TRL cells: QLoRA (quant-nf4 + lora) DPO under fsdp must equal it "
                     "under ddp at --world ranks, every logged figure of every step within 1e-5")
ap.add_argument("--checks", action="store_true",
                help="instead of the TRL cells: the objectives' bad-input errors (exit 2, what is "
                     "named), the reference cache reused by a second run, the held-out figures")
ap.add_argument("--trl-only", action="store_true")
ap.add_argument("--padding-free", action="store_true",
                help="each cell's trainrun job also with [data] padding_free = true: its figures at "
                     "every step equal the padded run's (PACKED_TOL) and TRL's (TRL 1.16's DPOConfig "
                     "has padding_free but falls back to padding, so TRL itself runs padded)")
A = ap.parse_args()
failures = []


def fail(msg):
    print("FAIL:", msg, flush=True)
    failures.append(msg)


# ---------------------------------------------------------------------------------------------
# Model, tokenizer, data

def make_tokenizer(out):
    from chat_data import write_tokenizer
    write_tokenizer(out, seed=1, count=48)  # chat_data.py's defaults: 320 ids, ChatML


def write_data(work):
    plain = os.path.join(work, "pairs.jsonl")
    conv = os.path.join(work, "pairs-chat.jsonl")
    with open(plain, "w", encoding="utf-8") as f:
        for p, c, r in PAIRS:
            f.write(json.dumps({"prompt": p, "chosen": c, "rejected": r}, ensure_ascii=False) + "\n")
    with open(conv, "w", encoding="utf-8") as f:
        for i, (p, c, r) in enumerate(PAIRS):
            prompt = [{"role": "user", "content": p.strip()}]
            if i % 4 == 1:
                prompt.insert(0, {"role": "system", "content": "You answer briefly."})
            f.write(json.dumps({"prompt": prompt, "chosen": [{"role": "assistant", "content": c.strip()}],
                                "rejected": [{"role": "assistant", "content": r.strip()}]},
                               ensure_ascii=False) + "\n")
    return plain, conv


# ---------------------------------------------------------------------------------------------
# trainrun

def write_job(path, model_dir, data_path, run_dir, objective, adapter, lr=LR, steps=STEPS):
    job = table("trainer", {"max_steps": steps, "global_batch_size": A.batch, "seed": SEED, "log_every": 1,
                            "eval_max_batches": 1, "run_dir": run_dir})
    job += table("model", {"plugin": "llama", "path": model_dir})
    kind = OBJECTIVES[objective][1]
    trainer = {"trainer": DATA_TRAINER[kind]} if kind != "dpo" else {}
    job += table("data", {**DATA_TABLE, **trainer, "paths": [data_path], "tokenizer": model_dir})
    job += table("objective", OBJECTIVES[objective][0])
    job += table("optimizer", {"plugin": "adamw", "lr": lr})
    job += table("accelerator", {"plugin": "cpu", "threads": 1})
    job += table("callbacks", {"plugin": "metrics", "all_ranks": True}, array=True)
    if adapter in ("lora", "qlora"):
        job += table("callbacks", LORA_TABLE, array=True)
    if adapter == "qlora":
        job += table("precision", {"plugin": "quant-nf4", "target_modules": ["all-linear"], "blocksize": 16})
    with open(path, "w") as f:
        f.write(job)


def run_trainrun(job, extra_sets=()):
    sets, world = STRATEGIES[A.strategy]
    sets = sets + list(extra_sets)
    world = A.world if world > 1 else 1
    if A.micro:
        sets = sets + [f"trainer.micro_batch_size={A.micro}"]
    cmd = [A.trainrun, "--config", job]
    for s in sets:
        cmd += ["--set", s]
    if world > 1:
        cmd += ["--set", f"launch.nproc_per_node={world}", "--set", "accelerator.plugin=gloo-cpu",
                "--set", "accelerator.timeout_s=60"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


read_metrics = metrics_files

# Padded vs padding-free trainrun: the same sums over the same tokens, only the attention's and the
# head's matrix shapes differ, so every figure at every step agrees to rounding.
PACKED_TOL = 1e-5
# Not figures of the training: counters, clocks and memory (the packed row's attention is one
# T x T block, so its peak differs by design).
NOT_PACKED_FIGURES = {"step", "epoch"}
NOT_PACKED_PREFIXES = ("mem_",)
NOT_PACKED_SUFFIXES = ("_s", "_per_s", "_bytes", "_mib")


def compare_packed(cell, padded, packed):
    """Every figure the padded run logs, at every step, in the padding-free run within PACKED_TOL."""
    for name, steps in padded.items():
        other = packed.get(name, {})
        if sorted(other) != sorted(steps):
            fail(f"{cell}: padding_free {name} logged steps {sorted(other)}, padded {sorted(steps)}")
            continue
        worst = (0.0, "")
        for step, row in steps.items():
            for k, r in row.items():
                if (k in NOT_PACKED_FIGURES or not isinstance(r, (int, float)) or k.startswith(NOT_PACKED_PREFIXES)
                        or k.endswith(NOT_PACKED_SUFFIXES)):
                    continue
                v = other[step].get(k)
                if v is None:
                    fail(f"{cell}: padding_free {name} step {step} lacks '{k}'")
                    continue
                if k == "rewards/accuracies" and max(abs(row.get("rewards/margins", 1)),
                                                     abs(other[step].get("rewards/margins", 1))) <= ABS_FLOOR:
                    continue  # policy = reference: the sign of rounding noise, as in compare()
                tol = max(PACKED_TOL * abs(r), ABS_FLOOR)
                d = abs(v - r) if math.isfinite(v) else math.inf
                worst = max(worst, (d / tol, f"step {step} {k}: {v!r} vs {r!r}"))
                if d > tol:
                    fail(f"{cell}: padding_free {name} step {step} {k}: {v!r}, padded {r!r} (|diff| {d:.3g} > {tol:.3g})")
        print(f"  {cell}: padding_free = padded within {PACKED_TOL:g} relative at {len(steps)} steps "
              f"(worst {worst[0]:.2f} of the tolerance, {worst[1]})")


def missing_plugins():
    """The components this test needs that `trainrun plugins` does not list ([] when all are)."""
    try:
        r = subprocess.run([A.trainrun, "plugins"], capture_output=True, text=True, timeout=120)
    except OSError as e:
        return [f"any ({A.trainrun}: {e.strerror})"]
    listed = {line.split()[0] for line in r.stdout.splitlines()[1:] if line.strip()}
    wanted = [DATA_TABLE["plugin"]] + [OBJECTIVES[o][0]["plugin"] for o in A.objectives.split(",") if o in OBJECTIVES]
    return sorted({w for w in wanted if w not in listed})


# ---------------------------------------------------------------------------------------------
# TRL

def trl_args(kind, out_dir, extra):
    common = {**trl_common_args(out_dir, A.batch, LR, STEPS, SEED, MAX_LENGTH), **extra}
    if kind == "dpo":
        from trl import DPOConfig
        return DPOConfig(**common)
    if kind == "cpo":
        from trl.experimental.cpo import CPOConfig
        return CPOConfig(**common)
    from trl.experimental.orpo import ORPOConfig
    return ORPOConfig(**common)


def run_trl(objective, model_dir, data_path, adapter, out_dir, init_adapter):
    """TRL's log_history rows of steps 1 and STEPS, as {step: {key: value}}."""
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    _, kind, extra = OBJECTIVES[objective]
    args = trl_args(kind, out_dir, dict(extra))
    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = load_dataset("json", data_files=data_path, split="train")
    peft_config = (LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS, bias="none",
                              task_type="CAUSAL_LM") if adapter == "lora" else None)
    if kind == "dpo":
        from trl import DPOTrainer
        args.model_init_kwargs = {"dtype": torch.float32, "attn_implementation": "eager"}
        cls, model = DPOTrainer, model_dir  # a path: TRL loads the reference from it the same way
    else:
        if kind == "cpo":
            from trl.experimental.cpo import CPOTrainer as cls
        else:
            from trl.experimental.orpo import ORPOTrainer as cls
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    if A.batch != len(PAIRS):
        base = cls

        class cls(base):  # noqa: N801 - TRL's trainer drawing trainrun's data order
            def _get_train_sampler(self, *a, **k):
                return trainrun_order_sampler(len(self.train_dataset), A.batch, SEED)
    trainer = cls(model=model, args=args, train_dataset=ds, processing_class=tok, peft_config=peft_config)
    trainer.remove_callback(PrinterCallback)  # the table below prints what matters
    if adapter == "lora" and init_adapter:
        n = load_initial_lora_a(trainer.model, init_adapter)
        print(f"    TRL: lora_A of {n} modules from trainrun's initial adapter")
    elif adapter == "lora":
        print("    TRL: PEFT's own lora_A (no initial adapter from trainrun): LoRA cells cannot match")
    trainer.train()
    rows = {r["step"]: r for r in trainer.state.log_history if "loss" in r and "train_runtime" not in r}
    return {s: rows[s] for s in sorted(rows) if s in (1, STEPS)}


# ---------------------------------------------------------------------------------------------
# Comparison

def compare(cell, kind, trl, runs):
    """Compare every TRL figure trainrun logs too; print the table."""
    skip = NOT_COMPARABLE.get(kind, set())
    keys = sorted({k for row in trl.values() for k in row} - SKIP)
    for name, steps in runs.items():
        print(f"  {cell}: {name}")
        print(f"    {'step':>4} {'metric':<22} {'TRL':>16} {'trainrun':>16} {'diff':>10} {'tol':>8}")
        for step, ref in trl.items():
            ours = steps.get(step)
            if ours is None:
                fail(f"{cell}: {name} has no row for step {step}")
                continue
            for k in REQUIRED:
                if METRIC_ALIAS.get(k, k) not in ours:
                    fail(f"{cell}: {name} step {step} lacks '{k}'")
            for k in keys:
                if k not in ref:
                    continue
                tk = METRIC_ALIAS.get(k, k)
                r = ref[k]
                v = ours.get(tk)
                if v is None:
                    note = "not logged by trainrun" + ("" if k in NOT_LOGGED_BY_TRAINRUN_OK | skip else " (not compared)")
                    print(f"    {step:>4} {k:<22} {r:>16.9g} {'-':>16} {note}")
                    continue
                if k in skip:
                    print(f"    {step:>4} {k:<22} {r:>16.9g} {v:>16.9g}  (not compared: padding-dependent in TRL)")
                    continue
                if k == "rewards/accuracies" and ref.get("rewards/margins") == 0.0:
                    # Policy = reference: every pair's margin is 0 in TRL (the same kernels on
                    # the same batch), so "chosen > rejected" compares two equal numbers; in
                    # trainrun the reference pass runs without autograd, through the evaluation
                    # attention kernel, and the margins are rounding noise (~1e-7) whose sign
                    # decides the accuracy. What must hold is that the margins are that small.
                    m = abs(ours.get(METRIC_ALIAS.get("rewards/margins", "rewards/margins"), math.inf))
                    mark = "" if m <= ABS_FLOOR else "  <-- FAIL"
                    print(f"    {step:>4} {k:<22} {r:>16.9g} {v:>16.9g}  (ties: |margins| {m:.1e} <= {ABS_FLOOR:.0e}){mark}")
                    if m > ABS_FLOOR:
                        fail(f"{cell}: {name} step {step}: policy = reference, yet |rewards/margins| = {m:.3g}")
                    continue
                tol = max(TOL[step] * abs(r), ABS_FLOOR)
                d = abs(v - r) if math.isfinite(v) else math.inf
                mark = "" if d <= tol else "  <-- FAIL"
                print(f"    {step:>4} {k:<22} {r:>16.9g} {v:>16.9g} {d:>10.2e} {tol:>8.1e}{mark}")
                if d > tol:
                    fail(f"{cell}: {name} step {step} {k}: trainrun {v!r}, TRL {r!r} (|diff| {d:.3g} > {tol:.3g})")


def print_trl(cell, trl):
    keys = sorted({k for row in trl.values() for k in row} - SKIP)
    print(f"  {cell}: TRL {', '.join(f'step {s}' for s in trl)}")
    for k in keys:
        print(f"    {k:<22} " + " ".join(f"{trl[s].get(k, float('nan')):>16.9g}" for s in trl))


def run_with(job, strategy_sets, world):
    cmd = [A.trainrun, "--config", job, "--set", f"launch.nproc_per_node={world}", "--set",
           "accelerator.plugin=gloo-cpu", "--set", "accelerator.timeout_s=60"]
    for s in strategy_sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def qlora_fsdp_vs_ddp(model_dir, data_path):
    """QLoRA DPO: fsdp's figures equal ddp's (TRL has no NF4 on CPU to compare with)."""
    got = {}
    for name, sets in (("ddp", ["strategy.plugin=ddp"]), ("fsdp", ["strategy.plugin=fsdp"])):
        cell_dir = os.path.join(A.work, f"qlora-{name}")
        os.makedirs(cell_dir)
        job = os.path.join(cell_dir, "job.toml")
        write_job(job, model_dir, data_path, os.path.join(cell_dir, "run"), "dpo-sigmoid", "qlora")
        rc, out = run_with(job, sets, A.world)
        open(os.path.join(cell_dir, "log"), "w").write(out)
        if rc != 0:
            fail(f"qlora/{name}: trainrun exited {rc}:\n{out[-1500:]}")
            return
        got[name] = read_metrics(os.path.join(cell_dir, "run"))
    compared = 0
    for fname, steps in got["fsdp"].items():
        ref = got["ddp"].get(fname, {})
        for step, row in steps.items():
            for k in REQUIRED + ["loss", "grad_norm", "entropy", "logits/chosen", "mean_token_accuracy"]:
                a, b = row.get(k), ref.get(step, {}).get(k)
                if a is None or b is None:
                    fail(f"qlora: {fname} step {step} lacks {k}")
                    continue
                compared += 1
                if abs(a - b) > max(1e-5 * abs(b), ABS_FLOOR):
                    fail(f"qlora: {fname} step {step} {k}: fsdp {a!r}, ddp {b!r}")
    last = got["fsdp"][sorted(got["fsdp"])[0]][STEPS]
    print(f"qlora fsdp vs ddp at {A.world} ranks: {compared} figures compared; step {STEPS} loss "
          f"{last['loss']:.6f}, rewards/margins {last['rewards/margins']:.6f}")


def checks(model_dir, data_path):
    """What a user meets around the objectives, besides the numbers."""
    def job_with(name, edit, adapter="none", objective="dpo-sigmoid", steps=2):
        cell_dir = os.path.join(A.work, "check-" + name)
        os.makedirs(cell_dir, exist_ok=True)
        job = os.path.join(cell_dir, "job.toml")
        write_job(job, model_dir, data_path, os.path.join(cell_dir, "run"), objective, adapter, steps=steps)
        text = open(job).read()
        text = edit(text)
        open(job, "w").write(text)
        r = subprocess.run([A.trainrun, "--config", job], capture_output=True, text=True, timeout=300)
        return r.returncode, r.stdout + r.stderr, os.path.join(cell_dir, "run")

    def expect_error(name, edit, needles, **kw):
        rc, out, _ = job_with(name, edit, **kw)
        if rc != 2:
            fail(f"check {name}: exit {rc}, expected 2:\n{out[-800:]}")
            return
        for n in needles:
            if n not in out:
                fail(f"check {name}: the error does not say '{n}':\n{out[-800:]}")
        print(f"check {name}: exit 2, {out.strip().splitlines()[-1][:160]}")

    drop_objective = lambda t: t.split("[objective]")[0] + "[optimizer]" + t.split("[optimizer]", 1)[1]
    expect_error("no-objective", drop_objective, ["preference pairs", "[objective]"])
    text_data = os.path.join(A.work, "tokens.u32")
    torch.randint(3, 300, (4096,), dtype=torch.int32).numpy().astype("<u4").tofile(text_data)

    def lm_data(t):
        head, rest = t.split("[data]", 1)
        rest = rest.split("\n\n", 1)[1]
        return head + f'[data]\nplugin = "text"\nformat = "uint32"\nvocab_size = 320\nblock_size = 32\npaths = ["{text_data}"]\n\n' + rest
    expect_error("lm-data", lm_data, ["[objective] dpo trains on 'preference' data", "'language_modeling'"])
    expect_error("adapters-off-without-lora",
                 lambda t: t.replace("[trainer]\n", '[trainer]\nreference_model = "adapters_off"\n'),
                 ["reference_model", "adapters_off", "lora"])
    expect_error("bad-loss-type", lambda t: t.replace('loss_type = "sigmoid"', 'loss_type = "sigmoidd"'),
                 ["loss_type", "sigmoidd"])
    expect_error("robust-smoothing", lambda t: t.replace('loss_type = "sigmoid"', 'loss_type = "robust"')
                 .replace("label_smoothing = 0.0", "label_smoothing = 0.5"), ["label_smoothing"])

    # The dataset's trainer and the objective must agree where the layout differs (exit 2).
    expect_error("orpo-without-orpo-data", lambda t: t.replace('trainer = "orpo"', 'trainer = "cpo"'),
                 ["orpo", '[data] trainer = "orpo"'], objective="orpo")
    expect_error("simpo-with-orpo-data", lambda t: t.replace('trainer = "cpo"', 'trainer = "orpo"'),
                 ["simpo", '[data] trainer = "cpo"'], objective="simpo")
    expect_error("dpo-with-orpo-data",
                 lambda t: t.replace('plugin = "preference"\n', 'plugin = "preference"\ntrainer = "orpo"\n'),
                 ["32 rows", '[data] trainer = "orpo"'])
    expect_error("cpo-keep-end",
                 lambda t: t.replace('trainer = "cpo"\n', 'trainer = "cpo"\ntruncation_mode = "keep_end"\n'),
                 ["[data]", 'trainer = "cpo"', "keep_start"], objective="simpo")

    # The precomputed reference: written by the first run, reused by a second run of the same job,
    # which then logs the same figures; held-out figures with an eval_ prefix.
    held_out = lambda t: t.replace('plugin = "preference"\n', 'plugin = "preference"\nvalidation_fraction = 0.25\n') \
        .replace(f"global_batch_size = {A.batch}\n", "global_batch_size = 4\n")
    rc, out, run_dir = job_with("cache", held_out, steps=3)
    if rc != 0:
        fail(f"check cache: first run exited {rc}:\n{out[-1500:]}")
        return
    cache = os.path.join(run_dir, "reference", "logps.safetensors")
    if "computed in" not in out or not os.path.isfile(cache):
        fail(f"check cache: the first run did not compute and keep {cache}:\n{out[-800:]}")
    first = read_metrics(run_dir)
    rc, out, _ = job_with("cache", held_out, steps=3)
    if rc != 0 or "reused from" not in out:
        fail(f"check cache: the second run (exit {rc}) did not reuse {cache}:\n{out[-1500:]}")
    second = read_metrics(run_dir)
    timing = lambda m: m.endswith("_s") or m.endswith("per_s") or m.startswith("mem_")
    strip = lambda runs: {f: {st: {m: v for m, v in row.items() if not timing(m)} for st, row in steps.items()}
                          for f, steps in runs.items()}
    if strip(first) != strip(second):
        fail("check cache: the run with the reused reference logged other figures than the first")
    # Another seed draws another initial model (a random init here): the cache must not be reused.
    rc, out, _ = job_with("cache", lambda t: held_out(t).replace(f"seed = {SEED}\n", f"seed = {SEED + 1}\n"), steps=1)
    if rc != 0 or "recomputing" not in out:
        fail(f"check cache: a run with another seed (exit {rc}) did not recompute the reference:\n{out[-1500:]}")
    rc, out, _ = job_with("cache", held_out, steps=3)  # back to the first seed, for the figures below
    evals = [json.loads(l) for l in open(os.path.join(run_dir, "metrics-rank-0.jsonl")) if "eval_loss" in l]
    if not evals or "eval_rewards/accuracies" not in evals[-1] or "eval_logps/chosen" not in evals[-1]:
        fail(f"check cache: no eval_rewards/* in the held-out row: {evals[-1:] }")
    else:
        e = evals[-1]
        if abs(e["eval_accuracy"] - e["eval_rewards/accuracies"]) > 1e-12:
            fail(f"check cache: eval_accuracy {e['eval_accuracy']} is not the reward accuracy {e['eval_rewards/accuracies']}")
        print(f"check cache: reference kept and reused; held-out eval_rewards/accuracies "
              f"{e['eval_rewards/accuracies']:.3f}, eval_rewards/margins {e['eval_rewards/margins']:.5f}")


def main():
    t0 = time.time()
    import datasets
    import transformers
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    shutil.rmtree(A.work, ignore_errors=True)
    os.makedirs(A.work)
    if len(PAIRS) % A.batch or A.batch % (A.world if STRATEGIES[A.strategy][1] > 1 else 1):
        sys.exit(f"--batch {A.batch} must divide {len(PAIRS)} and be divisible by the world size")
    tok_dir = os.path.join(A.work, "tokenizer")
    make_tokenizer(tok_dir)
    models = {"llama": os.path.join(A.work, "llama")}
    make_tiny_model(models["llama"], tok_dir, "llama")
    plain, conv = write_data(A.work)
    if A.checks:
        checks(models["llama"], plain)
        print(f"checks: {len(failures)} failures, {time.time() - t0:.0f} s")
        sys.exit(1 if failures else 0)
    if A.qlora:
        qlora_fsdp_vs_ddp(models["llama"], plain)
        print(f"qlora: {len(failures)} failures, {time.time() - t0:.0f} s")
        sys.exit(1 if failures else 0)

    cells = []  # (cell name, objective, adapter, model dir, data path)
    for objective in A.objectives.split(","):
        if objective not in OBJECTIVES:
            sys.exit(f"unknown objective '{objective}' (known: {', '.join(OBJECTIVES)})")
        for adapter in A.adapters.split(","):
            cells.append((f"llama/{objective}/{adapter}", objective, adapter, models["llama"], plain))
    for extra in filter(None, A.extra.split(",")):
        if extra == "qwen3":
            models["qwen3"] = os.path.join(A.work, "qwen3")
            make_tiny_model(models["qwen3"], tok_dir, "qwen3")
            cells.append(("qwen3/dpo-sigmoid/none", "dpo-sigmoid", "none", models["qwen3"], plain))
        elif extra == "conversational":
            cells.append(("llama-chat/dpo-sigmoid/none", "dpo-sigmoid", "none", models["llama"], conv))
        elif extra in ("conversational-simpo", "conversational-orpo"):
            objective = extra.split("-")[1]
            cells.append((f"llama-chat/{objective}/none", objective, "none", models["llama"], conv))
        else:
            sys.exit(f"unknown extra cell '{extra}'")

    trainrun_ok = not A.trl_only
    if trainrun_ok:
        missing = missing_plugins()
        if missing:
            fail(f"trainrun ({A.trainrun}) lacks the component(s) {', '.join(repr(m) for m in missing)} "
                 f"(`trainrun plugins` does not list them): the preference objectives are not built; "
                 f"the TRL side runs and prints alone")
            trainrun_ok = False

    print(f"strategy {A.strategy}, {len(PAIRS)} pairs, {A.batch} per step, {STEPS} steps, lr {LR}, seed {SEED}")
    for cell, objective, adapter, model_dir, data_path in cells:
        kind = OBJECTIVES[objective][1]
        cell_dir = os.path.join(A.work, cell.replace("/", "-"))
        os.makedirs(cell_dir)
        run_dir = os.path.join(cell_dir, "run")
        job = os.path.join(cell_dir, "job.toml")
        write_job(job, model_dir, data_path, run_dir, objective, adapter)
        init_adapter = None
        if trainrun_ok and adapter == "lora":
            # trainrun's initial adapter: the same job with lr 0 for one step writes it unchanged
            probe_dir = os.path.join(cell_dir, "init-run")
            write_job(os.path.join(cell_dir, "init.toml"), model_dir, data_path, probe_dir, objective, adapter,
                      lr=0.0, steps=1)
            rc, out = run_trainrun(os.path.join(cell_dir, "init.toml"))
            open(os.path.join(cell_dir, "init.log"), "w").write(out)
            if rc == 0 and os.path.isfile(os.path.join(probe_dir, "adapter", "adapter_model.safetensors")):
                init_adapter = os.path.join(probe_dir, "adapter")
            else:
                fail(f"{cell}: the lr = 0 run for trainrun's initial adapter exited {rc}:\n{out[-1500:]}")
        t = time.time()
        try:
            trl = run_trl(objective, model_dir, data_path, adapter, os.path.join(cell_dir, "trl"), init_adapter)
        except Exception as e:  # noqa: BLE001 - a failure of the cell, reported
            fail(f"{cell}: TRL failed: {type(e).__name__}: {e}")
            continue
        print(f"{cell}: TRL {time.time() - t:.1f} s")
        if sorted(trl) != [1, STEPS]:
            fail(f"{cell}: TRL logged steps {sorted(trl)}")
        with open(os.path.join(cell_dir, "trl.json"), "w") as f:
            json.dump(trl, f, indent=1)
        if not trainrun_ok:
            print_trl(cell, trl)
            continue
        t = time.time()
        rc, out = run_trainrun(job)
        open(os.path.join(cell_dir, "log"), "w").write(out)
        if rc != 0:
            fail(f"{cell}: trainrun exited {rc}:\n{out[-1500:]}")
            print_trl(cell, trl)
            continue
        runs = read_metrics(run_dir)
        world = A.world if STRATEGIES[A.strategy][1] > 1 else 1
        if len(runs) != world:
            fail(f"{cell}: {len(runs)} metrics files for {world} ranks")
        print(f"{cell}: trainrun {time.time() - t:.1f} s")
        compare(cell, kind, trl, runs)
        if A.padding_free:
            packed_dir = os.path.join(cell_dir, "run-padding-free")
            rc, out = run_trainrun(job, ["data.padding_free=true", f"trainer.run_dir={packed_dir}"])
            open(os.path.join(cell_dir, "log-padding-free"), "w").write(out)
            if rc != 0:
                fail(f"{cell}: trainrun with padding_free exited {rc}:\n{out[-1500:]}")
                continue
            packed = read_metrics(packed_dir)
            compare(cell + " (padding_free)", kind, trl, packed)
            compare_packed(cell, runs, packed)

    print(f"{A.strategy}: {len(cells)} cells, {len(failures)} failures, {time.time() - t0:.0f} s")
    if failures:
        print("failures:\n  " + "\n  ".join(f.splitlines()[0] for f in failures))
        sys.exit(1)
    print("OK")


main()
