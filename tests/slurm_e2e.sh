#!/usr/bin/env bash
# trainrun under a real SLURM (Debian's slurm-wlm + munge), started for this test alone
# (tests/slurm_lib.sh). One case per CTest entry:
#   slurm_e2e.sh <trainrun> <equivalence jobs dir> <work dir> <repo dir> <case>
# srun: `srun -n 2 trainrun` with ranks from SLURM's variables, the store on the step's first
# node, srun's CPU binding kept (a map that crosses trainrun's own slicing), losses equal to one
# process. sbatch: examples/slurm/train.sbatch, the same check. scancel: a running job is
# cancelled; every rank ends within KillWait, with nothing left.
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
  for _ in $(seq 1 300); do squeue -h -j "$job" 2>/dev/null | grep -q . || break; sleep 0.1; done
  t=$(elapsed "$t0")
  cat "$work/job.out"
  squeue -h -j "$job" 2>/dev/null | grep -q . && fail "job $job still queued or running after 30 s"
  # KillWait (5 s in slurm_lib.sh's config) is SLURM's own bound: SIGKILL after it.
  within 10 "$t" "scancel to the job's end"
  expect_in "$work/job.out" "CANCELLED"
  no_leftovers "$run_dir"
  ;;
*)
  fail "unknown case $case"
  ;;
esac
