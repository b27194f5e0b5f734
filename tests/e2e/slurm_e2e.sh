#!/usr/bin/env bash
# trainrun under a real SLURM (Debian's slurm-wlm + munge), started for this test alone
# (tests/e2e/slurm_lib.sh). One case per CTest entry:
#   slurm_e2e.sh <trainrun> <equivalence jobs dir> <work dir> <repo dir> <case>
# srun: `srun -n 2 trainrun` with ranks from SLURM's variables, the store on the step's first
# node, srun's CPU binding kept (a map that crosses trainrun's own slicing), losses equal to one
# process. sbatch: examples/slurm/train.sbatch, the same check. scancel: a running job is
# cancelled; every rank ends within KillWait, with nothing left. requeue: `scontrol requeue` after
# a checkpoint; the second run resumes from it by itself and ends bitwise equal to an
# uninterrupted run. killed_task: one srun task SIGKILLed; the other ends within the collective
# timeout naming rank 1.
source "$(dirname "$0")/e2e_lib.sh"
source "$(dirname "$0")/slurm_lib.sh"
tr=$1 jobs=$2 work=$3 repo=$4 case=$5
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
[ "$(nproc)" -ge 2 ] || { echo "SKIP: needs 2 CPUs for 2 bound tasks"; exit 77; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
slurm_up "$work/slurm"
run_dir=$work/run-$case-$$
sgd=(--set optimizer.plugin=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9)
ddp=(--config "$jobs/mlp.toml" "${sgd[@]}" --set strategy.plugin=ddp --set trainer.micro_batch_size=16
     --set trainer.run_dir="$run_dir")
reference() {
  quiet_run "$work/ref.log" "$tr" --config "$jobs/mlp.toml" "${sgd[@]}" --set strategy.plugin=single \
    --set accelerator.plugin=cpu --set trainer.micro_batch_size=32 --set trainer.run_dir="$work/ref"
}
compare() { py "$here/compare_runs.py" "$work/ref" "$run_dir" --rtol 1e-5 --label "$1"; }
affinity() { py -c "import json,sys; print(json.load(open(sys.argv[1]))['affinity'])" "$run_dir/runtime/rank-$1.json"; }
# Whether SLURM still lists job $1 (pending, running or completing).
in_queue() { grep -q . <<<"$(squeue -h -j "$1" 2>/dev/null)"; }

case $case in
srun)
  reference
  t0=$(now)
  rc=0
  srun -n 2 --cpu-bind=map_cpu:1,0 "$tr" "${ddp[@]}" >"$work/out" 2>&1 || rc=$?
  cat "$work/out"
  [ "$rc" -eq 0 ] || fail "srun exited with $rc"
  grep -q "started rank" "$work/out" && fail "trainrun launched workers of its own under srun"
  # rank 0 on CPU 1, rank 1 on CPU 0: srun's map, not trainrun's slice (local rank r -> CPU r).
  [ "$(affinity 0)" = "[1]" ] || fail "rank 0 runs on CPUs $(affinity 0), srun bound it to [1]"
  [ "$(affinity 1)" = "[0]" ] || fail "rank 1 runs on CPUs $(affinity 1), srun bound it to [0]"
  echo "srun's CPU binding kept: rank 0 on $(affinity 0), rank 1 on $(affinity 1)"
  compare "srun -n 2, ddp ($(elapsed "$t0") s)"
  ;;
sbatch)
  reference
  t0=$(now)
  rc=0
  TRAINRUN=$tr sbatch --wait --output="$work/job.out" "$repo/examples/slurm/train.sbatch" "${ddp[@]:1}" \
    >"$work/sbatch.out" 2>&1 || rc=$?
  cat "$work/sbatch.out" "$work/job.out"
  [ "$rc" -eq 0 ] || fail "sbatch --wait exited with $rc"
  [ "$(affinity 0)" != "$(affinity 1)" ] || fail "both ranks on CPUs $(affinity 0)"
  compare "sbatch examples/slurm/train.sbatch, ddp ($(elapsed "$t0") s)"
  ;;
