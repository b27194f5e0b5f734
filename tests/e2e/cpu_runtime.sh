#!/usr/bin/env bash
# Per-rank CPU runtime, verified from inside the workers: every rank writes what its libraries
# and the kernel report (<run_dir>/runtime/rank-N.json: LibTorch's intra-/inter-op threads,
# OpenBLAS's threads and kernel, the affinity mask of every thread), and this test compares that
# with what the rules say for this machine, computed here independently (affinity mask from
# os.sched_getaffinity, cgroup quota read by cpu_runtime_check.py), for 1 and 2 local ranks.
# Also: an explicit OpenBLAS kernel reaches the ranks (1 rank: through a re-exec; 2 ranks:
# through the launcher's environment), a kernel that fails the probe is refused with a warning
# naming the variable to set, library defaults leave the pools and the mask alone, and
# OMP_NUM_THREADS in the environment wins over "auto".
# usage: cpu_runtime.sh <trainrun> <job.toml> <work dir>
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 job=$2 work=$3
check="py $(dirname "$0")/cpu_runtime_check.py"
rm -rf "$work" && mkdir -p "$work"
# The harness may export these (tests/core.cmake does for other tests); "auto" must be seen here.
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS OPENBLAS_CORETYPE TRAINRUN_BLAS_CHOICE
base=(--config "$job" --set trainer.max_steps=3 --set trainer.eval_max_batches=1
      --set trainer.micro_batch_size=0 --set trainer.save_final_model=false
      --set accelerator.threads=auto)
ddp=(--set launch.nproc_per_node=2 --set strategy.plugin=ddp --set accelerator.plugin=gloo-cpu)
has_avx2=$(grep -qw avx2 /proc/cpuinfo && echo 1 || echo 0)

echo "== 1 rank, auto: every usable core for LibTorch, BLAS 1 thread, the whole mask"
run "$work/auto1.log" "$tr" "${base[@]}" --set trainer.run_dir="$work/auto1"
$check auto "$work/auto1" 1
expect_in "$work/auto1.log" "runtime +LibTorch .*\| OpenBLAS"
expect_in "$work/auto1.log" "rank 0: intra-op [0-9]+, inter-op [0-9]+, BLAS 1, CPU"
default_core=$($check corename "$work/auto1")

echo "== 2 ranks, auto: cores / 2 each, pinned to disjoint halves of the mask"
run "$work/auto2.log" "$tr" "${base[@]}" "${ddp[@]}" --set trainer.run_dir="$work/auto2"
$check auto "$work/auto2" 2
expect_in "$work/auto2.log" "rank 0: .* \| rank 1: "

echo "== library defaults (threads 0, blas_threads 0, pin false): nothing set, nothing pinned"
run "$work/lib2.log" "$tr" "${base[@]}" "${ddp[@]}" --set trainer.run_dir="$work/lib2" \
  --set accelerator.threads=0 --set accelerator.blas_threads=0 --set accelerator.pin=false \
  --set launch.blas_coretype=off
$check defaults "$work/lib2" 2

echo "== OMP_NUM_THREADS=1 in the environment wins over auto"
OMP_NUM_THREADS=1 run "$work/env1.log" "$tr" "${base[@]}" --set trainer.run_dir="$work/env1"
$check threads "$work/env1" 1 1
expect_in "$work/env1.log" "auto: OMP_NUM_THREADS=1 from the environment"

if [ "$has_avx2" = 1 ]; then
  for n in 1 2; do
    echo "== blas_coretype = \"Haswell\" with $n rank(s): every rank runs that kernel"
    extra=(); [ "$n" = 2 ] && extra=("${ddp[@]}")
    run "$work/haswell$n.log" "$tr" "${base[@]}" "${extra[@]}" --set trainer.run_dir="$work/haswell$n" \
      --set launch.blas_coretype=Haswell
    $check kernel "$work/haswell$n" "$n" Haswell
    expect_in "$work/haswell$n.log" "BLAS kernel Haswell \(blas_coretype = \"Haswell\""
  done
else
  echo "(no AVX2 on this CPU: the explicit-kernel runs are skipped)"
fi

