#!/usr/bin/env bash
# ring_e2e.sh <trainrun> <jobs-dir> <work-dir> <test-plugin-dir> <case> [<gpt job>]
# End-to-end runs of the `ring` strategy launched by trainrun itself on gloo-cpu (loopback):
# against `single` (DESIGN invariant 1) with and without fusion, accumulation, compression,
# op = sum, hierarchical over two launcher agents acting as two nodes, the bad-input cases (each
# a clear error naming the cause, a non-zero exit, no hang) and the timeline of a 2-rank gpt run.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 jobs=$2 work=$3 plugins=$4 case=$5 gpt_job=${6:-}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"

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
ring() {  # ring <name> [--set ...]: 2 ranks, micro-batch 32 (global 64)
  local name=$1; shift
  run "$work/$name.log" "$tr" --config "$job" --plugin-path "$plugins" \
    --set trainer.run_dir="$work/$name" --set strategy.plugin=ring \
    --set accelerator.plugin=gloo-cpu --set accelerator.timeout_s=60 \
    --set launch.nproc_per_node=2 --set trainer.micro_batch_size=32 "$@"
}
# ring_fails <regex>... -- [--set ...]: exit code != 0 within 60 s, output matching each regex.
ring_fails() {
  local res=()
  while [ "$1" != "--" ]; do res+=("$1"); shift; done
  shift
  local log=$work/fail.log rc=0 t0
  t0=$(now)
  timeout 120 "$tr" --config "$job" --plugin-path "$plugins" --set trainer.run_dir="$work/fail" \
    --set strategy.plugin=ring --set accelerator.plugin=gloo-cpu --set accelerator.timeout_s=60 \
    --set launch.nproc_per_node=2 --set trainer.micro_batch_size=32 "$@" >"$log" 2>&1 || rc=$?
  cat "$log"
  [ "$rc" -ne 0 ] || fail "the run succeeded; expected an error"
  [ "$rc" -ne 124 ] || fail "the run hung (killed after 120 s)"
  [ "$rc" -lt 128 ] || fail "crashed (exit code $rc)"
  for re in "${res[@]}"; do expect_in "$log" "$re"; done
  within 60 "$(elapsed "$t0")" "the error"
  no_leftovers "$work/fail"
}
# compare <reference> <run> <rel. tolerance of losses> [of final weights]: per-step losses of
# every rank's metrics file (their mean is the global loss) and the final weights.
compare() {
  py - "$work" "$@" <<'PY'
import glob, json, os, struct, sys
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
worst = 0.0
for s in sorted(a):
    x = a[s][0]["loss"]
    y = sum(j["loss"] for j in b[s]) / len(b[s])
    rel = abs(x - y) / max(abs(x), 1e-12)
    worst = max(worst, rel)
    assert rel <= tol, f"step {s}: loss {x!r} (single) vs {y!r} (ring), rel {rel:.2e} > {tol}"
assert a[1][0]["loss"] > a[20][0]["loss"], "the model did not train"
print(f"OK: {run} vs {ref}: worst relative loss difference {worst:.2e} over 20 steps (tolerance {tol})")
def tensors(d):
    path = f"{work}/{d}/model.safetensors"
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {name: struct.unpack(f"<{(t['data_offsets'][1] - t['data_offsets'][0]) // 4}f",
                                data[t["data_offsets"][0]:t["data_offsets"][1]])
            for name, t in header.items() if name != "__metadata__" and t["dtype"] == "F32"}
wa, wb = tensors(ref), tensors(run)
if wa is not None and wb is not None:
    worst_w, where = 0.0, ""
    for name in wa:
        scale = max(max(abs(v) for v in wa[name]), 1e-12)
        d = max(abs(x - y) for x, y in zip(wa[name], wb[name])) / scale
        if d > worst_w:
            worst_w, where = d, name
    assert worst_w <= wtol, f"final weights: {where} differs by {worst_w:.2e} (relative) > {wtol}"
    print(f"OK: final weights: worst relative difference {worst_w:.2e} ({where or 'none'}, tolerance {wtol})")
PY
}
# metrics <run> <python condition on m (rank 0's last step)>: e.g. "m['fused_buffers'] == 1".
metrics() {
  py - "$work/$1" "$2" <<'PY'
import glob, json, sys
rows = [json.loads(l) for l in open(sorted(glob.glob(f"{sys.argv[1]}/metrics*rank-0.jsonl"))[0])]
m = [r for r in rows if "loss" in r and "eval_loss" not in r][-1]
keys = ("step_time_s", "comm_bytes", "comm_exposed_s", "fused_buffers",
        "fused_buffers_in_backward", "negotiation_rounds", "negotiation_s")
print("ring metrics (rank 0, last step):", {k: m.get(k) for k in keys})
assert eval(sys.argv[2]), f"metrics do not satisfy: {sys.argv[2]}"
PY
}

