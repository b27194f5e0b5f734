#!/usr/bin/env python3
"""The held-out DPO metrics of a `preference` + `dpo` LoRA job (configs/smollm2-dpo.toml),
recomputed with transformers + PEFT, for the base model (the reference) and for base + the run's
adapter (the policy). Pairs are tokenized as TRL 1.16's DPOTrainer._prepare_dataset does: for
conversational rows the prompt rendered with the tokenizer's chat template and
add_generation_prompt=True, prompt+chosen and prompt+rejected rendered without it (all
apply_chat_template(..., tokenize=True)); the prompt is the shorter common token prefix of the
prompt's ids with either, the completions the rest; each sequence keeps its first max_length
tokens and a pair whose prompt fills max_length is dropped (truncation_mode = "keep_start").
Standard (string) rows: tokenizer(text), the EOS token's text appended to the completions. A
sequence's log-probability is the sum over its completion tokens of log p(token | before).

Per model, over the held-out pairs (TRL's names in brackets):
  accuracy  policy: the fraction of pairs where (log pi(c) - log ref(c)) - (log pi(r) - log ref(r))
            > 0 [rewards/accuracies]; base: the fraction where log p(c) > log p(r) (its log-ratios
            against itself are zero)
  margin    mean beta * (delta chosen - delta rejected) [rewards/margins]; 0 for the base by
            definition, so its row shows beta * (log p(c) - log p(r)) in brackets instead
  logp(c), logp(r)  mean log-probability of the chosen / rejected completion [logps/chosen, ...]

  python scripts/check_dpo_heldout.py JOB.toml RUN_DIR [--set key=value]... [--limit N]
      [--threads N] [--base-only] [--json OUT]

The held-out pairs are data.eval_paths (in file order; --limit N: the first N kept). The adapter is
RUN_DIR/adapter (PEFT format); without it, or with --base-only, only the base model is measured.
When RUN_DIR/metrics.jsonl holds an evaluation with rewards/* metrics, its last one is printed for
comparison (trainrun evaluates every held-out pair; use no --limit to compare). --set overrides job
keys as trainrun's --set does. Needs the reference venv (scripts/venv)."""
import argparse
import json
import os
import sys
import tomllib

sys.dont_write_bytecode = True  # no scripts/__pycache__ from the import below
# trainrun --set's KEY=VALUE, TOML-typed; the eval files' rows as check_sft_heldout reads them
from check_sft_heldout import jsonl_rows, set_key


def read_rows(patterns):
    rows = []
    for path, n, r in jsonl_rows(patterns, "check_dpo_heldout"):
        if "prompt" not in r:
            sys.exit(f"check_dpo_heldout: {path}:{n}: no \"prompt\" (implicit prompts are not reproduced)")
        rows.append(r)
    return rows


