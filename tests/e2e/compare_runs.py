#!/usr/bin/env python3
"""Compares a run with a reference run: per-step losses (metrics.jsonl) and final weights
(model.safetensors), each within a relative tolerance. Standard library only.

  compare_runs.py REF_DIR RUN_DIR [--rtol 1e-5] [--label TEXT]

Loss and gradient norm (the global norm clipping uses, which a sharded strategy assembles from
shards): |x - ref| <= rtol * |ref| at every step. Weights: for every tensor,
||w - ref||_2 <= rtol * ||ref||_2 (an element-wise ratio is meaningless for weights near 0).
Exit 1 with the worst step / tensor named when a figure is out of tolerance."""
import argparse, array, json, math, struct, sys


def steps(run_dir):
    rows = [json.loads(l) for l in open(f"{run_dir}/metrics.jsonl")]
    return [r for r in rows if "loss" in r and "eval_loss" not in r]


def tensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        if v["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor {name} is {v['dtype']}, expected F32")
        b, e = v["data_offsets"]
        a = array.array("f")
        a.frombytes(blob[8 + n + b:8 + n + e])
        if sys.byteorder != "little":
            a.byteswap()
        out[name] = a
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    errors = []
    ref_steps, run_steps = steps(a.ref), steps(a.run)
    if len(ref_steps) != len(run_steps) or not ref_steps:
        raise SystemExit(f"{a.label}: {len(run_steps)} steps logged, reference has {len(ref_steps)}")
    worst_loss, worst_step = 0.0, 0
    for x, y in zip(ref_steps, run_steps):
        if x["step"] != y["step"]:
            errors.append(f"step numbers differ: {y['step']} logged where the reference has {x['step']}")
        rel = abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), 1e-30)
        if rel > worst_loss:
            worst_loss, worst_step = rel, x["step"]
        if rel > a.rtol:
            errors.append(f"step {x['step']}: loss {y['loss']!r} vs reference {x['loss']!r} (rel {rel:.2e})")
    worst_norm, worst_norm_step = 0.0, 0
    for x, y in zip(ref_steps, run_steps):
        # Every step logs its gradient norm; a missing one is a failure, not a skipped check.
        if "grad_norm" not in x or "grad_norm" not in y:
            errors.append(f"step {x['step']}: grad_norm missing from "
                          f"{'the reference' if 'grad_norm' not in x else 'the run'}")
            continue
        rel = abs(x["grad_norm"] - y["grad_norm"]) / max(abs(x["grad_norm"]), 1e-30)
        if rel > worst_norm:
            worst_norm, worst_norm_step = rel, x["step"]
        if rel > a.rtol:
            errors.append(f"step {x['step']}: grad_norm {y['grad_norm']!r} vs reference "
                          f"{x['grad_norm']!r} (rel {rel:.2e})")
    if ref_steps[0]["loss"] == ref_steps[-1]["loss"]:
        errors.append("the reference did not train (first and last loss equal)")
    ref_w, run_w = tensors(f"{a.ref}/model.safetensors"), tensors(f"{a.run}/model.safetensors")
    if sorted(ref_w) != sorted(run_w):
        errors.append(f"tensor names differ: {sorted(set(ref_w) ^ set(run_w))}")
    worst_w, worst_name = 0.0, ""
    for name in ref_w.keys() & run_w.keys():
        r, w = ref_w[name], run_w[name]
        if len(r) != len(w):
            errors.append(f"{name}: {len(w)} elements vs {len(r)}")
            continue
        diff = math.sqrt(sum((p - q) ** 2 for p, q in zip(w, r)))
        norm = math.sqrt(sum(q * q for q in r))
        rel = diff / norm if norm > 0 else diff
        if rel > worst_w:
            worst_w, worst_name = rel, name
        if rel > a.rtol:
            errors.append(f"weights {name}: relative difference {rel:.2e}")
    print(f"{a.label:<28} losses: worst rel {worst_loss:.1e} (step {worst_step}) | "
          f"grad_norm: worst rel {worst_norm:.1e} (step {worst_norm_step}) | "
          f"weights: worst rel {worst_w:.1e} ({worst_name})")
    if errors:
        for e in errors[:10]:
            print(f"  {a.label}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