scancel)
  TRAINRUN=$tr sbatch --parsable --output="$work/job.out" "$repo/examples/slurm/train.sbatch" "${ddp[@]:1}" \
    --set trainer.max_steps=1000000 --set trainer.log_every=1 --set launch.stop_grace_s=3 \
    >"$work/jobid" 2>&1 || { cat "$work/jobid"; fail "sbatch failed"; }
  job=$(cut -d';' -f1 "$work/jobid")
  wait_for "$run_dir/metrics.jsonl" '"step": ?5\b' 90
  t0=$(now)
  scancel "$job"
  # Timed: until no process of the job's ranks is left. KillWait (5 s in slurm_lib.sh's config)
  # is SLURM's own bound: SIGKILL after it. The job's record leaving squeue is not timed: it
  # follows slurmd's completion message and the controller's bookkeeping (state CG), which took
  # up to 16 s under ctest -j2 while the ranks had long exited.
  for _ in $(seq 1 300); do pgrep -f -- "$run_dir" >/dev/null || break; sleep 0.1; done
  t=$(elapsed "$t0")
  for _ in $(seq 1 600); do in_queue "$job" || break; sleep 0.1; done
  cat "$work/job.out"
  in_queue "$job" && fail "job $job still queued or running 60 s after scancel"
  within 10 "$t" "scancel to the end of the job's last rank"
  expect_in "$work/job.out" "CANCELLED"
  no_leftovers "$run_dir"
  ;;
requeue)
  # #SBATCH --requeue in the shipped script: the job is requeued (scontrol requeue) after its
  # first checkpoint; SLURM stops it (SIGTERM: trainrun saves at the step it is in, then exits),
  # starts it again with SLURM_RESTART_COUNT=1, and the second run resumes from `latest`
  # without being told to. Its losses from there on and its final weights equal an uninterrupted
  # run's exactly (same 2 ranks, same strategy: tolerance 0). Each save waits 2 s (a test hook
  # that changes no number), so the requeue lands mid-run.
  ck=(--set 'callbacks=[{plugin="checkpoint", every_n_steps=10}]' --set trainer.max_steps=60
      --set trainer.log_every=1 --set launch.stop_grace_s=4)
  straight=(--config "$jobs/mlp.toml" "${sgd[@]}" --set strategy.plugin=ddp --set trainer.micro_batch_size=16)
  TRAINRUN=$tr sbatch --wait --output="$work/straight.out" "$repo/examples/slurm/train.sbatch" \
    "${straight[@]:1}" "${ck[@]}" --set trainer.run_dir="$work/straight" >"$work/sbatch0.out" 2>&1 ||
    { cat "$work/sbatch0.out" "$work/straight.out"; fail "the uninterrupted job failed"; }
  TRAINRUN=$tr TRAINRUN_TEST_SAVE_DELAY_S=2 sbatch --parsable --open-mode=append --output="$work/job.out" \
    "$repo/examples/slurm/train.sbatch" "${ddp[@]:1}" "${ck[@]}" >"$work/jobid" 2>&1 ||
    { cat "$work/jobid"; fail "sbatch failed"; }
  job=$(cut -d';' -f1 "$work/jobid")
  wait_for "$run_dir/checkpoints/latest" "step-" 90
  t0=$(now)
  scontrol requeue "$job" || { cat "$work/job.out"; fail "scontrol requeue $job failed"; }
  # SLURM holds a requeued batch job back for a while (its BeginTime moves about two minutes
  # on); once it is pending again, let it start at once.
  for _ in $(seq 1 300); do
    grep -q PENDING <<<"$(squeue -h -j "$job" -o %T 2>/dev/null)" && break
    sleep 0.1
  done
  scontrol update JobId="$job" StartTime=now || fail "could not let the requeued job $job start now"
  # The job leaves the queue only once its second run has ended.
  for _ in $(seq 1 1200); do in_queue "$job" || break; sleep 0.1; done
  cat "$work/job.out"
  in_queue "$job" && fail "job $job still queued or running 120 s after the requeue"
  echo "measured: requeue to the end of the second run in $(elapsed "$t0") s"
  state=$(scontrol show job "$job" 2>/dev/null | grep -oE "JobState=[A-Z]+" || true)
  restarts=$(scontrol show job "$job" 2>/dev/null | grep -oE "Restarts=[0-9]+" || true)
  echo "$state $restarts"
  [ "$restarts" = "Restarts=1" ] || fail "job $job: $restarts, expected Restarts=1 (one requeue)"
  expect_in "$work/job.out" "SLURM requeue 1 \(SLURM_RESTART_COUNT\): resuming from the latest checkpoint"
  from=$(grep -oE "resumed from .*step-[0-9]+ at step [0-9]+" "$work/job.out" | grep -oE "[0-9]+$" | tail -1)
  [ -n "$from" ] || fail "the second run did not say where it resumed"
  [ "$from" -ge 10 ] && [ "$from" -lt 60 ] || fail "resumed at step $from, expected 10..59"
  [ -d "$run_dir/previous-1" ] || fail "the first run's files were not kept in previous-1"
  echo "resumed at step $from"
  py "$here/checkpoint_check.py" same-losses "$work/straight" "$run_dir" $((from + 1))
  py "$here/checkpoint_check.py" same-weights "$work/straight/model.safetensors" "$run_dir/model.safetensors"
  no_leftovers "$run_dir"
  ;;
