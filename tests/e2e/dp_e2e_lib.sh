# Shared by the end-to-end scripts of the replicating strategies (ddp_e2e.sh, ring_e2e.sh):
# set tr, jobs, work, plugins and strategy, then source this file. Gives the job (mlp-small with
# every rank's metrics), `single`, `dp_run` (2 ranks of $strategy), `dp_fails` and `compare`.
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
dp_run() {  # dp_run <name> [--set ...]: 2 ranks of $strategy, micro-batch 32 (global 64)
  local name=$1; shift
  run "$work/$name.log" "$tr" --config "$job" --plugin-path "$plugins" \
    --set trainer.run_dir="$work/$name" --set strategy.plugin="$strategy" \
    --set accelerator.plugin=gloo-cpu --set accelerator.timeout_s=60 \
    --set launch.nproc_per_node=2 --set trainer.micro_batch_size=32 "$@"
}
# dp_fails <regex>... -- [--set ...]: exit code != 0 within 60 s, output matching each regex.
dp_fails() {
  local res=()
  while [ "$1" != "--" ]; do res+=("$1"); shift; done
  shift
  local log=$work/fail.log rc=0 t0
  t0=$(now)
  timeout 120 "$tr" --config "$job" --plugin-path "$plugins" --set trainer.run_dir="$work/fail" \
    --set strategy.plugin="$strategy" --set accelerator.plugin=gloo-cpu --set accelerator.timeout_s=60 \
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
  py - "$work" "$strategy" "$@" <<'PY'
import glob, json, sys
work, strategy, ref, run, tol = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
wtol = float(sys.argv[6]) if len(sys.argv) > 6 else tol
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
ranks = len(b[1])
assert ranks >= 2 and all(len(v) == ranks for v in b.values()), "expected every rank's metrics at every step"
worst = 0.0
for s in sorted(a):
    x = a[s][0]["loss"]
    y = sum(j["loss"] for j in b[s]) / len(b[s])
    rel = abs(x - y) / max(abs(x), 1e-12)
    worst = max(worst, rel)
    assert rel <= tol, f"step {s}: loss {x!r} (single) vs {y!r} ({strategy}), rel {rel:.2e} > {tol}"
assert a[1][0]["loss"] > a[20][0]["loss"], "the model did not train"
print(f"OK: {run} vs {ref}: worst relative loss difference {worst:.2e} over 20 steps (tolerance {tol})")
# Final weights (every run writes model.safetensors): same tolerance, per tensor relative to its
# largest entry. Read without numpy: JSON header, then raw float32; any other dtype or a missing
# file fails rather than leaving tensors out of the comparison.
import os, struct
def tensors(d):
    path = f"{work}/{d}/model.safetensors"
    assert os.path.exists(path), f"{path} is missing"
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", f"{path}: {name} is {t['dtype']}, expected F32"
        lo, hi = t["data_offsets"]
        out[name] = struct.unpack(f"<{(hi - lo) // 4}f", data[lo:hi])
    return out
wa, wb = tensors(ref), tensors(run)
assert wa and wa.keys() == wb.keys(), f"tensors differ: {sorted(wa)} vs {sorted(wb)}"
worst_w, where = 0.0, ""
for name in wa:
    assert len(wa[name]) == len(wb[name]), f"{name}: {len(wb[name])} elements vs {len(wa[name])}"
    scale = max(max(abs(v) for v in wa[name]), 1e-12)
    d = max(abs(x - y) for x, y in zip(wa[name], wb[name])) / scale
    if d > worst_w:
        worst_w, where = d, name
assert worst_w <= wtol, f"final weights: {where} differs by {worst_w:.2e} (relative) > {wtol}"
print(f"OK: final weights: worst relative difference {worst_w:.2e} ({where or 'none'}, tolerance {wtol})")
last = b[20][0]
# A data-parallel run communicates every step and says how much.
assert "comm_bytes" in last, f"{strategy}: step 20 does not log comm_bytes"
print(f"{strategy} metrics (rank 0, step 20):",
      {k: last[k] for k in ("step_time_s", "comm_bytes", "comm_exposed_s", "buckets",
                            "buckets_overlapped", "fused_buffers", "negotiation_rounds")
       if k in last})
assert last["comm_bytes"] > 0 and last.get("buckets", 1) >= 1
PY
}
