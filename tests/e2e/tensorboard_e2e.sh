#!/usr/bin/env bash
# The tensorboard callback end to end (tests/e2e/tensorboard_check.py reads the files back):
#   default  a job that lists no callback: tb/ is written anyway, and equals metrics.jsonl value
#            by value, with the evaluations and the job as a text summary.
#   ranks    2 ranks (ddp over gloo-cpu) with metrics and tensorboard on all ranks: one event file
#            per rank, global figures from rank 0, each rank's own under rank_N/.
#   killed   SIGKILL after 200 logged steps: every record before the kill is intact and
#            TensorBoard's reader has every step of metrics.jsonl (but possibly the last, which
#            metrics writes first).
#   off      [[callbacks]] plugin = "tensorboard", enabled = false: no tb/ at all.
#   usage: tensorboard_e2e.sh TRAINRUN TESTS_DIR WORK PYTHON
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 tests=$2 work=$3 python=$4
rm -rf "$work" && mkdir -p "$work"
job=$tests/jobs/mlp-small.toml

run "$work/default.log" "$tr" --config "$job" --set trainer.run_dir="$work/default" \
  --set trainer.eval_every=5
"$python" "$tests/tensorboard_check.py" "$work/default" || fail "default run"

cp "$job" "$work/ranks.toml"
printf '\n[[callbacks]]\nplugin = "metrics"\nall_ranks = true\n\n[[callbacks]]\nplugin = "tensorboard"\nall_ranks = true\n' >>"$work/ranks.toml"
run "$work/ranks.log" "$tr" --config "$work/ranks.toml" --set trainer.run_dir="$work/ranks" \
  --set trainer.eval_every=10 --set strategy.plugin=ddp --set accelerator.plugin=gloo-cpu \
  --set accelerator.timeout_s=60 --set launch.nproc_per_node=2 --set trainer.micro_batch_size=32
"$python" "$tests/tensorboard_check.py" "$work/ranks" --world 2 || fail "2-rank run"

"$tr" --config "$job" --set trainer.run_dir="$work/killed" --set trainer.max_steps=1000000 \
  >"$work/killed.log" 2>&1 &
pid=$!
trap 'kill -9 "$pid" 2>/dev/null || true' EXIT
lines=0
for _ in $(seq 1 1200); do
  [ -f "$work/killed/metrics.jsonl" ] && lines=$(wc -l <"$work/killed/metrics.jsonl")
  [ "$lines" -ge 200 ] && break
  sleep 0.1
done
kill -9 "$pid"
wait "$pid" || true
trap - EXIT
[ "$lines" -ge 200 ] || { cat "$work/killed.log"; fail "the run logged $lines steps in 120 s"; }
"$python" "$tests/tensorboard_check.py" "$work/killed" --killed || fail "killed run"

cp "$job" "$work/off.toml"
printf '\n[[callbacks]]\nplugin = "tensorboard"\nenabled = false\n' >>"$work/off.toml"
run "$work/off.log" "$tr" --config "$work/off.toml" --set trainer.run_dir="$work/off"
[ -s "$work/off/metrics.jsonl" ] || fail "the run with tensorboard off wrote no metrics.jsonl"
[ ! -e "$work/off/tb" ] || fail "tensorboard turned off, yet $work/off/tb exists: $(ls -R "$work/off/tb")"
echo "tensorboard off: no tb/"
echo PASS
