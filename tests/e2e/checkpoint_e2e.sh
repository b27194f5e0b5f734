#!/usr/bin/env bash
# Checkpoints end to end, launched by trainrun itself (gloo-cpu over loopback where world > 1):
#   exact_single, exact_ddp, exact_ring, exact_zero3, exact_fsdp
#               20 steps straight vs 10 steps (stop_after_steps, checkpoint) + a new process
#               resuming (resume = "latest") for the other 10: final weights BITWISE equal
#               (tolerance 0) and the losses of steps 11-20 equal exactly. single, ddp and ring run the
#               MLP with dropout 0.1 (the per-rank RNG streams must be restored too; without
#               that, measured: 6 of 6 tensors differ), zero stage 3
#               and fsdp FULL_SHARD the equivalence gpt; all with AdamW and a cosine schedule.
#               exact_ddp_fp16: fp16-mixed under ddp (the loss scaler's state travels; the run
#               skips a step after the resume point); exact_bf16_true: bf16 weights with fp32
#               masters in the optimizer state.
#   reshard     a chain ddp@2 -> fsdp@4 -> single@1 -> zero-2@4 -> fsdp HYBRID_SHARD@4 ->
#               zero-3@2 -> zero-1@4 -> ddp@4, each loading the previous one's checkpoint:
#               evaluation loss equal to the trained writer's within 1e-6 (relative), and each
#               run's full state dict (model.safetensors) bitwise equal to the writer's.
#   reshard_train  optimizer state reshards: ddp@2's step-10 checkpoint resumed by fsdp@4 and by
#               single@1 for steps 11-20 matches the uninterrupted ddp@2 run within 1e-5.
#   corrupt     keep_last prunes; a flipped byte, a truncated file, a meta.json cut short and one
#               naming a file outside the checkpoint ("../") are
#               reported with the file named, in one short line with the latest-valid hint (exit
#               2, bad input, no training); resume = "latest-valid" falls back to the previous
#               checkpoint, says so, and finishes.
#   crash       the writer is SIGKILLed at five points inside a save (test hook); each time
#               `latest` names a checkpoint that verifies and the run resumes from it; and
#               rank 1 of a ddp pair killed after writing its file: the same.
#   sigterm     SIGTERM during training: the step finishes, a checkpoint (reason "signal") is
#               written, exit code 130; resuming from it finishes the run.
#   sigterm_slow_save  the same with a save that takes 7 s (test hook TRAINRUN_TEST_SAVE_DELAY_S)
#               under the default stop_grace_s = 5: the launcher waits for the saving ranks
#               (they say so on the stop protocol's fd 3) and says so, the checkpoint is complete,
#               exit 130; the time from SIGTERM to the launcher's exit is printed.
#   resume_checks  what a resume would change silently: resumed at step 6 with
#               stop_after_steps = 6 it runs no step; another seed and an init_weights that the
#               resume overrides are warnings saying what happens; another optimizer (its state
#               would be dropped) and a checkpoint of another model are errors (exit 2), as is a
#               `latest` naming a path outside the checkpoint directory.
#   restart     [launch] max_restarts = 1, one rank SIGKILLed at step 15, checkpoints every 10:
#               the job completes with final weights bitwise equal to the uninterrupted run.
#   minutes     every_n_minutes shorter than a step: a checkpoint after every step.
#   consolidate a zero-3 world-2 checkpoint consolidated (one file, and split with
#               --max-shard-size into an HF index) equals the run's full state dict bitwise,
#               read by a json+struct reader.
#   unsupported a strategy without the capability: NotSupportedError naming it, before step 1.
#   usage: checkpoint_e2e.sh TRAINRUN TESTS_DIR WORK CASE [TEST_PLUGIN_DIR]
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 tests=$2 work=$3 case=$4
check() { py "$tests/checkpoint_check.py" "$@"; }
rm -rf "$work" && mkdir -p "$work"
mlp=(--config "$tests/equivalence/mlp.toml" --set model.dropout=0.1)
gpt=(--config "$tests/equivalence/gpt.toml")
opt=(--set optimizer.plugin=adamw --set optimizer.lr=0.003 --set optimizer.schedule=cosine
     --set optimizer.warmup_steps=3 --set accelerator.timeout_s=60 --set trainer.eval_max_batches=0
     --set trainer.log_every=5)
