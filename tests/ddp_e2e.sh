#!/usr/bin/env bash
# ddp_e2e.sh <trainrun> <jobs-dir> <work-dir> <test-plugin-dir> <case>
# End-to-end runs of the ddp strategy: 2 ranks launched by trainrun itself on gloo-cpu
# (loopback), compared step by step with a `single` run of the same job (DESIGN invariant 1),
# and the bad-input cases (each a clear error naming the cause, a non-zero exit, no hang).
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 jobs=$2 work=$3 plugins=$4 case=$5
rm -rf "$work" && mkdir -p "$work"

# Every rank writes its metrics, so the comparison holds whether the trainer logs the
# rank-local or the global loss: with equal shards the mean of the ranks' losses is the global
# one either way.
job=$work/job.toml
cat "$jobs/mlp-small.toml" - >"$job" <<'EOF'

[[callbacks]]
plugin = "metrics"
all_ranks = true
EOF

single() {  # single <name> [--set ...]
  local name=$1; shift
  run "$work/$name.log" "$tr" --config "$job" --plugin-path "$plugins" \
    --set trainer.run_dir="$work/$name" "$@"
}
ddp() {  # ddp <name> [--set ...]: 2 ranks, micro-batch 32 (global 64)
  local name=$1; shift
  run "$work/$name.log" "$tr" --config "$job" --plugin-path "$plugins" \
    --set trainer.run_dir="$work/$name" --set strategy.plugin=ddp \
    --set accelerator.plugin=gloo-cpu --set accelerator.timeout_s=60 \
    --set launch.nproc_per_node=2 --set trainer.micro_batch_size=32 "$@"
}
# ddp_fails <regex>... -- [--set ...]: exit code != 0 within 60 s, output matching each regex.
ddp_fails() {
  local res=()
  while [ "$1" != "--" ]; do res+=("$1"); shift; done
  shift
  local log=$work/fail.log rc=0 t0
  t0=$(now)
  timeout 120 "$tr" --config "$job" --plugin-path "$plugins" --set trainer.run_dir="$work/fail" \
    --set strategy.plugin=ddp --set accelerator.plugin=gloo-cpu --set accelerator.timeout_s=60 \
    --set launch.nproc_per_node=2 --set trainer.micro_batch_size=32 "$@" >"$log" 2>&1 || rc=$?
  cat "$log"
  [ "$rc" -ne 0 ] || fail "the run succeeded; expected an error"
  [ "$rc" -ne 124 ] || fail "the run hung (killed after 120 s)"
  [ "$rc" -lt 128 ] || fail "crashed (exit code $rc)"
  for re in "${res[@]}"; do expect_in "$log" "$re"; done
  within 60 "$(elapsed "$t0")" "the error"
  no_leftovers "$work/fail"
}
# compare <reference> <run> <rel. tolerance of losses> [of final weights, default the same]
compare() {
  py - "$work" "$@" <<'PY'
import glob, json, sys
work, ref, run, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
wtol = float(sys.argv[5]) if len(sys.argv) > 5 else tol
def steps(d):
    by_step = {}
    files = sorted(glob.glob(f"{work}/{d}/metrics*.jsonl"))
    assert files, f"no metrics in {work}/{d}"
    for f in files:
        for line in open(f):
            j = json.loads(line)
            if "loss" in j and "step" in j and "eval_loss" not in j:
                by_step.setdefault(j["step"], []).append(j)
    return by_step
a, b = steps(ref), steps(run)
assert len(a) == len(b) == 20, f"{len(a)} and {len(b)} steps"
assert all(len(v) == 2 for v in b.values()), "expected metrics from 2 ranks"
worst = 0.0
for s in sorted(a):
    x = a[s][0]["loss"]
    y = sum(j["loss"] for j in b[s]) / len(b[s])
    rel = abs(x - y) / max(abs(x), 1e-12)
    worst = max(worst, rel)
    assert rel <= tol, f"step {s}: loss {x!r} (single) vs {y!r} (ddp), rel {rel:.2e} > {tol}"
assert a[1][0]["loss"] > a[20][0]["loss"], "the model did not train"
print(f"OK: {run} vs {ref}: worst relative loss difference {worst:.2e} over 20 steps (tolerance {tol})")
# Final weights (the trainer's model.safetensors, where it writes one): same tolerance, per
# tensor relative to its largest entry. Read without numpy: JSON header, then raw float32.
import os, struct
def tensors(d):
    path = f"{work}/{d}/model.safetensors"
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        lo, hi = t["data_offsets"]
        out[name] = struct.unpack(f"<{(hi - lo) // 4}f", data[lo:hi])
    return out
wa, wb = tensors(ref), tensors(run)
if wa is not None and wb is not None:
    assert wa.keys() == wb.keys(), f"tensors differ: {sorted(wa)} vs {sorted(wb)}"
    worst_w, where = 0.0, ""
    for name in wa:
        scale = max(max(abs(v) for v in wa[name]), 1e-12)
        d = max(abs(x - y) for x, y in zip(wa[name], wb[name])) / scale
        if d > worst_w:
            worst_w, where = d, name
    assert worst_w <= wtol, f"final weights: {where} differs by {worst_w:.2e} (relative) > {wtol}"
    print(f"OK: final weights: worst relative difference {worst_w:.2e} ({where or 'none'}, tolerance {wtol})")
last = b[20][0]
if "comm_bytes" in last:
    print("ddp metrics (rank 0, step 20):",
          {k: last[k] for k in ("step_time_s", "comm_bytes", "comm_exposed_s", "buckets",
                                "buckets_overlapped") if k in last})
    assert last["comm_bytes"] > 0 and last["buckets"] >= 1
PY
}

