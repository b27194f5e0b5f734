#!/usr/bin/env bash
# precision_matrix.sh <trainrun> <job> <work-dir> <strategy> <precision> <world> <fp32-run-dir> [--set ...]
# One cell of the strategy x precision matrix, composed from the job file and --set alone: a few
# steps that must end with a finite loss on every rank, a loss that falls, and the precision's own
# figures where it has them (fp16-mixed logs its loss scale every step). A reduced-precision cell
# is compared step by step with the same strategy's fp32 cell (<fp32-run-dir>, a CTest fixture):
# its losses must stay within a stated tolerance of fp32's and must not equal them exactly, so a
# cell that silently ran in fp32 fails; fp16-mixed, which computes in float32 on CPU, must equal
# them exactly (power-of-two loss scaling is exact). The fp32 cell passes "-" as <fp32-run-dir>.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 job=$2 work=$3 strategy=$4 precision=$5 world=$6 reference=$7
shift 7
rm -rf "$work" && mkdir -p "$work"
dist=()
if [ "$world" -gt 1 ]; then
  dist=(--set launch.nproc_per_node="$world" --set accelerator.plugin=gloo-cpu
        --set accelerator.timeout_s=60)
fi
run "$work/log" timeout 100 "$tr" --config "$job" --set trainer.run_dir="$work/run" \
  --set strategy.plugin="$strategy" --set precision.plugin="$precision" "${dist[@]}" "$@"
grep -q "strategy $strategy | precision $precision" "$work/log" || fail "banner does not name $strategy / $precision"
resolved=$precision
if [ "$precision" = auto ]; then
  resolved=$(sed -n 's/.*precision auto: \([a-z0-9-]*\).*/\1/p' "$work/log" | head -1)
  [ -n "$resolved" ] || fail "the log does not say what precision auto resolved to"
fi
py - "$work/run" "$world" "$resolved" "$reference" <<'PY'
import glob, json, math, sys
run, world, precision, reference = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
# bf16 keeps 8 significant bits (relative rounding 2^-9), fp16 11; over 6 steps of a loss near
# 5.5 the mixed precisions stay within a few 1e-3 of fp32 here. 0.05 is ten times the largest
# deviation seen and still far below the 0.3 the loss falls over the run.
TOLERANCE = 0.05
def losses(f):
    rows = [json.loads(l) for l in open(f)]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "eval_loss" not in r}
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
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.1, \
        f"{f}: the loss did not fall: {steps[0]['loss']} -> {steps[-1]['loss']}"
    if reference != "-":
        ref_file = f"{reference}/{f.split('/')[-1]}"
        ref = losses(ref_file)
        mine = losses(f)
        assert sorted(ref) == sorted(mine), f"{f}: steps {sorted(mine)} vs fp32's {sorted(ref)}"
        diff = max(abs(mine[k] - ref[k]) for k in ref)
        print(f"{f.split('/')[-1]}: max |loss - fp32 loss| = {diff:.3g} over {len(ref)} steps "
              f"(tolerance {TOLERANCE})")
        assert diff <= TOLERANCE, f"{f}: loss deviates from fp32 ({ref_file}) by {diff}"
        if precision == "fp16-mixed":
            # On the CPU accelerator fp16-mixed computes in float32 (LibTorch's CPU autocast has
            # no float16) and scales by powers of two, which is exact: fp32's losses, bit for bit.
            assert diff == 0, f"{f}: fp16-mixed on CPU differs from fp32 by {diff}: the loss scaling is not exact"
        elif precision != "fp32":
            assert diff > 0, f"{f}: {precision} gave exactly fp32's losses: did it run in fp32?"
    print(f"{f.split('/')[-1]}: {len(steps)} steps, loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}, "
          f"eval {evals[-1]['eval_loss']:.4f}, skipped {skipped}, "
          f"loss_scale {[r.get('loss_scale', 1) for r in steps]}")
PY