def common_prefix_length(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tokenize_pair(tok, row):
    """(prompt_ids, chosen_ids, rejected_ids, cut) as DPOTrainer._prepare_dataset makes them; cut:
    the tokenized prompt alone was longer than the common prefix (TRL warns)."""
    if isinstance(row["chosen"], list):
        kw = {"tools": row.get("tools"), **row.get("chat_template_kwargs", {})}
        if isinstance(kw["tools"], str):
            kw["tools"] = json.loads(kw["tools"])
        enc = lambda msgs, **extra: tok.apply_chat_template(msgs, tokenize=True, return_dict=True, **extra, **kw)["input_ids"]
        p = enc(row["prompt"], add_generation_prompt=True)
        pc = enc(row["prompt"] + row["chosen"])
        pr = enc(row["prompt"] + row["rejected"])
    else:
        eos = tok.eos_token
        c, r = row["chosen"], row["rejected"]
        c, r = (c if c.endswith(eos) else c + eos), (r if r.endswith(eos) else r + eos)
        p = tok(text=row["prompt"])["input_ids"]
        pc = tok(text=row["prompt"] + c)["input_ids"]
        pr = tok(text=row["prompt"] + r)["input_ids"]
    n = min(common_prefix_length(p, pc), common_prefix_length(p, pr))
    return p[:n], pc[n:], pr[n:], n < len(p)


def completion_logp(model, torch, prompt, completion, max_length):
    """Sum of log p(token) over the completion tokens kept within max_length (keep_start)."""
    ids = (prompt + completion)[:max_length] if max_length else prompt + completion
    logits = model(torch.tensor([ids])).logits[0, :-1].double()
    logp = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    return logp[len(prompt) - 1:].sum().item()  # targets ids[len(prompt):]


def measure(model, torch, pairs, max_length, what):
    out = []
    with torch.no_grad():
        for k, (p, c, r) in enumerate(pairs):
            if k % 50 == 0:
                print(f"  {what}: pair {k} of {len(pairs)}", file=sys.stderr, flush=True)
            out.append((completion_logp(model, torch, p, c, max_length), completion_logp(model, torch, p, r, max_length)))
    return out


def last_eval(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return None
    last = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if any(k.startswith("eval") and "rewards/" in k for k in r):
                last = r
    return last


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("job")
    ap.add_argument("run_dir")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--limit", type=int, default=0, help="only the first N held-out pairs")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--base-only", action="store_true", help="measure the base model only")
    ap.add_argument("--json")
    a = ap.parse_args()
    with open(a.job, "rb") as f:
        job = tomllib.load(f)
    for s in a.set:
        set_key(job, s)
    data, obj = job["data"], job.get("objective", {})
    if data.get("plugin") != "preference" or obj.get("plugin", "dpo") != "dpo":
        sys.exit("check_dpo_heldout: the job is not a `preference` + `dpo` job")
    if data.get("chat_template", "") or data.get("truncation_mode", "keep_start") != "keep_start" or data.get("max_prompt_length", 0):
        sys.exit("check_dpo_heldout: only the tokenizer's own template, keep_start and no max_prompt_length are reproduced")
    if not data.get("eval_paths"):
        sys.exit("check_dpo_heldout: the job has no data.eval_paths")
    beta = float(obj.get("beta", 0.1))
    max_length = int(data.get("max_length", 1024))

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(data["tokenizer"])
    rows = read_rows(data["eval_paths"])
    pairs, dropped, merged = [], 0, 0
    for row in rows:
        p, c, r, cut = tokenize_pair(tok, row)
        merged += int(cut)
        if max_length and len(p) >= max_length:
            dropped += 1  # TRL drops it (keep_start): no completion token would remain
            continue
        pairs.append((p, c, r))
    longest = max(len(p) + max(len(c), len(r)) for p, c, r in pairs)
    if a.limit:
        pairs = pairs[:a.limit]
    print(f"{len(rows)} held-out pairs read, {dropped} dropped (prompt fills max_length = {max_length}); "
          f"measuring {len(pairs)}; longest sequence {longest} tokens; {merged} prompts not a prefix of "
          "prompt+completion (TRL's warning)")

    adapter = os.path.join(a.run_dir, "adapter")
    with_adapter = not a.base_only and os.path.isdir(adapter)
    if not a.base_only and not with_adapter:
        print(f"check_dpo_heldout: no adapter at {adapter}: the base model only")
    model = AutoModelForCausalLM.from_pretrained(job["model"]["path"], dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    ref = measure(model, torch, pairs, max_length, "base model")
    n = len(ref)
    mean = lambda xs: sum(xs) / len(xs)
    table = [{"model": "base", "pairs": n,
              "accuracy": mean([float(c > r) for c, r in ref]),
              "margin": 0.0, "base_margin": mean([beta * (c - r) for c, r in ref]),
              "logps_chosen": mean([c for c, _ in ref]), "logps_rejected": mean([r for _, r in ref])}]
    if with_adapter:
        from peft import PeftModel

        policy = PeftModel.from_pretrained(model, adapter).eval()
        pol = measure(policy, torch, pairs, max_length, "base + adapter")
        d = [(pc - rc) - (pr - rr) for (pc, pr), (rc, rr) in zip(pol, ref)]
        table.append({"model": "base + adapter", "pairs": n,
                      "accuracy": mean([float(x > 0) for x in d]),
                      "margin": mean([beta * x for x in d]),
                      "base_margin": mean([beta * (c - r) for c, r in pol]),
                      "logps_chosen": mean([c for c, _ in pol]), "logps_rejected": mean([r for _, r in pol])})

    print(f"\nheld-out pairs: {n}; beta = {beta}; model {job['model']['path']}"
          + (f", adapter {adapter}" if with_adapter else ""))
    print(f"{'model':<16} {'accuracy':>9} {'margin':>18} {'logp(chosen)':>13} {'logp(rejected)':>15}")
    for t in table:
        margin = f"[{t['base_margin']:+.4f}]" if t["model"] == "base" else f"{t['margin']:+.4f}"
        print(f"{t['model']:<16} {100 * t['accuracy']:>8.1f}% {margin:>18} {t['logps_chosen']:>13.3f} {t['logps_rejected']:>15.3f}")
    print("accuracy: base = log p(chosen) > log p(rejected); policy = chosen log-ratio vs the base > rejected's.\n"
          "margin: beta * (delta chosen - delta rejected); [base: beta * (log p(chosen) - log p(rejected))].")
    ev = last_eval(a.run_dir)
    if ev is not None:
        keys = {k: v for k, v in ev.items() if "rewards/" in k or "logps/" in k or k in ("step", "eval_loss")}
        print("trainrun's last evaluation (metrics.jsonl):", json.dumps(keys))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"beta": beta, "max_length": max_length, "rows": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
