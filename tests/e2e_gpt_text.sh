#!/usr/bin/env bash
# The shipped gpt job on the fortunes text, cut short: held-out loss far below ln(256) = 5.55.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 job=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
run "$work/log" "$tr" --config "$job" --set trainer.run_dir="$work/run" --set trainer.max_steps=80 \
  --set trainer.eval_every=0 --set accelerator.threads=1 --set trainer.eval_max_batches=20 --set optimizer.warmup_steps=10
last=$(tail -n 1 "$work/log")
loss=$(sed -n 's/^final eval: loss \([0-9.]*\).*/\1/p' <<<"$last")
[ -n "$loss" ] || fail "no final eval line: $last"
grep -q "tokens/s" <<<"$last" || fail "no tokens/s in: $last"
py -c "import sys; l=float('$loss'); print('held-out loss', l); sys.exit(0 if l < 3.4 else 1)" || fail "loss $loss >= 3.4"
