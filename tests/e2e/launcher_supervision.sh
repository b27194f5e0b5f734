#!/usr/bin/env bash
# The agent's supervision with small shell workers (unit_launcher --launch runs core::launch()
# with any command as the worker). One case per CTest entry:
#   launcher_supervision.sh <unit_launcher> <work dir> <case>
# Cases: kill9, term_ignored, sigint, stray_child, launcher_killed, progress, mpiexec_fail,
# mpiexec_sigint.
source "$(dirname "$0")/e2e_lib.sh"
probe=$1 work=$2 case=$3
rm -rf "$work" && mkdir -p "$work"
tag=trsup-$case-$$  # on every worker's command line, for pgrep -f
# The time limits below are wide (15-20 s) on purpose: each case's failure mode is a launcher
# that never ends (workers that loop forever, a stray child sleeping 300 s, a save that never
# finishes), and ctest -j2 on a loaded 2-core machine has stretched 1-second ends to 8 s.
rd=$work/run

pid_of_rank() { sed -nE "s/^trainrun: started rank $2 \(pid ([0-9]+)\).*/\1/p" "$1"; }

case $case in
kill9)
  # A worker killed with SIGKILL in the middle of the run is the cause: named with its pid, the
  # signal and its last lines; the others are stopped; the job ends within seconds.
  "$probe" --launch 3 5 "$rd" -- bash -c 'echo "rank $RANK of $WORLD_SIZE ready"; echo "to stderr" >&2; exec -a "$0" sleep 300' "$tag" \
    >"$work/out" 2>"$work/err" &
  agent=$!
  wait_for "$work/out" "^\[rank 1\] rank 1 of 3 ready"
  wait_for "$work/out" "^\[rank 2\] rank 2 of 3 ready"
  victim=$(pid_of_rank "$work/err" 1)
  t0=$(now)
  kill -9 "$victim"
  rc=0
  wait "$agent" || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out" "$work/err"
  expect_rc 137 "$rc"
  within 10 "$t" "SIGKILL of rank 1 to a finished launcher"
  expect_in "$work/err" "^trainrun: rank 1 \(pid $victim, node 0\) was killed by signal 9 \(SIGKILL\) after [0-9.]+ s; other ranks stopped\. Last lines of $rd/logs/rank-1\.log:"
  expect_in "$work/err" "^  rank 1 of 3 ready"
  expect_in "$work/err" "^  to stderr"
  expect_in "$work/err" "^\[rank 1\] to stderr"
  grep -qE "^trainrun: rank [02] \(pid" "$work/err" && fail "a stopped rank was reported as a cause"
  expect_in "$rd/logs/rank-2.log" "^rank 2 of 3 ready$"
  no_leftovers "$tag"
  ;;
term_ignored)
  # Workers that ignore SIGTERM are killed after the grace period (1 s here).
  "$probe" --launch 2 1 "$rd" -- bash -c 'trap "" TERM; echo up; if [ "$RANK" = 1 ]; then sleep 0.5; exit 3; fi; while :; do sleep 0.1; done' "$tag" \
    >"$work/out" 2>&1 &
  agent=$!
  wait_for "$work/out" "exited with code 3"
  t0=$(now)
  rc=0
  wait "$agent" || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out"
  expect_rc 3 "$rc"
  within 15 "$t" "SIGKILL after a 1 s grace"
  expect_in "$work/out" "^trainrun: rank 1 \(pid [0-9]+, node 0\) exited with code 3"
  no_leftovers "$tag"
  ;;
sigint)
  # (e) Ctrl-C: one SIGTERM per worker (they stop cleanly and exit 130), exit code 130, nothing
  # left behind.
  "$probe" --launch 2 5 "$rd" -- bash -c 'trap "echo rank \$RANK stopping; exit 130" TERM; echo up; while :; do sleep 0.1; done' "$tag" \
    >"$work/out" 2>&1 &
  agent=$!
  wait_for "$work/out" "^\[rank 0\] up"
  wait_for "$work/out" "^\[rank 1\] up"
  t0=$(now)
  kill -INT "$agent"
  rc=0
  wait "$agent" || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out"
  expect_rc 130 "$rc"
  within 15 "$t" "SIGINT to a finished launcher"
  expect_in "$work/out" "^trainrun: interrupted \(SIGINT\)"
  for r in 0 1; do expect_in "$work/out" "^\[rank $r\] rank $r stopping"; done
  grep -q "exited with code 130" "$work/out" && fail "the stopped ranks were reported as failures"
  no_leftovers "$tag"
  ;;
