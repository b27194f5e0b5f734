"""Reward models against TRL 1.16's RewardTrainer and transformers: the `reward` objective with
the `preference` dataset (trainer = "reward") and llama's score head
(LlamaForSequenceClassification), step by step against TRL on the same tiny random model, the
same pairs and the same optimizer; then the trained model loaded by transformers must give
`trainrun score`'s scores.

Model: transformers' LlamaForSequenceClassification (num_labels 1, pad_token_id = the tokenizer's
pad) from config (hidden 32, 2 layers, GQA 4/2 heads, norm weights perturbed), saved with
chat_data.py's byte-level BPE tokenizer (320 ids, EOS <|im_end|>, pad <|endoftext|>, ChatML).
Data: 16 fixed pairs of varied lengths, plain text (TRL appends the EOS text), and the same as
chat messages. One step is the whole set (global_batch_size 16); 10 AdamW steps, fp32, one thread.

Checked per cell: every figure TRL logs at steps 1 and 10 that trainrun's metrics.jsonl has
(loss, grad_norm, learning_rate, accuracy, margin, min_reward, mean_reward, max_reward) on every
rank's file: |trainrun - TRL| <= max(rel * |TRL|, 1e-6), rel 1e-5 at step 1 and 1e-4 at step 10.
With --strategy ddp|fsdp|zero3 trainrun runs at --world ranks (--micro: accumulation) against the
same single-process TRL run. Then (single, plain cell): transformers loads <run_dir>/hf as
AutoModelForSequenceClassification and its score of every chosen and rejected sequence equals
`trainrun score --input`'s within 1e-5 (and TRL's trained model's within 1e-3); a causal LM
directory loaded with architecture = "sequence_classification" gets a fresh score head and
keeps every other weight.

usage: reward_vs_trl.py TRAINRUN WORK [--strategy single|ddp|fsdp|zero3] [--world N] [--micro M]
           [--cells plain,center,conversational,lora,margin]
The margin cell gives every pair a "margin" (TRL's RewardTrainer subtracts it in the loss).
"""
import argparse
import json
import math
import os
import re
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
from trl_harness import load_initial_lora_a, metrics_files, table, trl_common_args  # noqa: E402

STEPS, SEED, LR, MAX_LENGTH = 10, 3, 1e-3, 1024
TOL = {1: 1e-5, STEPS: 1e-4}
ABS_FLOOR = 1e-6
REQUIRED = ["loss", "accuracy", "margin", "min_reward", "mean_reward", "max_reward"]
METRIC_ALIAS = {"learning_rate": "lr"}
SKIP = {"epoch", "step", "num_tokens"}
STRATEGIES = {"single": [], "ddp": ["strategy.plugin=ddp"], "fsdp": ["strategy.plugin=fsdp"],
              "zero3": ["strategy.plugin=zero", "strategy.stage=3"]}
CELLS = {  # cell -> (data file key, [objective] extra options, TRL RewardConfig extra, LoRA)
    "plain": ("plain", {}, {}, False),
    "center": ("plain", {"center_rewards_coefficient": 0.01}, {"center_rewards_coefficient": 0.01}, False),
    "conversational": ("chat", {}, {}, False),
    "lora": ("plain", {}, {}, True),
    # a "margin" column (TRL: loss = -logsigmoid(r_chosen - r_rejected - margin)), the dataset's
    # per-pair values handed to the objective (ABI 1.10 SampleValues)
    "margin": ("margin", {}, {}, False),
}
# the margin of pair i in the "margin" data: varied, negative, zero and positive
MARGINS = [round(0.25 * ((i * 7) % 9) - 0.75, 2) for i in range(64)]
LORA_TABLE = {"plugin": "lora", "r": 4, "lora_alpha": 8.0, "target_modules": ["all-linear"]}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