ckpt=(--set 'callbacks=[{plugin="checkpoint", every_n_steps=10}]')

# exact <job-array-name> <strategy sets...>: straight vs stop + resume, bitwise.
exact() {
  local -n job=$1; shift
  run "$work/straight.log" "$tr" "${job[@]}" "${opt[@]}" "$@" --set trainer.run_dir="$work/straight"
  run "$work/first.log" "$tr" "${job[@]}" "${opt[@]}" "${ckpt[@]}" "$@" \
    --set trainer.stop_after_steps=10 --set trainer.run_dir="$work/resumed"
  expect_in "$work/first.log" "stopped after 10 of 20 steps"
  [ -f "$work/resumed/checkpoints/step-0000010/meta.json" ] || fail "no checkpoint at step 10"
  local t0; t0=$(now)
  run "$work/second.log" "$tr" "${job[@]}" "${opt[@]}" "${ckpt[@]}" "$@" \
    --set trainer.resume=latest --set trainer.run_dir="$work/resumed"
  expect_in "$work/second.log" "resumed from .*step-0000010 at step 10"
  check same-weights "$work/straight/model.safetensors" "$work/resumed/model.safetensors"
  check same-losses "$work/straight" "$work/resumed" 11 ${skips:+--skips}
}

case $case in
  exact_single) exact mlp --set strategy.plugin=single --set accelerator.plugin=cpu ;;
  exact_ddp) exact mlp --set strategy.plugin=ddp --set launch.nproc_per_node=2 ;;
  exact_ddp_fp16) skips=1 exact mlp --set strategy.plugin=ddp --set launch.nproc_per_node=2 --set precision.plugin=fp16-mixed ;;
  exact_bf16_true) exact mlp --set strategy.plugin=single --set accelerator.plugin=cpu --set precision.plugin=bf16-true ;;
  exact_ring) exact mlp --set strategy.plugin=ring --set launch.nproc_per_node=2 ;;
  exact_zero3) exact gpt --set strategy.plugin=zero --set strategy.stage=3 --set launch.nproc_per_node=2 ;;
  exact_fsdp) exact gpt --set strategy.plugin=fsdp --set launch.nproc_per_node=2 ;;
  reshard)
    # A chain: each run loads the previous run's (end) checkpoint, trains nothing (max_steps =
    # the checkpoint's step), evaluates and writes its own checkpoint in its own layout. Every
    # evaluation loss must equal the first writer's within 1e-6 (relative).
    g=("${gpt[@]}" "${opt[@]}" --set trainer.max_steps=10 --set 'callbacks=[{plugin="checkpoint"}]')
    chain=("ddp2:--set strategy.plugin=ddp --set launch.nproc_per_node=2"
           "fsdp4:--set strategy.plugin=fsdp --set launch.nproc_per_node=4"
           "single1:--set strategy.plugin=single --set accelerator.plugin=cpu"
           "zero2-4:--set strategy.plugin=zero --set strategy.stage=2 --set launch.nproc_per_node=4"
           "fsdp-hybrid4:--set strategy.plugin=fsdp --set strategy.sharding_strategy=HYBRID_SHARD --set strategy.shard_group_size=2 --set launch.nproc_per_node=4"
           "zero3-2:--set strategy.plugin=zero --set strategy.stage=3 --set launch.nproc_per_node=2"
           "zero1-4:--set strategy.plugin=zero --set strategy.stage=1 --set launch.nproc_per_node=4"
           "ddp4:--set strategy.plugin=ddp --set launch.nproc_per_node=4")
    prev="" first=""
    for link in "${chain[@]}"; do
      name=${link%%:*} sets=${link#*:}
      # shellcheck disable=SC2086
      run "$work/$name.log" "$tr" "${g[@]}" $sets ${prev:+--set trainer.resume="$prev"} \
        --set trainer.run_dir="$work/$name"
      if [ -n "$prev" ]; then
        expect_in "$work/$name.log" "resumed from .*step-0000010 at step 10"
        a=$(check eval-loss "$work/$first") b=$(check eval-loss "$work/$name")
        echo "measured: evaluation loss $first (trained) $a, $prev_name -> $name $b"
        py -c "import sys; a, b = map(float, sys.argv[1:]); print('relative difference', abs(a - b) / abs(a)); sys.exit(0 if abs(a - b) <= 1e-6 * abs(a) else 1)" "$a" "$b" \
          || fail "$prev_name -> $name: evaluation losses differ: $a vs $b"
        # Resharding moves bytes, it computes nothing: the full state dict is the writer's, bit
        # for bit.
        check same-weights "$work/$first/model.safetensors" "$work/$name/model.safetensors"
      else
        first=$name
      fi
      prev="$work/$name/checkpoints/step-0000010" prev_name=$name
    done
    ;;
  reshard_train)
    # The optimizer state reshards too: ddp@2 stops at step 10; fsdp@4 and single@1 each resume
    # from that checkpoint and train steps 11-20, matching the uninterrupted ddp@2 run within
    # 1e-5 (docs/design.md, invariant 1: losses, gradient norms and final weights; compare_runs.py).
    g=("${gpt[@]}" "${opt[@]}")
    run "$work/straight.log" "$tr" "${g[@]}" --set strategy.plugin=ddp --set launch.nproc_per_node=2 \
      --set trainer.run_dir="$work/straight"
    run "$work/first.log" "$tr" "${g[@]}" "${ckpt[@]}" --set strategy.plugin=ddp --set launch.nproc_per_node=2 \
      --set trainer.stop_after_steps=10 --set trainer.run_dir="$work/first"
    mkdir -p "$work/ref"  # the reference's steps 11-20 and its final weights
    py -c "import json,sys; [print(l, end='') for l in open(sys.argv[1]) if 'eval_loss' in l or json.loads(l).get('step', 0) > 10]" \
      "$work/straight/metrics.jsonl" > "$work/ref/metrics.jsonl"
    cp "$work/straight/model.safetensors" "$work/ref/"
    for to in "fsdp4:--set strategy.plugin=fsdp --set launch.nproc_per_node=4" \
              "single1:--set strategy.plugin=single --set accelerator.plugin=cpu"; do
      name=${to%%:*} sets=${to#*:}
      # shellcheck disable=SC2086
      run "$work/$name.log" "$tr" "${g[@]}" $sets --set trainer.resume="$work/first/checkpoints/step-0000010" \
        --set trainer.run_dir="$work/$name"
      expect_in "$work/$name.log" "resumed from .*step-0000010 at step 10 \\(written by ddp at world size 2\\)"
      py "$tests/compare_runs.py" "$work/ref" "$work/$name" --rtol 1e-5 --label "ddp@2 -> $name, steps 11-20"
    done
    ;;
  corrupt)
    s=("${mlp[@]}" "${opt[@]}" --set strategy.plugin=single --set accelerator.plugin=cpu
       --set 'callbacks=[{plugin="checkpoint", every_n_steps=5, keep_last=2}]')
    run "$work/a.log" "$tr" "${s[@]}" --set trainer.run_dir="$work/a"
    dirs=$(cd "$work/a/checkpoints" && ls -d step-* | tr '\n' ' ')
    [ "$dirs" = "step-0000015 step-0000020 " ] || fail "keep_last = 2 left: $dirs"
    echo "keep_last = 2 kept: $dirs"
    f="$work/a/checkpoints/step-0000020/model-00000-of-00001.safetensors"
    cp "$f" "$work/good.safetensors"
    py -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[-3] ^= 0x10; open(p, 'wb').write(b)" "$f"
    rc=0; "$tr" "${s[@]}" --set trainer.max_steps=25 --set trainer.resume=latest \
      --set trainer.run_dir="$work/a" >"$work/bad.log" 2>&1 || rc=$?
    cat "$work/bad.log"
    expect_rc 2 "$rc"  # a damaged checkpoint is bad input
    expect_in "$work/bad.log" "model-00000-of-00001.safetensors: sha256 .* differs"
    expect_in "$work/bad.log" "resume = \"latest-valid\" falls back to the newest checkpoint that verifies"
    head -c 1000 "$work/good.safetensors" > "$f"
    rc=0; "$tr" "${s[@]}" --set trainer.max_steps=25 --set trainer.resume=latest \
      --set trainer.run_dir="$work/a" >"$work/trunc.log" 2>&1 || rc=$?
    cat "$work/trunc.log"
    expect_rc 2 "$rc"
    expect_in "$work/trunc.log" "model-00000-of-00001.safetensors has 1000 bytes.*truncated"
    cp "$work/good.safetensors" "$f"
    # meta.json cut in half (inside the base64 RNG state): one readable line, the file named,
    # at most 40 bytes of what the parser read last.
    m="$work/a/checkpoints/step-0000020/meta.json"
    cp "$m" "$work/good-meta.json"
    head -c "$(( $(stat -c %s "$m") / 2 ))" "$work/good-meta.json" > "$m"
    rc=0; "$tr" "${s[@]}" --set trainer.max_steps=25 --set trainer.resume=latest \
      --set trainer.run_dir="$work/a" >"$work/meta.log" 2>&1 || rc=$?
    cat "$work/meta.log"
    expect_rc 2 "$rc"
    expect_in "$work/meta.log" "step-0000020/meta.json: corrupt: .*last read: '"
    err=$(grep "error:" "$work/meta.log")
    [ "${#err}" -lt 600 ] || fail "the error line is ${#err} characters long"
    echo "measured: the damaged-meta.json error is ${#err} characters"
    # meta.json naming a file outside the checkpoint's directory, where an intact copy lies (so
    # sizes and sums agree and only the name is wrong): refused before anything is read.
    cp "$f" "$work/a/checkpoints/model-00000-of-00001.safetensors"
    py - "$work/good-meta.json" "$m" <<'PY'
