#!/usr/bin/env bash
# No-hang fault handling of the collective backends, through the real trainrun binary on
# loopback (`trainrun bench collectives` is the workload). One case per CTest entry:
#   collectives_faults.sh <trainrun> <work dir> <backend> <case>
# Cases: kill9 (launcher), kill9_no_launcher, mismatch, stall, timeout, rendezvous, sigint,
# before_init (mpi only).
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 work=$2 backend=$3 case=$4
rm -rf "$work" && mkdir -p "$work"
tag="faults-$case-$$"  # on every worker's command line, so pgrep finds exactly this test's processes

if ! "$tr" plugins "$backend" >/dev/null 2>&1; then echo "SKIP: no $backend plugin in this build"; exit 77; fi

bench=(bench collectives --backend "$backend" --set accelerator.threads=1 --plugin-path "$(dirname "$tr")/../lib/trainrun/plugins")
# A long all-reduce loop: 16 MiB per operation, effectively endless.
loop=(--op allreduce --sizes 16M --iters 1000000 --warmup 0 --check false --label "$tag")

case $case in
kill9)
  # kill -9 of one rank in the middle of an all-reduce: the launcher ends the job within 15 s,
  # names the rank and the signal, and leaves nothing behind.
  "$tr" "${bench[@]}" --nproc 3 "${loop[@]}" >"$work/out" 2>"$work/err" &
  launcher=$!
  if [ "$backend" = mpi ]; then
    wait_for "$work/out" "allreduce on" 60
    sleep 1
    victim=$(for p in $(pgrep -f -- "$tag"); do
      if has_env "$p" PMI_RANK=1; then echo "$p"; break; fi; done)
  else
    wait_for "$work/err" "started rank 1 \(pid [0-9]+\)" 60
    wait_for "$work/out" "allreduce on" 60
    sleep 1
    victim=$(sed -nE 's/^trainrun: started rank 1 \(pid ([0-9]+)\).*/\1/p' "$work/err")
  fi
  [ -n "$victim" ] || fail "rank 1's pid not found"
  t0=$(now)
  kill -9 "$victim"
  rc=0; wait "$launcher" || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out" "$work/err"
  # A shell's code for a process killed by SIGKILL: the launcher passes on the killed rank's.
  [ "$backend" = mpi ] || expect_rc 137 "$rc"
  [ "$rc" -ne 0 ] || fail "exit code 0 after a rank was killed"
  within 15 "$t" "kill -9 of rank 1 (pid $victim) to the end of the job"
  if [ "$backend" = mpi ]; then
    # Hydra ends the job and reports the first process whose end it noticed, by pid; that is
    # not always the killed rank (a peer that failed because of it can come first), so only
    # the report itself is checked here.
    expect_in "$work/out" "BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"
  else
    expect_in "$work/err" "rank 1 \(pid $victim, node 0\) was killed by signal 9 \(SIGKILL\)"
  fi
  no_leftovers "$tag"
  ;;
kill9_no_launcher)
  # Without a launcher to stop them, the survivors' own communicator must fail: a peer's death
  # ends every rank quickly, with the operation named.
  port=$(free_port)
  pids=()
  for r in 0 1 2; do
    RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$tr" "${bench[@]}" "${loop[@]}" >"$work/out-$r" 2>&1 &
    pids+=($!)
  done
  wait_for "$work/out-0" "allreduce on" 60
  sleep 1
  t0=$(now)
  kill -9 "${pids[1]}"
  # On a loaded machine rank 1 may still be in the barrier before the timed loop: either
  # operation must be named.
  for r in 0 2; do
    rc=0; wait "${pids[$r]}" || rc=$?
    t=$(elapsed "$t0")
    cat "$work/out-$r"
    [ "$rc" -ne 0 ] || fail "rank $r exited 0 after its peer died"
    # The survivor's communicator fails the operation: an error exit, not a crash or a kill.
    [ "$rc" -lt 128 ] || fail "rank $r ended with exit code $rc (a signal) instead of an error"
    within 15 "$t" "kill -9 of rank 1 to rank $r's error exit"
    expect_in "$work/out-$r" "(all_reduce\(sum, float32 x 4194304, 16777216 B\)|barrier\(\)) #[0-9]+ in group world"
  done
  no_leftovers "$tag"
  ;;
mismatch)
  # Rank 1 all-reduces 11 elements where rank 0 all-reduces 10: an immediate error naming both.
  t0=$(now)
  rc=0
  "$tr" "${bench[@]}" --nproc 2 --inject mismatch:1 --op allreduce --sizes 4K --iters 1 --warmup 0 --label "$tag" --set accelerator.timeout_s=60 >"$work/out" 2>&1 || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out"
  [ "$rc" -ne 0 ] || fail "exit code 0"
  within 30 "$t" "mismatched collective to the end of the job"
  expect_in "$work/out" "collective mismatch at #1 in group world: rank [01] issued all_reduce\(sum, float32 x 1[01], 4[04] B\) but rank [01] issued all_reduce\(sum, float32 x 1[01], 4[04] B\)"
  no_leftovers "$tag"
  ;;