PAIRS = [
    ("What is the capital of Italy?", " Rome is the capital of Italy.", " Milan."),
    ("Name a prime number.", " Seven.", " Nine, which is the product of three and three."),
    ("Q: How many wheels does a bicycle have? A: ", "two.", "three, like a tricycle."),
    ("Finish the saying: an apple a day", " keeps the doctor away.", " is a fruit salad."),
    ("Translate 'gracias' into English.", " Thank you.", " Good morning."),
    ("Why do leaves turn red in autumn?", " As chlorophyll breaks down, red anthocyanins made in the "
     "leaf and yellow carotenoids become visible.", " Because they are cold."),
    ("Write two lines about snow.", " White hush on the hills\nthe footprints fill before dawn", " Snow."),
    ("What is 9 times 8?", " 72.", " 81."),
    ("Give an antonym of 'ancient'.", " Modern.", " Old."),
    ("Q: Which gas do plants take in? A: ", "carbon dioxide.", "oxygen, mostly at night."),
    ("Summarise: The train was late because a tree fell on the line near the station.",
     " A fallen tree delayed the train.", " The station has trees, lines and trains, all of them late."),
    ("Is a tomato a fruit?", " Botanically yes: it develops from a flower and holds seeds.", " No."),
    ("List three colours of the rainbow.", " Red, green and violet.", " Black, white and grey."),
    ("How do you make tea?", " Pour boiling water on the leaves, steep a few minutes, then strain.",
     " Freeze it."),
    ("Spell 'rhythm'.", " r-h-y-t-h-m.", " r-i-t-h-m."),
    ("Say goodbye.", " Goodbye!", " I would prefer to keep talking about something else entirely."),
]

ap = argparse.ArgumentParser()
ap.add_argument("trainrun")
ap.add_argument("work")
ap.add_argument("--strategy", default="single", choices=sorted(STRATEGIES))
ap.add_argument("--world", type=int, default=2)
ap.add_argument("--micro", type=int, default=0)
ap.add_argument("--cells", default="plain,center,conversational,lora,margin")
ap.add_argument("--checks", action="store_true", help="instead of the cells: the bad-input errors")
A = ap.parse_args()
failures = []


def fail(msg):
    print("FAIL:", msg, flush=True)
    failures.append(msg)


def make_model(out, tok_dir):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tok_dir)
    cfg = LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, num_labels=1)
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
        model.score.weight.normal_(0.0, 0.5)  # rewards of a useful size from the first step
    model.config._attn_implementation = "eager"
    model.save_pretrained(out)
    for name in os.listdir(tok_dir):
        shutil.copy(os.path.join(tok_dir, name), out)


