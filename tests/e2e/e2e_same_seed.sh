#!/usr/bin/env bash
# Same seed -> bitwise-identical losses and gradient norms at every step; another seed differs.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 job=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
run "$work/a.log" "$tr" --config "$job" --set trainer.run_dir="$work/a"
run "$work/b.log" "$tr" --config "$job" --set trainer.run_dir="$work/b"
run "$work/c.log" "$tr" --config "$job" --set trainer.run_dir="$work/c" --set trainer.seed=8
py - "$work" <<'PY'
import json, sys
w = sys.argv[1]
def steps(d):
    rows = [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")]
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows if "loss" in r]
a, b, c = steps("a"), steps("b"), steps("c")
assert len(a) == 20, f"expected 20 logged steps, got {len(a)}"
assert a == b, f"same seed differs:\n{a}\n{b}"
assert a != c, "a different seed gave identical losses"
print(f"OK: 20 steps bitwise equal; last loss {a[-1][1]!r}; seed 8 last loss {c[-1][1]!r}")
PY