mismatch_kind)
  # Rank 1 broadcasts where rank 0 all-reduces. On gloo-cpu within one machine the all-reduce
  # goes over shared memory, whose messages carry the order check, and the broadcast over TCP
  # with the store's check: they never meet, so rank 0 waits out its 5 s timeout, and the
  # store's check run after the failure still names both collectives.
  t0=$(now)
  rc=0
  "$tr" "${bench[@]}" --nproc 2 --inject mismatch_kind:1 --op allreduce --sizes 4K --iters 1 --warmup 0 --label "$tag" --set accelerator.timeout_s=5 >"$work/out" 2>&1 || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out"
  [ "$rc" -ne 0 ] || fail "exit code 0"
  within 40 "$t" "mismatched collective kinds to the end of the job"
  expect_in "$work/out" "collective mismatch at #1 in group world: rank [01] issued (all_reduce\\(sum|broadcast\\(root 0), float32 x 10, 40 B\\) but rank [01] issued (all_reduce\\(sum|broadcast\\(root 0), float32 x 10, 40 B\\)"
  no_leftovers "$tag"
  ;;
stall)
  # Rank 1 arrives 4 s late with stall_warning_s = 1: the others are told who is missing, with
  # host, pid and progress; then the job completes normally.
  rc=0
  "$tr" "${bench[@]}" --nproc 2 --inject stall:1:4 --set accelerator.stall_warning_s=1 --op allreduce --sizes 4K --iters 1 --warmup 0 --label "$tag" >"$work/out" 2>&1 || rc=$?
  cat "$work/out"
  [ "$rc" -eq 0 ] || fail "exit code $rc"
  expect_in "$work/out" "warning: rank 0: all_reduce\(sum, float32 x 10, 40 B\) #1 in group world has waited [0-9.]+ s; not arrived: rank 1 \(host [^,]+, pid [0-9]+\): last completed none, first pending none, last heard"
  no_leftovers "$tag"
  ;;
timeout)
  # Rank 1 arrives 20 s late and the operation timeout is 3 s: rank 0's error names the
  # operation, the group and the missing rank, within the timeout (plus start-up).
  t0=$(now)
  rc=0
  "$tr" "${bench[@]}" --nproc 2 --inject stall:1:20 --set accelerator.timeout_s=3 --op allreduce --sizes 4K --iters 1 --warmup 0 --label "$tag" >"$work/out" 2>&1 || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out"
  [ "$rc" -ne 0 ] || fail "exit code 0"
  within 15 "$t" "a 3 s operation timeout to the end of the job"
  expect_in "$work/out" "all_reduce\(sum, float32 x 10, 40 B\) #1 in group world timed out after 3(\.0)? s; not arrived: rank 1 \(host [^,]+, pid [0-9]+\)"
  no_leftovers "$tag"
  ;;
rendezvous)
  # Rank 1 never starts: rank 0 reports it by number within the rendezvous timeout.
  port=$(free_port)
  t0=$(now)
  rc=0
  RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    TRAINRUN_RENDEZVOUS_TIMEOUT_S=3 "$tr" "${bench[@]}" --op allreduce --sizes 4K --label "$tag" >"$work/out" 2>&1 || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out"
  [ "$rc" -ne 0 ] || fail "exit code 0"
  within 12 "$t" "a 3 s rendezvous timeout to the error"
  expect_in "$work/out" "rank\(s\) 1 did not arrive within 3(\.0)? s"
  no_leftovers "$tag"
  ;;
before_init)
  # mpi: a rank that dies before MPI_Init. Hydra stops the others only once every rank has
  # initialised, so without the plugin's store rendezvous before MPI_Init they would block in
  # it for good; with it, rank 0 names the missing rank within the rendezvous timeout.
  port=$(free_port)
  t0=$(now)
  rc=0
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TRAINRUN_RENDEZVOUS_TIMEOUT_S=3 \
    timeout 100 mpiexec -n 2 bash -c '[ "$PMI_RANK" = 1 ] && exit 3; exec "$0" "$@"' \
    "$tr" "${bench[@]}" --op allreduce --sizes 4K --iters 1 --label "$tag" >"$work/out" 2>&1 || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out"
  [ "$rc" -ne 0 ] || fail "exit code 0"
  [ "$rc" -ne 124 ] || fail "still blocked after 100 s"
  within 15 "$t" "a rank dead before MPI_Init (3 s rendezvous timeout) to the end of the job"
  expect_in "$work/out" "mpi: before MPI_Init: rendezvous of 2 ranks: rank\(s\) 1 did not arrive within 3(\.0)? s"
  no_leftovers "$tag"
  ;;
sigint)
  # Ctrl-C on the launcher while every rank is inside all-reduces: exit 130, nothing left.
  "$tr" "${bench[@]}" --nproc 3 "${loop[@]}" >"$work/out" 2>"$work/err" &
  launcher=$!
  wait_for "$work/out" "allreduce on" 60
  sleep 1
  t0=$(now)
  kill -INT "$launcher"
  rc=0; wait "$launcher" || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out" "$work/err"
  [ "$rc" -eq 130 ] || fail "exit code $rc, expected 130"
  within 10 "$t" "SIGINT to the end of the job"
  no_leftovers "$tag"
  ;;
*) fail "unknown case $case" ;;
esac
echo PASS
