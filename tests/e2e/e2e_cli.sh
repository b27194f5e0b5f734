#!/usr/bin/env bash
# The CLI's commands and its exit codes on bad input.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 jobs=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
run "$work/check" "$tr" check --config "$jobs/mlp-small.toml"
grep -qE "^# .*mlp-small.toml: valid$" "$work/check" && grep -q "^\[optimizer\]" "$work/check" || fail "check did not print the job"
run "$work/plugins" "$tr" plugins
for c in mlp cnn gpt torchscript idx text single cpu fp32 sgd adamw metrics progress tensorboard; do
  grep -qE "^$c +" "$work/plugins" || fail "trainrun plugins does not list $c"
done
run "$work/adamw" "$tr" plugins adamw
grep -qE "^ +weight_decay +float +0.01" "$work/adamw" || fail "plugins adamw lacks weight_decay"
expect_error() {  # expect_error <regex> args...
  local re=$1; shift
  local rc=0
  "$tr" "$@" >"$work/err" 2>&1 || rc=$?
  cat "$work/err"
  [ "$rc" -eq 2 ] || fail "expected exit code 2, got $rc from: $*"
  grep -qE "$re" "$work/err" || fail "message does not match /$re/"
}
printf '[trainer]\nmax_steps = 3\nglobal_batch_sise = 8\n[model]\nplugin = "mlp"\n[data]\nplugin = "idx"\n' >"$work/typo.toml"
expect_error "typo.toml:3:1: unknown key 'global_batch_sise' in \[trainer\]; did you mean 'global_batch_size'" \
  --config "$work/typo.toml"
expect_error "typo.toml:3:1: unknown key" check --config "$work/typo.toml"
expect_error "does not exist" --config "$work/nope.toml"
expect_error "unknown command 'trian'" trian
expect_error "no plugin component named 'adamv'; did you mean 'adamw'" plugins adamv
expect_error "global_batch_size 64 is not divisible by micro_batch_size 48" \
  --config "$jobs/mlp-small.toml" --set trainer.micro_batch_size=48 --set trainer.run_dir="$work/r"
expect_error "global_batch_size 64 is not divisible by micro_batch_size 48" \
  check --config "$jobs/mlp-small.toml" --set trainer.micro_batch_size=48
# A second run into the same run_dir moves the first run's files to previous-1/: the new
# metrics.jsonl holds only the new run, and nothing of the old one is lost.
for i in 1 2; do
  run "$work/again$i.log" "$tr" --config "$jobs/mlp-small.toml" --set trainer.max_steps=$((3 * i)) \
    --set trainer.run_dir="$work/again"
done
grep -q "held an earlier run" "$work/again2.log" || fail "no notice about the earlier run"
[ "$(grep -c '"loss"' "$work/again/metrics.jsonl")" -eq 6 ] || fail "metrics.jsonl mixes two runs"
[ "$(grep -c '"loss"' "$work/again/previous-1/metrics.jsonl")" -eq 3 ] || fail "earlier metrics lost"
grep -q "max_steps = 3" "$work/again/previous-1/job.toml" || fail "earlier job.toml lost"
[ -f "$work/again/previous-1/runtime/rank-0.json" ] || fail "the earlier run's runtime/ was not kept"
[ "$(ls "$work/again/previous-1/tb" | grep -c '^events\.out\.tfevents\.')" -eq 1 ] ||
  fail "the earlier run's tb/ was not kept"
[ "$(ls "$work/again/tb" | wc -l)" -eq 1 ] || fail "tb/ mixes two runs"
# Ctrl-C (SIGINT) and SIGTERM stop after the current step with exit code 130, leaving the
# metrics already logged.
for sig in INT TERM; do
  "$tr" --config "$jobs/mlp-small.toml" --set trainer.max_steps=1000000 --set trainer.run_dir="$work/sig$sig" \
    >"$work/sig.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ -s "$work/sig$sig/metrics.jsonl" ] && break; sleep 0.1; done
  kill -"$sig" "$pid"
  rc=0
  wait "$pid" || rc=$?
  cat "$work/sig.log"
  [ "$rc" -eq 130 ] || fail "SIG$sig: expected exit code 130, got $rc"
  grep -q "^interrupted by signal" "$work/sig.log" || fail "SIG$sig: no interruption message"
  [ -s "$work/sig$sig/metrics.jsonl" ] || fail "SIG$sig: metrics.jsonl lost"
done
# Issue 28, small fixes: a directory given as the job file is named as such; a run_dir or a
# checkpoint directory that cannot be created is bad input (exit 2) found before step 1; the
# schedule's help says where min_lr is reached.
mkdir -p "$work/a-dir"
expect_error "a-dir: is a directory, not a job file" --config "$work/a-dir"
touch "$work/a-file"
expect_error "run_dir = \".*a-file/run\": cannot create it" --config "$jobs/mlp-small.toml" --set trainer.run_dir="$work/a-file/run"
expect_error "checkpoint directory .*a-file/ckpt is not writable" --config "$jobs/mlp-small.toml" \
  --set trainer.run_dir="$work/ro" --set 'callbacks=[{plugin="checkpoint", dir="'"$work"'/a-file/ckpt"}]'
grep -q "^\[step 1/" "$work/err" && fail "the run trained before finding its checkpoint directory unwritable"
run "$work/sgd" "$tr" plugins sgd
grep -q "to min_lr at the last step" "$work/sgd" && fail "the schedule help still says min_lr is reached at the last step"
grep -q "reached at step max_steps, just after the last step" "$work/sgd" || fail "the schedule help does not say where min_lr is reached"
echo "OK"
