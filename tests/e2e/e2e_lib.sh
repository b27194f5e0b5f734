# Helpers shared by the end-to-end test scripts.
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
# run <log> <trainrun> args...: runs trainrun, keeps its output in <log>, shows it, fails on error.
run() {
  local log=$1; shift
  local rc=0
  "$@" >"$log" 2>&1 || rc=$?
  cat "$log"
  [ "$rc" -eq 0 ] || fail "exit code $rc from: $*"
}
# quiet_run <log> <command> args...: like run, but shows the output only when it fails.
quiet_run() {
  local log=$1; shift
  "$@" >"$log" 2>&1 || { cat "$log"; fail "exit code $? from: $*"; }
}
py() { if [ -x /usr/bin/python3 ]; then /usr/bin/python3 "$@"; else python3 "$@"; fi; }

# --- multi-process tests (launcher, collectives) ---------------------------------------------
now() { date +%s.%N; }
# elapsed <start>: seconds since <start> (from now), two decimals.
elapsed() { py -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$1" "$(now)"; }
# within <limit s> <measured s> <what>: fails when measured > limit; prints the measurement.
# TRAINRUN_TEST_TIME_SCALE (tests/CMakeLists.txt sets it in sanitizer builds): instrumented builds start and run several
# times slower (a trainrun process under TSan takes ~40 s to reach its strategy on a loaded
# 2-core machine), so limits and waits are multiplied by it. The limits are there to catch a
# process that never ends; that still fails at any scale.
time_scale=${TRAINRUN_TEST_TIME_SCALE:-1}
[[ $time_scale =~ ^[1-9][0-9]*$ ]] || fail "TRAINRUN_TEST_TIME_SCALE=$time_scale: expected a whole number >= 1"
within() {
  local limit=$(( $1 * time_scale ))
  py -c "import sys; sys.exit(0 if float(sys.argv[2]) <= float(sys.argv[1]) else 1)" "$limit" "$2" ||
    fail "$3 took $2 s (limit $limit s)"
  echo "measured: $3 in $2 s"
}
free_port() { py -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
expect_rc() { [ "$2" -eq "$1" ] || fail "exit code $2, expected $1"; }
expect_in() { grep -qE -- "$2" "$1" || fail "$1 does not match /$2/"; }
# wait_for <file> <regex> [seconds, default 20]: until a line matches.
wait_for() {
  local limit=$(( ${3:-20} * time_scale ))
  for _ in $(seq 1 $(( limit * 10 ))); do grep -qE -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  cat "$1"; fail "no /$2/ in $1 after $limit s"
}
# no_leftovers <pattern>: no process whose command line contains <pattern> is still running.
# Also no shared-memory segment of the gloo-cpu transport (/dev/shm/trainrun-*) that was not
# there when the test started: segments are unlinked as soon as both ends map them, so one of a
# concurrent test may exist for a moment, and a leftover is one still there 3 s later.
# Whether process $1 has NAME=VALUE ($2) in its environment (false once it is gone).
has_env() { grep -qxF -- "$2" <<<"$(tr '\0' '\n' 2>/dev/null <"/proc/$1/environ")"; }
shm_segments() { ls /dev/shm 2>/dev/null | grep '^trainrun-' | sort || true; }
shm_at_start=$(shm_segments)
no_leftovers() {
  command -v pgrep >/dev/null || fail "pgrep (Debian's procps) is missing: cannot check for leftover processes"
  sleep 0.5
  if pgrep -af -- "$1" | grep -v -e pgrep -e "$0"; then fail "processes left behind (above)"; fi
  local new=""
  for _ in $(seq 1 30); do
    new=$(comm -13 <(echo "$shm_at_start") <(shm_segments))
    [ -z "$new" ] && break
    sleep 0.1
  done
  [ -z "$new" ] || fail "shared-memory segments left behind in /dev/shm: $new"
  echo "no processes or shared-memory segments left behind"
}
