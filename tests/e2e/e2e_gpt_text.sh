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
# The bar is the data's own unigram baseline (byte frequencies of the training part, add-one
# smoothed, scored on the held-out tail the text dataset evaluates on), computed here from the
# job's files: a model that ignores its context cannot go below it; 80 steps must beat it by
# 0.15 nats.
py - "$job" "$loss" <<'PY' || fail "held-out loss $loss is not 0.15 below the unigram baseline"
import collections, glob, math, sys, tomllib
job = tomllib.load(open(sys.argv[1], "rb"))
loss = float(sys.argv[2])
files = [f for p in job["data"]["paths"] for f in sorted(glob.glob(p))]
data = b"".join(open(f, "rb").read() for f in files)
held = int(len(data) * job["data"].get("eval_fraction", 0.1))
train, test = data[:len(data) - held], data[len(data) - held:]
counts = collections.Counter(train)
unigram = -sum(math.log((counts[b] + 1) / (len(train) + 256)) for b in test) / len(test)
print(f"held-out loss {loss:.4f}, unigram baseline {unigram:.4f} nats (bar {unigram - 0.15:.4f})")
sys.exit(0 if loss < unigram - 0.15 else 1)
PY
