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
py() { if [ -x /usr/bin/python3 ]; then /usr/bin/python3 "$@"; else python3 "$@"; fi; }