saving)
  # The stop protocol: rank 0 says on fd 3 that it is writing a checkpoint and takes 3 s, past
  # the 1 s grace: it is left to finish, and the launcher says that it waits; rank 1
  # acknowledges the SIGTERM but never stops: it alone is killed after the grace.
  "$probe" --launch 2 1 "$rd" -- bash -c 'trap "echo stopping >&3; if [ \$RANK = 0 ]; then echo saving 7 >&3; sleep 3; echo rank 0 checkpoint complete; echo saved 7 >&3; exit 130; fi; trap \"\" TERM" TERM; echo up; while :; do sleep 0.1; done' "$tag" \
    >"$work/out" 2>&1 &
  agent=$!
  wait_for "$work/out" "^\[rank 0\] up"
  wait_for "$work/out" "^\[rank 1\] up"
  t0=$(now)
  kill -TERM "$agent"
  rc=0
  wait "$agent" || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out"
  expect_rc 130 "$rc"
  within 20 "$t" "a 3 s save to a finished launcher"
  expect_in "$work/out" "^trainrun: rank 0 is writing its checkpoint \(step 7\); waiting for it to finish"
  expect_in "$work/out" "^\[rank 0\] rank 0 checkpoint complete"
  expect_in "$work/out" "^trainrun: rank 0 finished its checkpoint \(step 7\) in [0-9.]+ s"
  expect_in "$work/out" "^trainrun: rank 1 did not stop within 1.0 s of SIGTERM \(\[launch\] stop_grace_s\) and had not begun a checkpoint: killing it"
  grep -q "^trainrun: rank 0 .*killing it" "$work/out" && fail "the saving rank was killed"
  no_leftovers "$tag"
  ;;
store_listen)
  # The rendezvous store listens on master_addr (127.0.0.1) only, not on every interface; with
  # store_listen = "all" (here the probe's TRAINRUN_TEST_STORE_LISTEN_ALL) on the wildcard.
  listeners() {  # listeners <port>: the local addresses listening on that TCP port (hex, /proc)
    py - "$1" <<'PY'
import sys
port = "%04X" % int(sys.argv[1])
for f in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(f).readlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and local.endswith(":" + port):
            print(local)
PY
  }
  for mode in master_addr all; do
    env $([ $mode = all ] && echo TRAINRUN_TEST_STORE_LISTEN_ALL=1) "$probe" --launch 1 1 - -- bash -c 'echo "port $MASTER_PORT"; sleep 3' "$tag" >"$work/out-$mode" 2>&1 &
    agent=$!
    wait_for "$work/out-$mode" "^\[rank 0\] port [0-9]+"
    port=$(sed -nE 's/^\[rank 0\] port ([0-9]+)$/\1/p' "$work/out-$mode")
    listeners "$port" >"$work/listen-$mode"
    wait "$agent" || true
    echo "$mode: port $port, listening on: $(tr '\n' ' ' <"$work/listen-$mode")"
    [ -s "$work/listen-$mode" ] || fail "$mode: nothing listens on port $port"
    if [ $mode = master_addr ]; then
      grep -qvE "^0100007F:" "$work/listen-$mode" && fail "the store listens beyond 127.0.0.1: $(cat "$work/listen-$mode")"
    else
      grep -qE "^(00000000|0{32}):" "$work/listen-$mode" || fail "store_listen = all: no wildcard listener"
    fi
  done
  no_leftovers "$tag"
  ;;
blame)
  # The first cause wins: rank 0 fails on its own (an error, then 0.7 s of teardown) and rank 1,
  # seeing its connection reset, exits first with a transport error: rank 0 is named.
  "$probe" --launch 2 1 "$rd" -- bash -c 'if [ "$RANK" = 0 ]; then echo "trainrun: error: cannot open metrics.jsonl: Permission denied" >&2; touch "$0.failed"; sleep 0.7; exit 1; fi; while [ ! -e "$0.failed" ]; do sleep 0.02; done; echo "trainrun: error: gloo: all_reduce #5 in group world failed: Connection reset by peer" >&2; exit 1' "$work/$tag" \
    >"$work/out" 2>&1 || true
  cat "$work/out"
  expect_in "$work/out" "^trainrun: rank 0 \(pid [0-9]+, node 0\) exited with code 1"
  grep -qE "^trainrun: rank 1 \(pid [0-9]+, node 0\) exited" "$work/out" && fail "the rank with the transport error was named as the cause"
  no_leftovers "$tag"
  ;;
save_stuck)
  # A save that never ends is stopped after stop_save_timeout_s (2 s here).
  TRAINRUN_TEST_SAVE_TIMEOUT_S=2 "$probe" --launch 1 1 "$rd" -- bash -c 'trap "echo saving 3 >&3; trap \"\" TERM" TERM; echo up; while :; do sleep 0.1; done' "$tag" \
    >"$work/out" 2>&1 &
  agent=$!
  wait_for "$work/out" "^\[rank 0\] up"
  t0=$(now)
  kill -TERM "$agent"
  rc=0
  wait "$agent" || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out"
  expect_rc 130 "$rc"
  within 20 "$t" "a stuck save of a 2 s save timeout to a finished launcher"
  expect_in "$work/out" "^trainrun: rank 0 is still writing its checkpoint [0-9.]+ s after it began \(\[launch\] stop_save_timeout_s = 2.0 s\): killing it"
  no_leftovers "$tag"
  ;;