killed_task)
  # One task of `srun -n 2` is SIGKILLed mid-run (kill -9, not scancel; no --kill-on-bad-exit):
  # trainrun itself must end the other rank, naming rank 1, within the collective timeout
  # (accelerator.timeout_s), and srun must end with nothing left behind.
  # Each task's stderr goes to its own file, written by slurmstepd: once a task is killed srun
  # force-terminates the step and may exit before it has forwarded the survivor's last lines,
  # so srun's own output can lack the error (seen under load, 1 run in 3).
  timeout_s=6
  srun -n 2 --cpu-bind=cores --error="$work/task-%t.err" "$tr" "${ddp[@]}" --set trainer.max_steps=1000000 \
    --set trainer.log_every=1 --set accelerator.timeout_s=$timeout_s >"$work/out" 2>&1 &
  srun_pid=$!
  wait_for "$run_dir/metrics.jsonl" '"step": ?5\b' 90
  job=$(squeue -h -o %A | head -1)
  victim=$(scontrol listpids "$job" 2>/dev/null | awk '$5 == "1" { print $1 }' | head -1)
  [ -n "$victim" ] || { scontrol listpids "$job" || true; fail "no pid for task 1 of job $job"; }
  t0=$(now)
  kill -9 "$victim"
  rc=0
  for _ in $(seq 1 $(( (timeout_s + 20) * 10 ))); do kill -0 "$srun_pid" 2>/dev/null || break; sleep 0.1; done
  t=$(elapsed "$t0")
  kill -0 "$srun_pid" 2>/dev/null && { cat "$work/out"; fail "srun still running $t s after task 1 was killed"; }
  wait "$srun_pid" || rc=$?
  grep -v '^\[step' "$work/out" || true
  grep -v '^\[step' "$work/task-0.err" || true
  [ "$rc" -ne 0 ] || fail "srun exited 0 after a task was killed"
  # The survivor's own error names the dead rank (a peer's collective or transport failure).
  expect_in "$work/task-0.err" "rank 1 \(host [^,]+, pid $victim\)"
  within $(( timeout_s + 4 )) "$t" "kill -9 of task 1 to srun's end (exit $rc)"
  no_leftovers "$run_dir"
  ;;
*)
  fail "unknown case $case"
  ;;
esac
