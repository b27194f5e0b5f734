#!/usr/bin/env bash
# Distributed data through the trainer, with ddp on gloo-cpu:
#  (a) evaluation counts every held-out sample exactly once: 3 ranks (10000 % 3 != 0) report
#      the same sample count, loss and accuracy as one process on the same weights;
#  (b) training at world 3 keeps the global batch (accumulation re-derived) and matches the
#      single-process losses;
#  (c) a global batch that does not divide by world size x micro-batch is a clear error (exit 2)
#      before any worker starts.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 job=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
common=(--config "$job" --set trainer.max_steps=6 --set trainer.eval_max_batches=0
        --set trainer.eval_batch_size=500 --set trainer.global_batch_size=48)
run "$work/one.log" "$tr" "${common[@]}" --set strategy.plugin=single --set accelerator.plugin=cpu \
  --set trainer.micro_batch_size=48 --set trainer.run_dir="$work/one"
run "$work/three.log" "$tr" "${common[@]}" --set strategy.plugin=ddp --set accelerator.plugin=gloo-cpu \
  --set launch.nproc_per_node=3 --set trainer.micro_batch_size=8 --set trainer.run_dir="$work/three"
expect_in "$work/three.log" "micro 8 x accumulation 2 x world 3"
expect_in "$work/one.log" "on 10000 held-out samples"
expect_in "$work/three.log" "on 10000 held-out samples"
py - "$work" <<'PY'
import json, sys
w = sys.argv[1]
def rows(d):
    return [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")]
one, three = rows("one"), rows("three")
ev1 = [r for r in one if "eval_loss" in r][-1]
ev3 = [r for r in three if "eval_loss" in r][-1]
assert ev1["eval_samples"] == ev3["eval_samples"] == 10000, (ev1, ev3)
rel = abs(ev1["eval_loss"] - ev3["eval_loss"]) / ev1["eval_loss"]
assert rel < 1e-5, f"eval loss {ev3['eval_loss']} vs {ev1['eval_loss']} (rel {rel:.1e})"
assert abs(ev1["eval_accuracy"] - ev3["eval_accuracy"]) < 1e-9, (ev1, ev3)
s1 = [r["loss"] for r in one if "loss" in r and "eval_loss" not in r]
s3 = [r["loss"] for r in three if "loss" in r and "eval_loss" not in r]
worst = max(abs(a - b) / abs(a) for a, b in zip(s1, s3))
assert len(s1) == len(s3) == 6 and worst < 1e-5, (s1, s3)
print(f"OK: eval on 10000 samples at world 1 and 3, eval loss rel diff {rel:.1e}, "
      f"train loss worst rel diff {worst:.1e}")
PY
# (c) Not divisible: before any worker starts, naming the keys.
bash "$here/../tools/expect.sh" 2 "global_batch_size 50 is not divisible by world_size 4" "!started rank" -- \
  "$tr" --config "$job" --set strategy.plugin=ddp --set accelerator.plugin=gloo-cpu \
  --set launch.nproc_per_node=4 --set trainer.global_batch_size=50 --set trainer.micro_batch_size=0
bash "$here/../tools/expect.sh" 2 "global_batch_size 64 is not divisible by micro_batch_size 64 x world_size 2" -- \
  "$tr" --config "$job" --set strategy.plugin=ddp --set accelerator.plugin=gloo-cpu \
  --set launch.nproc_per_node=2 --set trainer.global_batch_size=64 --set trainer.micro_batch_size=64
echo "OK: batch layout errors"