def write_data(work):
    plain = os.path.join(work, "pairs.jsonl")
    chat = os.path.join(work, "pairs-chat.jsonl")
    with open(plain, "w", encoding="utf-8") as f:
        for p, c, r in PAIRS:
            f.write(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n")
    with open(chat, "w", encoding="utf-8") as f:
        for i, (p, c, r) in enumerate(PAIRS):
            prompt = [{"role": "user", "content": p.strip()}]
            if i % 4 == 1:
                prompt.insert(0, {"role": "system", "content": "You answer briefly."})
            f.write(json.dumps({"prompt": prompt, "chosen": [{"role": "assistant", "content": c.strip()}],
                                "rejected": [{"role": "assistant", "content": r.strip()}]}) + "\n")
    margin = os.path.join(work, "pairs-margin.jsonl")
    with open(margin, "w", encoding="utf-8") as f:
        for i, (p, c, r) in enumerate(PAIRS):
            f.write(json.dumps({"prompt": p, "chosen": c, "rejected": r, "margin": MARGINS[i]}) + "\n")
    return {"plain": plain, "chat": chat, "margin": margin}


def write_job(path, model, data, run_dir, objective_extra, lr=LR, steps=STEPS, arch=None, lora=False):
    job = table("trainer", {"max_steps": steps, "global_batch_size": len(PAIRS), "seed": SEED,
                            "log_every": 1, "run_dir": run_dir})
    m = {"plugin": "llama", "path": model}
    if arch:
        m["architecture"] = arch
    job += table("model", m)
    job += table("data", {"plugin": "preference", "trainer": "reward", "max_length": MAX_LENGTH,
                          "paths": [data], "tokenizer": model})
    job += table("objective", {"plugin": "reward", **objective_extra})
    job += table("optimizer", {"plugin": "adamw", "lr": lr})
    job += table("accelerator", {"plugin": "cpu", "threads": 1})
    job += table("callbacks", {"plugin": "metrics", "all_ranks": True}, array=True)
    if lora:
        job += table("callbacks", LORA_TABLE, array=True)
    with open(path, "w") as f:
        f.write(job)


def run_trainrun(job, strategy="single"):
    cmd = [A.trainrun, "--config", job]
    for s in STRATEGIES[strategy]:
        cmd += ["--set", s]
    if strategy != "single":
        cmd += ["--set", f"launch.nproc_per_node={A.world}", "--set", "accelerator.plugin=gloo-cpu",
                "--set", "accelerator.timeout_s=60"]
        if A.micro:
            cmd += ["--set", f"trainer.micro_batch_size={A.micro}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


read_metrics = metrics_files


def load_initial_adapter(model, adapter_dir):
    """trainrun's initial lora_A into the PeftModel (trl_harness); the score head's trainable copy
    starts from the model's on both sides, and trainrun's adapter must save it."""
    from safetensors.torch import load_file
    if "base_model.model.score.weight" not in load_file(os.path.join(adapter_dir, "adapter_model.safetensors")):
        raise RuntimeError("trainrun's adapter does not save the score head (modules_to_save)")
    return load_initial_lora_a(model, adapter_dir)


def run_trl(model_dir, data, out_dir, extra, init_adapter=None):
    from datasets import load_dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, PrinterCallback
    from trl import RewardConfig, RewardTrainer

    args = RewardConfig(**trl_common_args(out_dir, len(PAIRS), LR, STEPS, SEED, MAX_LENGTH), **extra)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32,
                                                               attn_implementation="eager")
    ds = load_dataset("json", data_files=data, split="train")
    peft_config = None
    if init_adapter:
        from peft import LoraConfig
        peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS, bias="none",
                                 task_type="SEQ_CLS")
    trainer = RewardTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, peft_config=peft_config)
    trainer.remove_callback(PrinterCallback)
    if init_adapter:
        n = load_initial_adapter(trainer.model, init_adapter)
        print(f"    TRL: lora_A of {n} modules from trainrun's initial adapter")
    trainer.train()
    rows = {r["step"]: r for r in trainer.state.log_history if "loss" in r and "train_runtime" not in r}
    return {s: rows[s] for s in sorted(rows) if s in (1, STEPS)}, trainer.model


def compare(cell, trl, runs):
    keys = sorted({k for row in trl.values() for k in row} - SKIP)
    if not runs:
        fail(f"{cell}: trainrun wrote no metrics file")
    for name, steps in runs.items():
        print(f"  {cell}: {name}")
        print(f"    {'step':>4} {'metric':<14} {'TRL':>16} {'trainrun':>16} {'diff':>10} {'tol':>8}")
        for step, ref in trl.items():
            ours = steps.get(step)
            if ours is None:
                fail(f"{cell}: {name} has no row for step {step}")
                continue
            for k in REQUIRED:
                if k not in ours:
                    fail(f"{cell}: {name} step {step} lacks '{k}'")
            for k in keys:
                r, v = ref[k], ours.get(METRIC_ALIAS.get(k, k))
                if v is None:
                    fail(f"{cell}: {name} step {step}: TRL logs '{k}', trainrun does not")
                    continue
                if A.micro and k in ("min_reward", "max_reward"):
                    # With accumulation both sides log the mean over micro-batches of each
                    # micro-batch's extreme (TRL too, with gradient_accumulation_steps > 1); TRL ran
                    # one micro-batch per step, so only the bound holds: the mean of the
                    # micro-batches' minima is no lower than the whole batch's minimum.
                    ok = v >= r - ABS_FLOOR if k == "min_reward" else v <= r + ABS_FLOOR
                    print(f"    {step:>4} {k:<14} {r:>16.9g} {v:>16.9g}  (accumulation: bound only){'' if ok else '  <-- FAIL'}")
                    if not ok:
                        fail(f"{cell}: {name} step {step} {k}: {v!r} beyond the whole batch's {r!r}")
                    continue
                tol = max(TOL[step] * abs(r), ABS_FLOOR)
                d = abs(v - r) if math.isfinite(v) else math.inf
                mark = "" if d <= tol else "  <-- FAIL"
                print(f"    {step:>4} {k:<14} {r:>16.9g} {v:>16.9g} {d:>10.2e} {tol:>8.1e}{mark}")
                if d > tol:
                    fail(f"{cell}: {name} step {step} {k}: trainrun {v!r}, TRL {r!r} (|diff| {d:.3g} > {tol:.3g})")


