#!/usr/bin/env python3
"""Checks an fsdp mixed-precision run against the float32 run of the same job (tests/e2e/sharded_e2e.sh
case mixed_precision).

usage: fsdp_mixed_check.py FP32_RUN_DIR MP_RUN_DIR LABEL [--gather-ratio R] [--loss-rtol X]

- every step's training loss and the final evaluation loss within --loss-rtol (relative) of the
  float32 run: bf16 compute follows the float32 trajectory;
- the losses are not all bitwise equal to the float32 ones (the run really computed in bf16);
- with --gather-ratio: on every step, fsdp_max_unit_full_bytes (gathered parameters) is R times
  the float32 run's, and comm_bytes is R times it when --comm-ratio is given;
- the saved model.safetensors holds float32 tensors only (the float32 shards are the master
  weights), read with json + struct.
"""
import argparse, json, struct, sys


def metrics(run):
    steps, evals = {}, []
    for line in open(f"{run}/metrics.jsonl"):
        m = json.loads(line)
        if "eval_loss" in m:
            evals.append(m["eval_loss"])
        elif "loss" in m and "step" in m:
            steps[m["step"]] = m
    return steps, evals


def dtypes(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


ap = argparse.ArgumentParser()
ap.add_argument("ref")
ap.add_argument("run")
ap.add_argument("label")
ap.add_argument("--loss-rtol", type=float, default=0.01)
ap.add_argument("--gather-ratio", type=float)
ap.add_argument("--comm-ratio", type=float)
a = ap.parse_args()

ref, ref_eval = metrics(a.ref)
run, run_eval = metrics(a.run)
errors = []
if sorted(ref) != sorted(run) or not ref:
    errors.append(f"steps differ: {sorted(ref)[:3]}... vs {sorted(run)[:3]}...")
worst, same = 0.0, 0
for s in sorted(set(ref) & set(run)):
    x, y = ref[s]["loss"], run[s]["loss"]
    worst = max(worst, abs(x - y) / abs(x))
    same += x == y
    for key, want in (("fsdp_max_unit_full_bytes", a.gather_ratio), ("comm_bytes", a.comm_ratio)):
        if want is None:
            continue
        # Asked for a ratio: the figure must be logged (and non-zero) by both runs.
        if not ref[s].get(key) or not run[s].get(key):
            errors.append(f"step {s}: {key} missing or zero (reference {ref[s].get(key)}, "
                          f"run {run[s].get(key)})")
            continue
        got = run[s][key] / ref[s][key]
        if abs(got - want) > 1e-9:
            errors.append(f"step {s}: {key} ratio {got:.6f}, expected {want}")
if worst > a.loss_rtol:
    errors.append(f"worst training-loss difference {worst:.3g} > {a.loss_rtol}")
if same == len(ref):
    errors.append("every loss is bitwise equal to the float32 run's: the run did not compute in low precision")
if not ref_eval or not run_eval:
    errors.append("no evaluation loss")
else:
    e = abs(ref_eval[-1] - run_eval[-1]) / abs(ref_eval[-1])
    if e > a.loss_rtol:
        errors.append(f"evaluation loss {run_eval[-1]} vs {ref_eval[-1]}: {e:.3g} > {a.loss_rtol}")
saved = dtypes(f"{a.run}/model.safetensors")
bad = {k: v for k, v in saved.items() if v != "F32"}
if not saved:
    errors.append("model.safetensors holds no tensors")
if bad:
    errors.append(f"model.safetensors has non-float32 tensors: {bad}")
print(f"{a.label}: {len(ref)} steps, worst loss difference vs float32 {worst:.2e}, evaluation "
      f"{run_eval[-1] if run_eval else '?'} vs {ref_eval[-1] if ref_eval else '?'}"
      + (f", gathered bytes x{a.gather_ratio}" if a.gather_ratio else "")
      + (f", comm bytes x{a.comm_ratio}" if a.comm_ratio else ""))
for e in errors:
    print("FAIL:", e)
sys.exit(1 if errors else 0)
