#!/usr/bin/env bash
# ring_e2e.sh <trainrun> <jobs-dir> <work-dir> <test-plugin-dir> <case> [<gpt job>]
# End-to-end runs of the `ring` strategy launched by trainrun itself on gloo-cpu (loopback):
# against `single` (docs/design.md, invariant 1) with and without fusion, accumulation, compression,
# op = sum, hierarchical over two launcher agents acting as two nodes, the bad-input cases (each
# a clear error naming the cause, a non-zero exit, no hang) and the timeline of a 2-rank gpt run.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 jobs=$2 work=$3 plugins=$4 case=$5 gpt_job=${6:-}
here=$(cd "$(dirname "$0")" && pwd)
strategy=ring
source "$here/dp_e2e_lib.sh"
ring() { dp_run "$@"; }
ring_fails() { dp_fails "$@"; }
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
    ring fp16 --set strategy.gradient_compression=fp16
    compare single fp16 1e-3 1e-2
    metrics fp16 "m['comm_bytes'] == 203560 // 2"
    # The option's old name still works, with a warning, and does the same.
    ring fp16old --set strategy.compression=fp16
    grep -q "option 'compression' is deprecated" "$work/fp16old.log" || fail "no deprecation warning"
    metrics fp16old "m['comm_bytes'] == 203560 // 2"
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