def check_scores(cell_dir, run_dir, data, trl_model, base=None):
    """transformers' scores of trainrun's saved model (or PEFT's of its adapter on `base`) =
    `trainrun score`'s; TRL's trained model close."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    hf = os.path.join(run_dir, "hf") if base is None else base
    adapter = [] if base is None else ["--adapter", os.path.join(run_dir, "adapter")]
    if not os.path.isfile(os.path.join(hf, "config.json")):
        fail(f"{run_dir}: no hf/ directory was written")
        return
    cfg = json.load(open(os.path.join(hf, "config.json")))
    if cfg.get("architectures") != ["LlamaForSequenceClassification"]:
        fail(f"{hf}/config.json: architectures {cfg.get('architectures')}")
    r = subprocess.run([A.trainrun, "score", "--model", hf, "--input", data, "--jsonl", "--threads", "1"] + adapter,
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        fail(f"trainrun score exited {r.returncode}: {r.stderr[-1500:]}")
        return
    ours = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    tok = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForSequenceClassification.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager")
    if base is not None:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, os.path.join(run_dir, "adapter"))
    model.eval()
    trl_model.eval()
    worst = worst_trl = worst_abs = 0.0
    over = []
    with torch.no_grad():
        for (p, c, rj), row in zip(PAIRS, ours):
            for key, completion in (("chosen", c), ("rejected", rj)):
                text = p + completion
                if not text.endswith(tok.eos_token):
                    text += tok.eos_token
                ids = torch.tensor([tok(text)["input_ids"]])
                ref = model(input_ids=ids).logits[0, 0].item()
                got = row[key]
                worst = max(worst, abs(got - ref) / max(abs(ref), 1e-3))
                worst_abs = max(worst_abs, abs(got - ref))
                if abs(got - ref) > max(1e-5 * abs(ref), ABS_FLOOR):
                    over.append((key, ref, got))
                worst_trl = max(worst_trl, abs(trl_model(input_ids=ids).logits[0, 0].item() - ref) / max(abs(ref), 1e-3))
    print(f"  scores: trainrun score vs transformers on {hf}{' + adapter' if base else ''}: max rel diff {worst:.2e}, "
          f"max abs diff {worst_abs:.2e} (32 sequences); "
          f"TRL's trained model vs trainrun's: {worst_trl:.2e}")
    if over:
        fail(f"trainrun score differs from transformers beyond max(1e-5 relative, {ABS_FLOOR} absolute): {over[:4]}")
    if worst_trl > 1e-3:
        fail(f"TRL's trained reward model scores differ from trainrun's by {worst_trl:.3g} > 1e-3")
    acc = r.stderr.strip().splitlines()[-1]
    print(f"  {acc}")


def check_conversion(work, causal_dir, data):
    """A causal LM directory as a reward model: fresh score head, every other weight kept."""
    from safetensors.torch import load_file
    run_dir = os.path.join(work, "convert-run")
    job = os.path.join(work, "convert.toml")
    write_job(job, causal_dir, data, run_dir, {}, lr=0.0, steps=1, arch="sequence_classification")
    rc, out = run_trainrun(job)
    open(os.path.join(work, "convert.log"), "w").write(out)
    if rc != 0:
        fail(f"causal LM -> reward model: trainrun exited {rc}:\n{out[-1500:]}")
        return
    before = load_file(os.path.join(causal_dir, "model.safetensors"))
    after = load_file(os.path.join(run_dir, "hf", "model.safetensors"))
    kept = [k for k in before if k != "lm_head.weight"]
    same = all(torch.equal(before[k], after[k]) for k in kept)
    score = after.get("score.weight")
    extra = sorted(set(after) - set(kept) - {"score.weight"})
    ok = same and score is not None and list(score.shape) == [1, 32] and not extra and "lm_head.weight" not in after
    std = score.std().item() if score is not None else float("nan")
    print(f"  conversion: {len(kept)} weights kept {'exactly' if same else 'NOT exactly'}, score {list(score.shape) if score is not None else None} "
          f"std {std:.4f} (initializer_range 0.02), lm_head dropped: {'lm_head.weight' not in after}")
    if not ok or not (0.005 < std < 0.06):
        fail(f"causal LM -> reward model: kept={same}, score={None if score is None else list(score.shape)}, "
             f"extra={extra}, std={std}")


def checks(model_dir, data):
    """Jobs that must stop before training with exit 2 and a message naming what is wrong."""
    from transformers import LlamaConfig, LlamaForCausalLM
    causal = os.path.join(A.work, "llama-lm")
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "id2label", "label2id")})).save_pretrained(causal)
    for name in os.listdir(model_dir):
        if name.startswith("tokenizer") or name.endswith(".jinja") or name == "special_tokens_map.json":
            shutil.copy(os.path.join(model_dir, name), causal)
    rows = [json.loads(l) for l in open(data)]
    partial_margin = os.path.join(A.work, "partial-margin.jsonl")
    with open(partial_margin, "w") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps({**row, **({"margin": 0.5} if i % 2 else {})}) + "\n")
    bad_margin = os.path.join(A.work, "bad-margin.jsonl")
    with open(bad_margin, "w") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps({**row, "margin": "big" if i == 1 else 0.5}) + "\n")
    cases = [  # (name, job edits, words the error must contain)
        ("dpo layout + reward", lambda j: j.replace('trainer = "reward"', 'trainer = "dpo"'),
         ["[objective] reward", "'reward'", "'preference'", 'trainer = "reward"']),
        ("causal LM + reward", lambda j: j.replace(f'path = "{model_dir}"', f'path = "{causal}"', 1),
         ["sequence-classification head", "architecture"]),
        ("reward layout without objective", lambda j: re.sub(r"\[objective\][^\[]*", "", j),
         ["[objective]", "reward"]),
        ("reward layout + keep_end", lambda j: j.replace('trainer = "reward"', 'trainer = "reward"\ntruncation_mode = "keep_end"'),
         ["truncation_mode", "RewardTrainer"]),
        ("seq-cls model as causal LM", lambda j: j.replace('plugin = "llama"', 'plugin = "llama"\narchitecture = "causal_lm"'),
         ["cannot be loaded as a causal LM"]),
        ("kto on reward data", lambda j: j.replace('plugin = "reward"', 'plugin = "kto"'),
         ["[objective] kto", 'plugin = "unpaired"']),
        ("margin on some pairs only", lambda j: j.replace(data, partial_margin),
         ["with a \"margin\"", "without one", "every pair"]),
        ("margin not a number", lambda j: j.replace(data, bad_margin), [bad_margin + ":2", "margin must be a number"]),
        ("reward layout + padding_free", lambda j: j.replace('trainer = "reward"', 'trainer = "reward"\npadding_free = true'),
         ["padding_free", 'trainer = \"reward\"']),
    ]
    # `trainrun check` refuses the jobs whose objective and data disagree as the run does.
    check_cases = {"dpo layout + reward", "reward layout without objective", "kto on reward data"}
    base = os.path.join(A.work, "base.toml")
    write_job(base, model_dir, data, os.path.join(A.work, "checks-run"), {})
    text = open(base).read()
    for name, edit, words in cases:
        job = os.path.join(A.work, name.replace(" ", "_") + ".toml")
        open(job, "w").write(edit(text))
        rc, out = run_trainrun(job)
        err = [l for l in out.splitlines() if "error" in l.lower()]
        msg = err[-1] if err else out.strip().splitlines()[-1:]
        ok = rc == 2 and all(w in out for w in words)
        print(f"  check {name}: exit {rc}: {msg}")
        if not ok:
            fail(f"check {name}: expected exit 2 naming {words}, got exit {rc}:\n{out[-1200:]}")
        if name in check_cases:
            r = subprocess.run([A.trainrun, "check", "--config", job], capture_output=True, text=True, timeout=120)
            out = r.stdout + r.stderr
            print(f"  trainrun check {name}: exit {r.returncode}")
            if r.returncode != 2 or not all(w in out for w in words):
                fail(f"trainrun check {name}: expected exit 2 naming {words}, got exit {r.returncode}:\n{out[-1200:]}")
    # The commands around a reward model: scoring a causal LM says how to score a LoRA run;
    # generating with a reward model says to score instead.
    commands = [
        ("score a causal LM", ["score", "--model", causal, "--text", "hello"], ["no sequence-classification head", "--adapter"]),
        ("generate with a reward model", ["generate", "--model", model_dir, "--prompt", "hi", "--max-new-tokens", "2"],
         ["does not generate", "trainrun score"]),
    ]
    for name, args, words in commands:
        r = subprocess.run([A.trainrun] + args, capture_output=True, text=True, timeout=120)
        out = r.stdout + r.stderr
        print(f"  check {name}: exit {r.returncode}: {out.strip().splitlines()[-1:]}")
        if r.returncode != 2 or not all(w in out for w in words):
            fail(f"check {name}: expected exit 2 naming {words}, got exit {r.returncode}:\n{out[-1200:]}")


def main():
    t0 = time.time()
    import transformers
    transformers.utils.logging.disable_progress_bar()
    shutil.rmtree(A.work, ignore_errors=True)
    os.makedirs(A.work)
    from chat_data import write_tokenizer
    tok_dir = os.path.join(A.work, "tokenizer")
    write_tokenizer(tok_dir, seed=1, count=48)
    model_dir = os.path.join(A.work, "llama-rm")
    make_model(model_dir, tok_dir)
    data = write_data(A.work)
    if A.checks:
        checks(model_dir, data["plain"])
        print(f"reward checks: {len(failures)} failures, {time.time() - t0:.0f} s")
        sys.exit(1 if failures else 0)
    print(f"strategy {A.strategy}{f' x{A.world}' if A.strategy != 'single' else ''}, {len(PAIRS)} pairs per step, "
          f"{STEPS} steps, lr {LR}, seed {SEED}")
    for cell in filter(None, A.cells.split(",")):
        key, obj_extra, trl_extra, lora = CELLS[cell]
        cell_dir = os.path.join(A.work, cell)
        os.makedirs(cell_dir)
        init_adapter = None
        if lora:
            # trainrun's initial adapter: the same job with lr 0 for one step writes it unchanged
            probe = os.path.join(cell_dir, "init-run")
            write_job(os.path.join(cell_dir, "init.toml"), model_dir, data[key], probe, obj_extra, lr=0.0, steps=1,
                      lora=True)
            rc, out = run_trainrun(os.path.join(cell_dir, "init.toml"), A.strategy)
            init_adapter = os.path.join(probe, "adapter")
            if rc != 0 or not os.path.isfile(os.path.join(init_adapter, "adapter_model.safetensors")):
                fail(f"{cell}: the lr = 0 run for trainrun's initial adapter exited {rc}:\n{out[-1500:]}")
                continue
        t = time.time()
        trl, trl_model = run_trl(model_dir, data[key], os.path.join(cell_dir, "trl"), trl_extra, init_adapter)
        print(f"{cell}: TRL {time.time() - t:.1f} s")
        run_dir = os.path.join(cell_dir, "run")
        job = os.path.join(cell_dir, "job.toml")
        write_job(job, model_dir, data[key], run_dir, obj_extra, lora=lora)
        t = time.time()
        rc, out = run_trainrun(job, A.strategy)
        open(os.path.join(cell_dir, "log"), "w").write(out)
        if rc != 0:
            fail(f"{cell}: trainrun exited {rc}:\n{out[-2500:]}")
            continue
        print(f"{cell}: trainrun {time.time() - t:.1f} s")
        compare(cell, trl, read_metrics(run_dir))
        if cell in ("plain", "lora") and A.strategy == "single":
            check_scores(cell_dir, run_dir, data["plain"], trl_model, base=model_dir if lora else None)
    if A.strategy == "single" and "plain" in A.cells.split(","):
        from transformers import LlamaConfig, LlamaForCausalLM
        causal = os.path.join(A.work, "llama-lm")
        cfg = json.load(open(os.path.join(model_dir, "config.json")))
        lm = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items()
                                             if k not in ("architectures", "id2label", "label2id")}))
        lm.save_pretrained(causal)
        for name in os.listdir(tok_dir):
            shutil.copy(os.path.join(tok_dir, name), causal)
        check_conversion(A.work, causal, data["plain"])
    print(f"reward: {len(failures)} failures, {time.time() - t0:.0f} s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