stray_child)
  # A worker that exits 0 but leaves a child holding its output pipe: the launcher still ends
  # (within about a second) and takes the child with it.
  t0=$(now)
  rc=0
  "$probe" --launch 2 5 "$rd" -- bash -c '(exec -a "$0-child" sleep 300) & echo "rank $RANK done"' "$tag" >"$work/out" 2>&1 || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out"
  expect_rc 0 "$rc"
  within 20 "$t" "two workers with stray children"
  expect_in "$work/out" "^\[rank 1\] rank 1 done"
  no_leftovers "$tag"
  ;;
launcher_killed)
  # The launcher itself killed with SIGKILL: PR_SET_PDEATHSIG takes the workers down too.
  "$probe" --launch 2 5 "$rd" -- bash -c 'echo up; exec -a "$0" sleep 300' "$tag" >"$work/out" 2>&1 &
  agent=$!
  wait_for "$work/out" "^\[rank 1\] up"
  kill -9 "$agent"
  wait "$agent" || true
  no_leftovers "$tag"
  ;;
progress)
  # With a terminal behind the launcher, rank 0 (only) gets TRAINRUN_TTY=1, and its '\r'
  # progress redraws reach the terminal unprefixed and stay out of its log.
  command -v script >/dev/null || { echo "SKIP: no script(1) for a pseudo-terminal"; exit 77; }
  worker='if [ "$TRAINRUN_TTY" = 1 ]; then printf "\r 50%%|bar\033[K" >&2; sleep 0.2; printf "\r100%%|bar\033[K" >&2; printf "\n" >&2; fi; echo "rank $RANK tty=${TRAINRUN_TTY:-0} columns=${COLUMNS:-none}"'
  script -qec "stty cols 123 2>/dev/null; $(printf '%q ' "$probe" --launch 2 5 "$rd" -- bash -c "$worker" "$tag")" /dev/null \
    >"$work/out" 2>&1 || fail "the launcher failed under script(1)"
  cat -A "$work/out"
  grep -q $'\r 50%|bar\033\[K' "$work/out" || fail "the progress redraw was not passed through"
  grep -q $'\[rank 0\] \r' "$work/out" && fail "the progress redraw was prefixed"
  expect_in "$work/out" "\[rank 0\] rank 0 tty=1 columns=123"
  # A line after a redraw first clears the bar ("\r\033[K").
  expect_in "$work/out" "\[rank 1\] rank 1 tty=0 columns=none"
  grep -q "bar" "$rd/logs/rank-0.log" && fail "the progress bar went into rank-0.log"
  expect_in "$rd/logs/rank-0.log" "^rank 0 tty=1"
  no_leftovers "$tag"
  ;;
mpiexec_fail)
  if ! mpiexec --version 2>/dev/null | grep HYDRA >/dev/null; then echo "SKIP: no MPICH hydra mpiexec"; exit 77; fi
  rc=0
  # Hydra stops the other ranks only once they have called MPI_Init; these shell ranks end by
  # themselves.
  "$probe" --launch 3 2 "$rd" mpiexec -- bash -c 'printf "partial "; sleep 0.1; echo "line of $PMI_RANK"; if [ "$PMI_RANK" = 1 ]; then echo "rank 1 fails" >&2; exit 3; fi; sleep 0.5' "$tag" \
    >"$work/out" 2>&1 || rc=$?
  cat "$work/out"
  [ "$rc" -ne 0 ] || fail "exit code 0"
  for r in 0 1 2; do
    expect_in "$work/out" "^\[rank $r\] partial line of $r$"
    expect_in "$rd/logs/rank-$r.log" "^partial line of $r$"
  done
  expect_in "$work/out" "^\[rank 1\] rank 1 fails"
  expect_in "$work/out" "^trainrun: mpiexec \(pid [0-9]+\) exited with code [0-9]+ after [0-9.]+ s\. Last lines of its output:"
  no_leftovers "$tag"
  ;;
mpiexec_sigint)
  if ! mpiexec --version 2>/dev/null | grep HYDRA >/dev/null; then echo "SKIP: no MPICH hydra mpiexec"; exit 77; fi
  "$probe" --launch 2 2 "$rd" mpiexec -- bash -c 'echo up; exec -a "$0" sleep 300' "$tag" >"$work/out" 2>&1 &
  agent=$!
  wait_for "$work/out" "^\[rank 0\] up"
  wait_for "$work/out" "^\[rank 1\] up"
  t0=$(now)
  kill -INT "$agent"
  rc=0
  wait "$agent" || rc=$?
  t=$(elapsed "$t0")
  cat "$work/out"
  expect_rc 130 "$rc"
  within 20 "$t" "SIGINT to a finished mpiexec launcher"
  no_leftovers "$tag"
  ;;
*)
  fail "unknown case '$case'"
  ;;
esac
echo OK
