#!/usr/bin/env bash
# Equivalence suite (docs/design.md, invariant 1): a strategy at world size 1, 2 and 4, with 1 and 4
# accumulated micro-batches, on the same global batch, must reproduce the single-process run:
# every step's loss and the final weights within 1e-5 relative (tests/e2e/compare_runs.py).
# Layouts (world x accumulation): 1x1, 2x1, 2x4 and 4x4 by default. Each world size's shard and
# bucket layout runs, and accumulation on and off at the same world; the two left out, 1x4 and
# 4x1, add no layout of their own (a third of the suite's processes, each paying LibTorch's
# ~1 CPU-s start, for CI's 60-minute budget). TRAINRUN_EQUIVALENCE_LAYOUTS="1x1 1x4 2x1 2x4 4x1
# 4x4" runs the whole grid.
#   equivalence.sh TRAINRUN JOB WORK STRATEGY OPTIMIZER [--set strategy.key=value ...]
#                  [--common --set key=value ...]   (after --common: for the reference too)
# OPTIMIZER: sgd (momentum 0.9) or adamw. Global batch 32, 20 steps.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 job=$2 work=$3 strategy=$4 optimizer=$5
shift 5
extra=() common=()
while [ $# -gt 0 ]; do
  if [ "$1" = --common ]; then shift; common=("$@"); break; fi
  extra+=("$1"); shift
done
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
case $optimizer in
  sgd) opt=(--set optimizer.plugin=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9) ;;
  adamw) opt=(--set optimizer.plugin=adamw --set optimizer.lr=0.002 --set optimizer.weight_decay=0.01) ;;
  *) fail "unknown optimizer $optimizer" ;;
esac
G=32
t0=$(now)
quiet_run "$work/ref.log" "$tr" --config "$job" "${opt[@]}" "${common[@]}" --set strategy.plugin=single \
  --set accelerator.plugin=cpu --set trainer.micro_batch_size=$G --set trainer.run_dir="$work/ref"
echo "reference: single, world 1, micro $G ($(elapsed "$t0") s)"
status=0
for layout in ${TRAINRUN_EQUIVALENCE_LAYOUTS:-1x1 2x1 2x4 4x4}; do
  world=${layout%x*} acc=${layout#*x}
  micro=$(( G / (world * acc) ))
  name="$strategy world $world acc $acc"
  dir="$work/w${world}-a${acc}"
  t0=$(now)
  quiet_run "$dir.log" "$tr" --config "$job" "${opt[@]}" "${common[@]}" --set strategy.plugin="$strategy" "${extra[@]}" \
    --set launch.nproc_per_node=$world --set trainer.micro_batch_size=$micro --set trainer.run_dir="$dir"
  grep -q "micro $micro x accumulation $acc x world $world" "$dir.log" || { cat "$dir.log"; fail "$name: wrong batch layout"; }
  py "$here/compare_runs.py" "$work/ref" "$dir" --rtol 1e-5 --label "$name ($(elapsed "$t0") s)" || status=1
done
exit $status
