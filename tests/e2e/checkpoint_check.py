#!/usr/bin/env python3
"""Checks for the checkpoint tests (standard library only: json + struct, an independent reader
of the safetensors format).

  checkpoint_check.py same-weights A.safetensors B.safetensors
      every tensor of A is in B with the same dtype, shape and BYTES (tolerance 0), and no extra
  checkpoint_check.py same-losses REF_DIR RUN_DIR FIRST_STEP [--skips]
      RUN_DIR (a resumed run) logged exactly the steps FIRST_STEP..last of REF_DIR, no earlier
      ones (a resume that retrained from step 1 fails), with the same losses (exactly) and the
      same skipped steps; with --skips at least one of those steps was skipped (fp16-mixed's
      overflow after the resume point)
  checkpoint_check.py consolidated OUT_DIR REF.safetensors
      OUT_DIR's model.safetensors, or the shards its model.safetensors.index.json lists, hold
      exactly REF's tensor names with the same bytes
  checkpoint_check.py eval-loss RUN_DIR
      prints the last eval_loss of RUN_DIR/metrics.jsonl
"""
import json, os, struct, sys


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[name] = (v["dtype"], tuple(v["shape"]), blob[8 + n + b:8 + n + e])
    return out


def same_weights(a, b):
    ta, tb = read(a), read(b)
    if set(ta) != set(tb):
        sys.exit(f"tensor names differ: only in {a}: {sorted(set(ta) - set(tb))}; only in {b}: {sorted(set(tb) - set(ta))}")
    differ = [k for k in ta if ta[k] != tb[k]]
    if differ:
        # How far apart, for the message: count of differing float32 elements.
        k = differ[0]
        if ta[k][0] != "F32" or ta[k][:2] != tb[k][:2]:
            sys.exit(f"{len(differ)} of {len(ta)} tensors differ, e.g. {k} ({ta[k][0]} {ta[k][1]} vs {tb[k][0]} {tb[k][1]})")
        fa = struct.unpack(f"<{len(ta[k][2]) // 4}f", ta[k][2])
        fb = struct.unpack(f"<{len(tb[k][2]) // 4}f", tb[k][2])
        n = sum(1 for x, y in zip(fa, fb) if x != y)
        sys.exit(f"{len(differ)} of {len(ta)} tensors differ, e.g. {k}: {n} of {len(fa)} elements, "
                 f"max |diff| {max(abs(x - y) for x, y in zip(fa, fb))}")
    nbytes = sum(len(v[2]) for v in ta.values())
    print(f"bitwise equal: {len(ta)} tensors, {nbytes} bytes, 0 differing bits")


def step_rows(run_dir):
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    return {r["step"]: r for r in rows if "loss" in r and "eval_loss" not in r}


def same_losses(ref, run, first, want_skip=False):
    a, b = step_rows(ref), step_rows(run)
    steps = sorted(b)
    want = [s for s in sorted(a) if s >= first]
    if steps != want:
        sys.exit(f"{run}: logged steps {steps[:3]}...{steps[-3:]}, expected exactly "
                 f"{want[:1]}..{want[-1:]} (a resume continues at step {first})")
    for s in steps:
        if a[s]["loss"] != b[s]["loss"]:
            sys.exit(f"step {s}: loss {b[s]['loss']!r} vs reference {a[s]['loss']!r}")
        if bool(a[s].get("skipped")) != bool(b[s].get("skipped")):
            sys.exit(f"step {s}: skipped {b[s].get('skipped')} vs reference {a[s].get('skipped')}")
    skipped = [s for s in steps if b[s].get("skipped")]
    if want_skip and not skipped:
        sys.exit(f"{run}: no step was skipped after step {first - 1}, expected fp16's overflow skip")
    print(f"losses equal (exactly) at steps {steps[0]}..{steps[-1]}, skipped steps {skipped}")


def consolidated(out, ref):
    idx = os.path.join(out, "model.safetensors.index.json")
    got = {}
    if os.path.exists(idx):
        weight_map = json.load(open(idx))["weight_map"]
        for fname in sorted(set(weight_map.values())):
            part = read(os.path.join(out, fname))
            for k in part:
                if weight_map.get(k) != fname:
                    sys.exit(f"{fname}: tensor {k} not listed for it in the index")
            got.update(part)
        print(f"index: {len(weight_map)} tensors in {len(set(weight_map.values()))} files")
    else:
        got = read(os.path.join(out, "model.safetensors"))
    want = read(ref)
    if set(got) != set(want):
        sys.exit(f"names differ: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}")
    differ = [k for k in want if want[k] != got[k]]
    if differ:
        sys.exit(f"{len(differ)} tensors differ from {ref}, e.g. {differ[0]}")
    print(f"consolidated model: {len(got)} tensors, same names and bytes as {ref}")


def eval_loss(run_dir):
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    print(repr([r for r in rows if "eval_loss" in r][-1]["eval_loss"]))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "same-weights":
        same_weights(*args)
    elif cmd == "same-losses":
        same_losses(args[0], args[1], int(args[2]), "--skips" in args[3:])
    elif cmd == "consolidated":
        consolidated(*args)
    elif cmd == "eval-loss":
        eval_loss(*args)
    else:
        sys.exit(f"unknown command {cmd}")