case $case in
  equivalence)  # defaults: 25 MiB buckets, overlap on
    single single
    ddp ddp
    compare single ddp 1e-5
    ;;
  variants)  # small buckets (several all-reduces), overlap off, 2 accumulated micro-batches
    single single
    ddp small-overlap --set strategy.bucket_cap_mb=0.05 --set strategy.first_bucket_mb=0.01
    compare single small-overlap 1e-5
    ddp small-no-overlap --set strategy.bucket_cap_mb=0.05 --set strategy.first_bucket_mb=0.01 \
      --set strategy.overlap=false --set trainer.micro_batch_size=16
    grep -q "micro 16 x accumulation 2" "$work/small-no-overlap.log" || fail "accumulation was not 2"
    compare single small-no-overlap 1e-5
    ;;
  compression)  # 16-bit buckets on the wire: close to single, not equal
    single single
    ddp fp16 --set strategy.gradient_compression=fp16
    compare single fp16 1e-3 1e-2
    ddp bf16 --set strategy.gradient_compression=bf16
    compare single bf16 1e-2 0.2
    ;;
  shape_mismatch)  # (a) rank 1 builds a wider layer
    ddp_fails "strategy 'ddp': parameter 'fc1\.weight' \(index 2\) differs across ranks: rank 0 has \[64, 64\] float32, rank 1 has \[65, 64\] float32" \
      -- --set model.plugin=ddp-test-mlp --set model.rank_dependent_width=true
    ;;
  unused_error)  # (b) a layer forward never uses, without find_unused_parameters
    ddp_fails "strategy 'ddp': parameters that received no gradient this step: head2\.weight, head2\.bias" \
      "Set \[strategy\] find_unused_parameters = true" \
      -- --set model.plugin=ddp-test-mlp --set model.unused_layer=true
    ;;
  unused_ok)  # (c) the same with the option, plus a layer used on some ranks only
    model=(--set model.plugin=ddp-test-mlp --set model.unused_layer=true --set model.gate_threshold=0.85)
    single single "${model[@]}"
    ddp ddp "${model[@]}" --set strategy.find_unused_parameters=true
    compare single ddp 1e-5
    # The gate's three cases all occurred: used on one rank only, on neither, on both.
    g0=$(sed -n 's/.*ddp-test-mlp rank 0 gate usage: \([01]*\).*/\1/p' "$work/ddp.log")
    g1=$(sed -n 's/.*ddp-test-mlp rank 1 gate usage: \([01]*\).*/\1/p' "$work/ddp.log")
    [ ${#g0} -eq 20 ] && [ ${#g1} -eq 20 ] || fail "no gate usage report from both ranks"
    py -c "import sys; a, b = sys.argv[1:]; k = [x + y for x, y in zip(a, b)]; \
print('gate used per step (rank 0, rank 1):', ' '.join(k)); \
assert '01' in k or '10' in k, 'never used on one rank only'; \
assert '00' in k and '11' in k, 'not all cases'" "$g0" "$g1"
    ;;
  *) fail "unknown case $case" ;;
esac
