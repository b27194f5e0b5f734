#!/usr/bin/env bash
# One batch of 64 vs 4 accumulated micro-batches of 16 over the same samples: the per-step
# losses and gradient norms agree within 1e-6 relative for all 20 steps.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 job=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
run "$work/one.log" "$tr" --config "$job" --set trainer.run_dir="$work/one" --set trainer.micro_batch_size=64
run "$work/acc.log" "$tr" --config "$job" --set trainer.run_dir="$work/acc" --set trainer.micro_batch_size=16
grep -q "micro 16 x accumulation 4" "$work/acc.log" || fail "accumulation was not 4"
py - "$work" <<'PY'
import json, sys
w = sys.argv[1]
def steps(d):
    return [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl") if '"loss"' in l]
one, acc = steps("one"), steps("acc")
assert len(one) == len(acc) == 20
worst = 0.0
for x, y in zip(one, acc):
    for k in ("loss", "grad_norm"):
        rel = abs(x[k] - y[k]) / max(abs(x[k]), 1e-12)
        worst = max(worst, rel)
        assert rel <= 1e-6, f"step {x['step']} {k}: {x[k]!r} vs {y[k]!r} (rel {rel:.2e})"
assert one[0]["loss"] != one[-1]["loss"], "the model did not train"
print(f"OK: worst relative difference {worst:.2e} over 20 steps")
PY
