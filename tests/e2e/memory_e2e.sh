#!/usr/bin/env bash
# memory_e2e.sh <trainrun> <jobs-dir> <gpt-job> <work-dir> <case>
# The CPU memory tracker seen from metrics.jsonl, and the ZeRO table of `trainrun check`:
#   single  mlp-memory under `single`: mem_* fields on every step; the model state (bytes held
#           after the optimizer step, before zero_grad, minus what was held before the model
#           was built) is 16 bytes x parameters (fp32 weights 4 + gradients 4 + AdamW 8) +-5%
#   ddp     the same on each of 2 ranks of ddp over gloo-cpu (gradients live in ddp's buckets,
#           as views, so still 16 bytes per parameter)
#   check   `trainrun check` on the gpt job at 4 ranks prints the table: stage 0 = 16 x Psi,
#           stage 3 = stage 0 / 4
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 jobs=$2 gpt=$3 work=$4 case=$5
rm -rf "$work" && mkdir -p "$work"

# check_metrics <run log> <metrics file>...: the fields, and model state vs 16 x parameters.
check_metrics() {
  local log=$1; shift
  local params
  params=$(sed -n 's/.* \([0-9][0-9]*\) parameters, .*/\1/p' "$log" | head -n 1)
  [ -n "$params" ] || fail "no parameter count in $log"
  py - "$params" "$@" <<'PY'
import json, sys
params = int(sys.argv[1])
expected = 16 * params
for path in sys.argv[2:]:
    steps = [json.loads(l) for l in open(path) if '"loss"' in l and '"eval_loss"' not in l]
    assert len(steps) == 3, f"{path}: {len(steps)} steps"
    for m in steps:
        for k in ("mem_peak_bytes", "mem_current_bytes", "mem_model_state_bytes"):
            assert k in m, f"{path}: step {m['step']} has no {k}: {sorted(m)}"
        assert m["mem_peak_bytes"] >= m["mem_current_bytes"] > 0, m
        assert m["mem_peak_bytes"] >= m["mem_model_state_bytes"], m
    for m in steps[1:]:  # from step 2 on: Adam's state exists, buckets are final
        got = m["mem_model_state_bytes"]
        rel = got / expected - 1
        print(f"{path} step {m['step']}: model state {got:.0f} B = {got / params:.3f} B/param, "
              f"16 x {params} = {expected} ({100 * rel:+.2f}%); peak {m['mem_peak_bytes']:.0f} B, "
              f"current {m['mem_current_bytes']:.0f} B")
        assert abs(rel) <= 0.05, f"{path}: model state {got} is not 16 x {params} within 5%"
PY
}

case $case in
  single)
    run "$work/single.log" "$tr" --config "$jobs/mlp-memory.toml" --set trainer.run_dir="$work/single"
    check_metrics "$work/single.log" "$work/single/metrics-rank-0.jsonl" || fail "metrics"
    ;;
  ddp)
    run "$work/ddp.log" "$tr" --config "$jobs/mlp-memory.toml" --set trainer.run_dir="$work/ddp" \
      --set strategy.plugin=ddp --set accelerator.plugin=gloo-cpu --set accelerator.timeout_s=60 \
      --set launch.nproc_per_node=2
    check_metrics "$work/ddp.log" "$work/ddp/metrics-rank-0.jsonl" "$work/ddp/metrics-rank-1.jsonl" \
      || fail "metrics"
    ;;
  check)
    t0=$(now)
    run "$work/check.log" "$tr" check --config "$gpt" --nproc-per-node 4 --set trainer.micro_batch_size=8
    within 60 "$(elapsed "$t0")" "trainrun check with the memory estimate"
    expect_in "$work/check.log" "^# memory estimate \(ZeRO stages 0-3\)$"
    py - "$work/check.log" <<'PY' || fail "the memory table"
import re, sys
text = open(sys.argv[1]).read()
section = text.split("# memory estimate (ZeRO stages 0-3)\n", 1)[1]
psi = int(re.search(r"model gpt: (\d+) trainable parameters", section).group(1))
assert re.search(r"world 4 = 1 node\(s\) x 4 process\(es\)", section), section
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def size(cell):
    v, u = cell.split()
    return float(v) * units[u]
state = {}
for line in section.splitlines():
    m = re.match(r"#   ([0-3]) \([a-z+]+\)\s+(.*)$", line)
    if m:
        cells = re.split(r"\s{2,}", m.group(2).strip())
        state[int(m.group(1))] = size(cells[4])  # params, grads, optimizer, buffers, model state
assert sorted(state) == [0, 1, 2, 3], state
print(f"psi {psi}; model state per rank: " + ", ".join(f"stage {s} {state[s]:.0f} B" for s in range(4)))
assert abs(state[0] / (16 * psi) - 1) < 0.01, "stage 0 is not 16 bytes x Psi (fp32 AdamW)"
assert state[3] < state[2] < state[1] < state[0]
assert abs(state[0] / state[3] - 4) < 0.05, f"stage 0 / stage 3 = {state[0] / state[3]}, not 4"
# stage 1 = (4 + 4 + 8/4) Psi, stage 2 = (4 + 12/4) Psi
assert abs(state[1] / (10 * psi) - 1) < 0.01 and abs(state[2] / (7 * psi) - 1) < 0.01
PY
    ;;
  *) fail "unknown case $case" ;;
esac
echo "PASS $case"