case $case in
  equivalence)  # defaults (one 128 MiB fusion buffer), then fusion off (one all-reduce per tensor)
    single single
    ring ring
    compare single ring 1e-5
    # mlp [64] on 28x28 inputs: 4 tensors, 50890 float32 = 203560 bytes. Each round fuses what
    # it agreed into one buffer, so there are at most as many buffers as rounds, and fewer than
    # tensors unless every tensor was agreed in a round of its own.
    metrics ring "m['comm_bytes'] == 203560 and 1 <= m['fused_buffers'] <= min(4, m['negotiation_rounds'])"
    ring nofusion --set strategy.fusion_threshold_mb=0
    compare single nofusion 1e-5
    metrics nofusion "m['fused_buffers'] == 4 and m['comm_bytes'] == 203560"
    ;;
  variants)  # 2 accumulated micro-batches; busy cycling (cycle 0); small ring chunks
    single single
    ring acc2 --set trainer.micro_batch_size=16 --set strategy.cycle_time_ms=0 --set strategy.chunk_kb=4
    grep -q "micro 16 x accumulation 2" "$work/acc2.log" || fail "accumulation was not 2"
    compare single acc2 1e-5
    # op = sum: gradients x world size, so half the learning rate reproduces the average.
    ring sum --set strategy.op=sum --set optimizer.lr=0.025
    compare single sum 1e-5
    ;;
  compression)  # 16-bit buffers on the wire: close to single, not equal
    single single
    ring fp16 --set strategy.compression=fp16
    compare single fp16 1e-3 1e-2
    metrics fp16 "m['comm_bytes'] == 203560 // 2"
    ring bf16 --set strategy.compression=bf16
    compare single bf16 1e-2 0.2
    ;;
  hierarchical)  # world 4 as 2 nodes x 2 ranks: two launcher agents on loopback, fixed port
    single single
    port=$(free_port)
    common=(--config "$job" --plugin-path "$plugins" --set strategy.plugin=ring
            --set strategy.hierarchical=true --set strategy.timeline=timeline.json
            --set accelerator.plugin=gloo-cpu --set accelerator.timeout_s=60
            --set launch.nproc_per_node=2 --set launch.nnodes=2 --set launch.master_addr=127.0.0.1
            --set launch.master_port="$port" --set trainer.micro_batch_size=16)
    rc1=0
    timeout 250 "$tr" "${common[@]}" --set launch.node_rank=1 --set trainer.run_dir="$work/hier-node1" \
      >"$work/hier-node1.log" 2>&1 &
    pid1=$!
    rc0=0
    timeout 250 "$tr" "${common[@]}" --set launch.node_rank=0 --set trainer.run_dir="$work/hier" \
      >"$work/hier.log" 2>&1 || rc0=$?
    wait $pid1 || rc1=$?
    cat "$work/hier.log"
    [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || { cat "$work/hier-node1.log"; fail "exit codes $rc0 (node 0), $rc1 (node 1)"; }
    compare single hier 1e-5
    # The hierarchy was used (the timeline records it), on every rank of both nodes.
    for f in "$work"/hier/timeline-rank-0.json "$work"/hier/timeline-rank-1.json \
             "$work"/hier-node1/timeline-rank-2.json "$work"/hier-node1/timeline-rank-3.json; do
      py -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['otherData']['hierarchical'] is True, sys.argv[1]" "$f" \
        || fail "$f: hierarchical all-reduce not in use"
    done
    echo "OK: hierarchical all-reduce on 2 nodes x 2 ranks"
    ;;
  shape_mismatch)  # rank 1 builds a wider layer
    ring_fails "strategy 'ring': parameter 'fc1\.weight' \(index 2\) differs across ranks: rank 0 has \[64, 64\] float32, rank 1 has \[65, 64\] float32" \
      -- --set model.plugin=ddp-test-mlp --set model.rank_dependent_width=true
    ;;
  unused_error)  # a layer forward never uses, without find_unused_parameters
    ring_fails "strategy 'ring': parameters that received no gradient this step on rank [01]: head2\.weight, head2\.bias" \
      "Set \[strategy\] find_unused_parameters = true" \
      -- --set model.plugin=ddp-test-mlp --set model.unused_layer=true
    ;;
  stall)  # rank 1 sleeps 60 s before its third backward: rank 0 waits one collective timeout
    # (5 s), then fails naming the tensors still pending; the launcher stops rank 1
    ring_fails "strategy 'ring': rank 0: negotiation round [0-9]+ of step 3 failed: .*Tensors not yet reduced: .*fc0\.weight" \
      -- --set model.plugin=ddp-test-mlp --set model.stall_rank=1 --set model.stall_s=60 \
      --set accelerator.timeout_s=5
    ;;
  unused_ok)  # the same with the option, plus a layer used on some ranks only: the ranks'
    # gradients become ready in different sets and orders, and the negotiation still agrees
    model=(--set model.plugin=ddp-test-mlp --set model.unused_layer=true --set model.gate_threshold=0.85)
    single single "${model[@]}"
    ring ring "${model[@]}" --set strategy.find_unused_parameters=true --set strategy.fusion_threshold_mb=0.01
    compare single ring 1e-5
    ;;
  timeline)  # a 2-rank gpt run with a timeline: Chrome trace schema, every tensor every phase
    steps=5
    run "$work/gpt.log" "$tr" --config "$gpt_job" --set strategy.plugin=ring \
      --set strategy.timeline=trace/timeline.json --set launch.nproc_per_node=2 \
      --set trainer.max_steps=$steps --set trainer.micro_batch_size=16 \
      --set accelerator.timeout_s=60 --set trainer.run_dir="$work/gpt"
    py "$here/ring_timeline_check.py" "$work"/gpt/trace/timeline-rank-0.json \
      "$work"/gpt/trace/timeline-rank-1.json --world 2 --steps $steps
    if ls "$work"/gpt/trace/*.tmp 2>/dev/null; then fail "temporary timeline files left behind"; fi
    ;;
  *) fail "unknown case $case" ;;
esac
