#!/usr/bin/env bash
# precision_matrix.sh <trainrun> <job> <work-dir> <strategy> <precision> <world> [--set ...]
# One cell of the strategy x precision matrix, composed from the job file and --set alone: a few
# steps that must end with a finite loss on every rank (and the precision's own figures where it
# has them: fp16-mixed logs its loss scale every step).
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 job=$2 work=$3 strategy=$4 precision=$5 world=$6
shift 6
rm -rf "$work" && mkdir -p "$work"
dist=()
if [ "$world" -gt 1 ]; then
  dist=(--set launch.nproc_per_node="$world" --set accelerator.plugin=gloo-cpu
        --set accelerator.timeout_s=60)
fi
run "$work/log" timeout 100 "$tr" --config "$job" --set trainer.run_dir="$work/run" \
  --set strategy.plugin="$strategy" --set precision.plugin="$precision" "${dist[@]}" "$@"
grep -q "strategy $strategy | precision $precision" "$work/log" || fail "banner does not name $strategy / $precision"
py - "$work/run" "$world" "$precision" <<'PY'
import glob, json, math, sys
run, world, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = sorted(glob.glob(f"{run}/metrics*.jsonl"))
assert len(files) == world, f"{len(files)} metrics files for {world} ranks"
for f in files:
    rows = [json.loads(l) for l in open(f)]
    steps = [r for r in rows if "loss" in r and "eval_loss" not in r]
    evals = [r for r in rows if "eval_loss" in r]
    assert steps and evals, f"{f}: no steps or no evaluation"
    bad = [r["step"] for r in steps if not math.isfinite(r["loss"])]
    assert not bad, f"{f}: non-finite loss at steps {bad}"
    assert math.isfinite(evals[-1]["eval_loss"]), f"{f}: final eval loss {evals[-1]['eval_loss']}"
    if precision == "fp16-mixed":
        assert all("loss_scale" in r for r in steps), f"{f}: loss_scale missing"
    skipped = sum(1 for r in steps if r.get("skipped"))
    assert skipped < len(steps), f"{f}: every step was skipped"
    print(f"{f.split('/')[-1]}: {len(steps)} steps, loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}, "
          f"eval {evals[-1]['eval_loss']:.4f}, skipped {skipped}, "
          f"loss_scale {[r.get('loss_scale', 1) for r in steps]}")
PY
