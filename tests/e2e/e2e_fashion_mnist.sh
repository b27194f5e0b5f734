#!/usr/bin/env bash
# The shipped Fashion-MNIST job, cut to 300 steps: test accuracy >= 75%, run_dir outputs present.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 job=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
run "$work/log" "$tr" --config "$job" --set trainer.run_dir="$work/run" --set trainer.max_steps=300 \
  --set trainer.eval_every=0 --set accelerator.threads=1
last=$(tail -n 1 "$work/log")
[[ "$last" == "final eval:"* ]] || fail "last stdout line is not the evaluation result: $last"
acc=$(sed -n 's/.*accuracy \([0-9.]*\)%.*/\1/p' <<<"$last")
py -c "import sys; a=float('$acc'); print('accuracy', a); sys.exit(0 if a >= 75 else 1)" || fail "accuracy $acc% < 75%"
[ -f "$work/run/job.toml" ] || fail "no resolved job.toml in run_dir"
py - "$work/run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "loss" in r]
evals = [r for r in rows if "eval_loss" in r]
assert steps and all(k in steps[0] for k in ("step", "rank", "loss", "lr")), steps[:1]
assert evals and "eval_accuracy" in evals[-1], evals
print("metrics.jsonl:", len(steps), "step lines,", len(evals), "eval lines")
PY