import json, sys
meta = json.load(open(sys.argv[1]))
meta["files"] = {("../" + k if k.startswith("model-") else k): v for k, v in meta["files"].items()}
json.dump(meta, open(sys.argv[2], "w"))
PY
    rc=0; "$tr" "${s[@]}" --set trainer.max_steps=25 --set trainer.resume=latest \
      --set trainer.run_dir="$work/a" >"$work/path.log" 2>&1 || rc=$?
    cat "$work/path.log"
    expect_rc 2 "$rc"
    expect_in "$work/path.log" "step-0000020/meta.json: damaged: names the file '../model-00000-of-00001.safetensors', which is not a plain file name"
    expect_in "$work/path.log" "resume = \"latest-valid\" falls back"
    rm "$work/a/checkpoints/model-00000-of-00001.safetensors"
    run "$work/valid.log" "$tr" "${s[@]}" --set trainer.max_steps=25 --set trainer.resume=latest-valid \
      --set trainer.run_dir="$work/a"
    expect_in "$work/valid.log" "skipping .*step-0000020"
    expect_in "$work/valid.log" "resumed from .*step-0000015 at step 15"
    ;;
  crash)
    s=("${mlp[@]}" "${opt[@]}" --set strategy.plugin=single --set accelerator.plugin=cpu
       --set trainer.max_steps=10 --set 'callbacks=[{plugin="checkpoint", every_n_steps=5, keep_last=1}]')
    for point in rank-files before-meta before-rename before-latest before-prune; do
      d="$work/$point"
      rc=0; TRAINRUN_CHECKPOINT_CRASH_AT="$point@10" "$tr" "${s[@]}" --set trainer.run_dir="$d" \
        >"$d.log" 2>&1 || rc=$?
      cat "$d.log"
      [ "$rc" -ne 0 ] || fail "$point: the run was not killed"
      expect_in "$d.log" "checkpoint test hook: SIGKILL at $point"
      latest=$(cat "$d/checkpoints/latest")
      run "$d-resume.log" "$tr" "${s[@]}" --set trainer.resume=latest --set trainer.run_dir="$d"
      expect_in "$d-resume.log" "resumed from .*$latest at step"
      echo "measured: killed at $point -> latest = $latest verifies and resumes"
    done
    # Two ranks: rank 1 dies after writing its model file; the launcher stops rank 0 (waiting
    # in the save's barrier) and the previous checkpoint still loads.
    s2=("${mlp[@]}" "${opt[@]}" --set strategy.plugin=ddp --set launch.nproc_per_node=2
        --set trainer.max_steps=10 --set 'callbacks=[{plugin="checkpoint", every_n_steps=5}]')
    rc=0; TRAINRUN_CHECKPOINT_CRASH_AT="rank-files@10" TRAINRUN_CHECKPOINT_CRASH_RANK=1 \
      timeout 120 "$tr" "${s2[@]}" --set trainer.run_dir="$work/ddp" >"$work/ddp.log" 2>&1 || rc=$?
    cat "$work/ddp.log"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "ddp: exit code $rc (expected a failure, not a hang)"
    expect_in "$work/ddp.log" "SIGKILL at rank-files \\(step 10, rank 1\\)"
    [ "$(cat "$work/ddp/checkpoints/latest")" = step-0000005 ] || fail "ddp: latest moved"
    run "$work/ddp-resume.log" "$tr" "${s2[@]}" --set trainer.resume=latest --set trainer.run_dir="$work/ddp"
    expect_in "$work/ddp-resume.log" "resumed from .*step-0000005 at step 5"
    echo "measured: ddp world 2, rank 1 killed inside the save -> step-0000005 verifies and resumes"
    ;;
  sigterm)
    s=("${mlp[@]}" "${opt[@]}" --set strategy.plugin=ddp --set launch.nproc_per_node=2
       --set trainer.max_steps=100000 --set trainer.log_every=1
       --set 'callbacks=[{plugin="checkpoint", every_n_steps=0, save_last=false}]')
    "$tr" "${s[@]}" --set trainer.run_dir="$work/t" >"$work/t.log" 2>&1 &
    pid=$!
    wait_for "$work/t.log" "\[step 5/" 60
    kill -TERM "$pid"
    rc=0; wait "$pid" || rc=$?
    cat "$work/t.log"
    expect_rc 130 "$rc"
    step=$(py -c "import json,sys; m=json.load(open(sys.argv[1]+'/meta.json')); assert m['reason']=='signal', m['reason']; print(m['step'])" "$work/t/checkpoints/$(cat "$work/t/checkpoints/latest")")
    echo "measured: SIGTERM -> checkpoint at step $step, exit code 130"
    run "$work/r.log" "$tr" "${s[@]}" --set trainer.max_steps=$((step + 3)) --set trainer.resume=latest \
      --set trainer.run_dir="$work/t"
    expect_in "$work/r.log" "resumed from .* at step $step"
    ;;
  sigterm_slow_save)
    s=("${mlp[@]}" "${opt[@]}" --set strategy.plugin=ddp --set launch.nproc_per_node=2
       --set trainer.max_steps=100000 --set trainer.log_every=1
       --set 'callbacks=[{plugin="checkpoint", every_n_steps=0, save_last=false}]')
    TRAINRUN_TEST_SAVE_DELAY_S=7 "$tr" "${s[@]}" --set trainer.run_dir="$work/t" >"$work/t.log" 2>&1 &
    pid=$!
    trap 'kill -9 $pid 2>/dev/null || true' EXIT
    wait_for "$work/t.log" "\[step 3/" 60
    t0=$(now)
    kill -TERM "$pid"
    rc=0; wait "$pid" || rc=$?
    t=$(elapsed "$t0")
    cat "$work/t.log"
    expect_rc 130 "$rc"
    expect_in "$work/t.log" "^trainrun: rank 0 is writing its checkpoint \(step [0-9]+\); waiting for it"
    expect_in "$work/t.log" "^trainrun: rank 0 finished its checkpoint \(step [0-9]+\) in [0-9.]+ s"
    grep -q "killing it (SIGKILL)" "$work/t.log" && fail "a saving rank was killed"
    [ -f "$work/t/checkpoints/latest" ] || fail "no complete checkpoint after SIGTERM"
    step=$(py -c "import json,sys; m=json.load(open(sys.argv[1]+'/meta.json')); assert m['reason']=='signal', m['reason']; print(m['step'])" "$work/t/checkpoints/$(cat "$work/t/checkpoints/latest")")
    echo "measured: SIGTERM -> complete checkpoint (step $step, save delayed 7 s, stop_grace_s 5) and exit 130 in $t s"
    ;;
  resume_checks)
    s=("${mlp[@]}" "${opt[@]}" --set strategy.plugin=single --set accelerator.plugin=cpu --set trainer.log_every=1
       --set 'callbacks=[{plugin="checkpoint", every_n_steps=3}]' --set trainer.run_dir="$work/r")
    run "$work/first.log" "$tr" "${s[@]}" --set trainer.stop_after_steps=6
    run "$work/again.log" "$tr" "${s[@]}" --set trainer.stop_after_steps=6 --set trainer.resume=latest
    expect_in "$work/again.log" "resumed from .*step-0000006 at step 6"
    expect_in "$work/again.log" "stopped after 6 of 20 steps"
    grep -q "^\[step 7/" "$work/again.log" && fail "a run resumed at stop_after_steps ran another step"
    run "$work/seed.log" "$tr" "${s[@]}" --set trainer.resume=latest --set trainer.seed=12 --set trainer.stop_after_steps=7
    expect_in "$work/seed.log" "warning: resume: checkpoint .* was written with \[trainer\] seed = 11, this run uses 12: the data order"
    run "$work/w.log" "$tr" "${mlp[@]}" "${opt[@]}" --set strategy.plugin=single --set accelerator.plugin=cpu \
      --set trainer.max_steps=1 --set trainer.run_dir="$work/w"
    run "$work/init.log" "$tr" "${s[@]}" --set trainer.resume=latest --set trainer.stop_after_steps=7 \
      --set trainer.init_weights="$work/w/model.safetensors"
    expect_in "$work/init.log" "warning: resume: \[trainer\] init_weights = .* is ignored: the weights come from checkpoint"
    rc=0; "$tr" "${s[@]}" --set trainer.resume=latest --set optimizer.plugin=sgd >"$work/sgd.log" 2>&1 || rc=$?
    cat "$work/sgd.log"; expect_rc 2 "$rc"
    expect_in "$work/sgd.log" "was written with \[optimizer\] plugin = \"adamw\", this run uses \"sgd\": its optimizer state"
    rc=0; "$tr" "${s[@]}" --set trainer.resume=latest --set 'model.hidden=[48, 32]' >"$work/model.log" 2>&1 || rc=$?
    cat "$work/model.log"; expect_rc 2 "$rc"
    expect_in "$work/model.log" "it is not a checkpoint of this job's model"
    # A `latest` that points outside the checkpoint directory is refused (exit 2).
    echo "../../../../etc" >"$work/r/checkpoints/latest"
    rc=0; "$tr" "${s[@]}" --set trainer.resume=latest >"$work/trav.log" 2>&1 || rc=$?
    cat "$work/trav.log"; expect_rc 2 "$rc"
    expect_in "$work/trav.log" "names \"../../../../etc\", which is not a checkpoint inside"
    # ... and quoted as untrusted text: 40 characters, non-printables as '?', cut marked "...".
    printf '../\001%s\n' "$(printf 'a%.0s' {1..80})" >"$work/r/checkpoints/latest"
    rc=0; "$tr" "${s[@]}" --set trainer.resume=latest >"$work/long.log" 2>&1 || rc=$?
    cat "$work/long.log"; expect_rc 2 "$rc"
    expect_in "$work/long.log" "names \"\.\./\?a{36}\.\.\.\", which is not a checkpoint inside"
    ;;
  consolidate)
    run "$work/z.log" "$tr" "${gpt[@]}" "${opt[@]}" --set trainer.max_steps=4 \
      --set 'callbacks=[{plugin="checkpoint"}]' --set strategy.plugin=zero --set strategy.stage=3 \
      --set launch.nproc_per_node=2 --set trainer.run_dir="$work/z"
    run "$work/c1.log" "$tr" consolidate "$work/z/checkpoints/step-0000004" "$work/one"
    check consolidated "$work/one" "$work/z/model.safetensors"
    run "$work/c2.log" "$tr" consolidate "$work/z/checkpoints/step-0000004" "$work/split" --max-shard-size 40KB
    [ -f "$work/split/model.safetensors.index.json" ] || fail "no index for a split model"
    check consolidated "$work/split" "$work/z/model.safetensors"
    # The checkpoints directory stands for its newest complete checkpoint (its `latest`).
    run "$work/c3.log" "$tr" consolidate "$work/z/checkpoints" "$work/latest"
    expect_in "$work/c3.log" "from .*step-0000004"
    check consolidated "$work/latest" "$work/z/model.safetensors"
    rc=0; "$tr" consolidate "$work/nowhere" "$work/x" >"$work/c4.log" 2>&1 || rc=$?
    cat "$work/c4.log"
    expect_rc 2 "$rc"
    expect_in "$work/c4.log" "nowhere: no such checkpoint directory"
    ;;
  restart)
    # [launch] max_restarts = 1: rank 1 is SIGKILLed as step 15 starts (test hook), the
    # launcher restarts both workers, they resume from step 10 and finish: final weights
    # bitwise equal to the uninterrupted run.
    j=("${mlp[@]}" "${opt[@]}" --set strategy.plugin=ddp --set launch.nproc_per_node=2)
    run "$work/straight.log" "$tr" "${j[@]}" --set trainer.run_dir="$work/straight"
    t0=$(now)
    run "$work/elastic.log" env TRAINRUN_TEST_SIGKILL_AT_STEP=15 TRAINRUN_TEST_SIGKILL_RANK=1 \
      "$tr" "${j[@]}" "${ckpt[@]}" --set launch.max_restarts=1 --set trainer.run_dir="$work/elastic"
    echo "measured: killed, restarted and finished in $(elapsed "$t0") s"
    expect_in "$work/elastic.log" "rank 1 SIGKILLs itself at step 15"
    expect_in "$work/elastic.log" "restart 1 of 1: a worker failed"
    expect_in "$work/elastic.log" "resumed from .*step-0000010 at step 10"
    check same-weights "$work/straight/model.safetensors" "$work/elastic/model.safetensors"
    # metrics.jsonl holds each step once, as the uninterrupted run's does; the failed attempt's
    # rows after the checkpoint (steps 11..14) are kept aside in metrics.jsonl.superseded.
    steps() { grep -o '"step":[0-9]*' "$1" | tr '\n' ' '; }
    [ "$(steps "$work/elastic/metrics.jsonl")" = "$(steps "$work/straight/metrics.jsonl")" ] ||
      fail "metrics.jsonl steps after the restart: $(steps "$work/elastic/metrics.jsonl")"
    # (Step 14's row may or may not have been written when the restart stopped rank 0.)
    case "$(steps "$work/elastic/metrics.jsonl.superseded")" in
      '"step":11 "step":12 "step":13 ' | '"step":11 "step":12 "step":13 "step":14 ') ;;
      *) fail "superseded rows: $(steps "$work/elastic/metrics.jsonl.superseded")" ;;
    esac
    ;;
  minutes)
    # every_n_minutes = 1e-6 (60 us, less than any step takes): a checkpoint after every step.
    run "$work/m.log" "$tr" "${mlp[@]}" "${opt[@]}" --set strategy.plugin=single --set accelerator.plugin=cpu \
      --set trainer.max_steps=4 --set 'callbacks=[{plugin="checkpoint", every_n_minutes=1e-6}]' \
      --set trainer.run_dir="$work/m"
    dirs=$(cd "$work/m/checkpoints" && ls -d step-* | tr '\n' ' ')
    [ "$dirs" = "step-0000001 step-0000002 step-0000003 step-0000004 " ] || fail "every_n_minutes wrote: $dirs"
    echo "every_n_minutes = 1e-6 wrote: $dirs"
    ;;
  unsupported)
    # A strategy without the CheckpointableStrategy capability: asked for checkpoints, the job
    # fails before its first step, naming the strategy (plugin from tests/test_plugins).
    rc=0; timeout 120 "$tr" "${mlp[@]}" "${opt[@]}" --plugin-path "$5" --set strategy.plugin=plain-single \
      --set accelerator.plugin=cpu --set 'callbacks=[{plugin="checkpoint", every_n_steps=5}]' \
      --set trainer.run_dir="$work/u" >"$work/u.log" 2>&1 || rc=$?
    cat "$work/u.log"
    expect_rc 1 "$rc"
    expect_in "$work/u.log" "strategy 'plain-single' .*does not support checkpoints"
    if grep -q "^\[step" "$work/u.log"; then fail "it trained before failing"; fi
    ;;
  *) fail "unknown case $case" ;;
esac
echo "PASS checkpoint_e2e.$case"
