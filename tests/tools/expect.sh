#!/usr/bin/env bash
# expect.sh <expected-exit-code> <regex>... -- <command> [args...]
#
# Runs the command, prints its combined stdout+stderr, and fails (exit 1) unless
#   - the command's exit code equals <expected-exit-code>, and
#   - the combined output matches every <regex> (grep -E); a regex written as '!<regex>' must
#     NOT match.
# An exit code >= 128 (killed by a signal: a crash) is always reported as a crash.
set -u
if [ $# -lt 3 ]; then
  echo "usage: expect.sh <expected-exit-code> <regex>... -- <command...>" >&2
  exit 1
fi
expected=$1
shift
regexes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  regexes+=("$1")
  shift
done
if [ $# -eq 0 ] || [ ${#regexes[@]} -eq 0 ]; then
  echo "expect.sh: need at least one regex and '--' before the command" >&2
  exit 1
fi
shift  # --
if [ $# -eq 0 ]; then
  echo "expect.sh: no command after '--'" >&2
  exit 1
fi

out=$(mktemp "${TMPDIR:-/tmp}/expect.XXXXXX")
trap 'rm -f "$out"' EXIT
echo "+ $*"
"$@" >"$out" 2>&1
rc=$?
cat "$out"
echo "+ exit code $rc"

ok=1
if [ "$rc" -ge 128 ]; then
  echo "FAIL: the command crashed (exit code $rc = 128 + signal $((rc - 128))), expected $expected"
  ok=0
elif [ "$rc" -ne "$expected" ]; then
  echo "FAIL: exit code $rc, expected $expected"
  ok=0
fi
for re in "${regexes[@]}"; do
  if [ "${re:0:1}" = "!" ]; then
    if grep -Eq -- "${re:1}" "$out"; then
      echo "FAIL: output matches '${re:1}', which it must not"
      ok=0
    fi
  elif ! grep -Eq -- "$re" "$out"; then
    echo "FAIL: output does not match '$re'"
    ok=0
  fi
done
[ "$ok" -eq 1 ] && echo "PASS" && exit 0
exit 1
