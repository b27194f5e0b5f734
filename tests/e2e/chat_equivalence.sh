#!/usr/bin/env bash
# docs/design.md's invariant 1 on SFT data (issue 22, done-when 3d): conversations and a small
# tokenizer from tests/e2e/chat_data.py, then the equivalence suite (ddp or STRATEGY at world 1, 2,
# 4 x accumulation 1, 4 against the single-process run: every step's loss and the final weights
# within 1e-5).
#   chat_equivalence.sh TRAINRUN PYTHON JOB WORK [STRATEGY [--set strategy.key=value ...]]
set -eu
tr=$1 py=$2 job=$3 work=$4 strategy=${5:-ddp}
shift 4; [ $# -gt 0 ] && shift
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
files=$("$py" "$here/chat_data.py" "$work/data" --count 192 --seed 3 --tokenizer-out "$work/tokenizer")
paths="[$(printf '"%s",' $files | sed 's/,$//')]"
exec bash "$here/equivalence.sh" "$tr" "$job" "$work/eq" "$strategy" adamw "$@" \
  --common --set "data.paths=$paths" --set "data.tokenizer=$work/tokenizer"