# What "auto" must run comes from this machine: the best kernel for its CPU flags, the kernel its
# OpenBLAS picks by itself, and whether its OpenBLAS runs the best one (the probe command).
probe_corename() { OPENBLAS_CORETYPE=$1 "$tr" blas-probe | awk '$1 == "corename" {print $2}'; }
best=$($check best)
own=$("$tr" blas-probe | awk '$1 == "corename" {print $2}')
runs_best=0
[ -n "$best" ] && [ "$(probe_corename "$best")" = "$best" ] && runs_best=1
auto_core=$($check auto_kernel "$own" "$runs_best")
echo "this machine: best kernel for the CPU '${best:-none}', OpenBLAS's own pick $own," \
     "runs the best: $runs_best => auto runs $auto_core"
[ "$default_core" = "$auto_core" ] || fail "the auto run used kernel $default_core, expected $auto_core"

echo "== a kernel that fails the probe is refused; the run uses what auto decides, and goes on"
# OpenBLAS 0.3.21 (Debian 12) has no SapphireRapids kernel: asked for it, it runs another, which
# the probe catches (a name trainrun does not know at all is a job-file error, checked below).
# refused <label> <auto's kernel> [environment...]: 1 rank (re-exec) and 2 ranks (launcher).
refused() {
  local label=$1 want=$2; shift 2
  for n in 1 2; do
    extra=(); [ "$n" = 2 ] && extra=("${ddp[@]}")
    run "$work/bad-$label$n.log" env "$@" "$tr" "${base[@]}" "${extra[@]}" \
      --set trainer.run_dir="$work/bad-$label$n" --set launch.blas_coretype=SapphireRapids
    expect_in "$work/bad-$label$n.log" "warning: \[launch\] blas_coretype: kernel $want \(.*\), as \"auto\" decides, because blas_coretype \"SapphireRapids\" was refused: OpenBLAS did not take OPENBLAS_CORETYPE=SapphireRapids"
    expect_in "$work/bad-$label$n.log" "set \[launch\] blas_coretype to another kernel, or \"auto\""
    $check kernel "$work/bad-$label$n" "$n" "$want"
  done
  [ "$(grep -c "blas_coretype: kernel" "$work/bad-${label}2.log")" = 1 ] ||
    fail "the refusal should be reported once (by the launcher), not once per rank"
}
refused machine "$auto_core"
# Both kinds of machine on this one: OpenBLAS's own pick stood in for (a test-only variable;
# a user's OPENBLAS_CORETYPE is a different path, checked above with "Haswell"): the SSE
# fallback of a CPU this OpenBLAS does not recognise, and the best kernel of one it does.
picks=(Prescott)
[ "$runs_best" = 1 ] && picks+=("$best")
for pick in "${picks[@]}"; do
  want=$($check auto_kernel "$pick" "$runs_best")
  echo "== OpenBLAS's own pick $pick (simulated): auto runs $want, and so does a refused kernel"
  sim=(OPENBLAS_CORETYPE="$pick" TRAINRUN_TEST_OPENBLAS_OWN_CORETYPE="$pick")
  run "$work/auto-$pick.log" env "${sim[@]}" "$tr" "${base[@]}" --set trainer.run_dir="$work/auto-$pick"
  $check kernel "$work/auto-$pick" 1 "$want"
  refused "$pick" "$want" "${sim[@]}"
done
rc=0
"$tr" check "${base[@]}" --set launch.blas_coretype=NoSuchCore >"$work/unknown.log" 2>&1 || rc=$?
cat "$work/unknown.log"
expect_rc 2 "$rc"
expect_in "$work/unknown.log" "\[launch\] blas_coretype: 'NoSuchCore' is not an OpenBLAS kernel name trainrun knows"

echo "== trainrun check shows the plan of each local rank"
run "$work/check.log" "$tr" check "${base[@]}" "${ddp[@]}"
expect_in "$work/check.log" "^# runtime"
expect_in "$work/check.log" "^#   local rank 0: intra-op [0-9]+, inter-op [0-9]+, BLAS 1, "
expect_in "$work/check.log" "^#   local rank 1: "
expect_in "$work/check.log" "^#   backends found: .*gloo-cpu"
echo "OK"
