#!/usr/bin/env bash
# End-to-end cases of the sharded strategies (zero, fsdp) on the equivalence gpt, launched by
# trainrun itself on gloo-cpu over loopback:
#   state_dict  fsdp at world 2 writes the full state dict (model.safetensors, named like the
#               unwrapped model); `single` started from it ([trainer] init_weights, lr 0) gets the
#               same evaluation loss (within 1e-6).
#   bad_input   a shard group that does not divide the world, a zero stage out of range, and an
#               init_weights file that lacks a tensor, is missing or is a directory: each a clear
#               error naming the key, exit code 2, no hang.
#   auto        stage / sharding_strategy "auto" pick by the memory budget and say why; a budget
#               nothing fits names the smallest world size that would.
#   sharded_state  state_dict_type = "sharded" (each rank its pieces, no gather) under fsdp
#               FULL_SHARD and HYBRID_SHARD at world 4, zero stage 2 at world 2, and fsdp with
#               frozen parameters (sharded as raw bytes) at world 2: the pieces of
#               all ranks rebuild the full state dict of the same run bitwise, each element once.
#   checkpointing  activation checkpointing under zero stage 3 and fsdp FULL_SHARD at world 2
#               (the recomputation runs on parameters gathered by the pre-backward hook)
#               reproduces the single-process run within 1e-5.
#   mixed_precision  fsdp param_dtype = bf16 (FULL_SHARD, SHARD_GRAD_OP with reduce_dtype fp32,
#               NO_SHARD, HYBRID_SHARD 2x2) follows the float32 run within 1%, gathers and
#               reduces half the bytes, saves float32 weights; fp16 on CPU is a clear error.
#   hybrid      fsdp HYBRID_SHARD over two launcher agents acting as two nodes x 2 ranks (the
#               node is the shard group) reproduces the single-process losses.
#   usage: sharded_e2e.sh TRAINRUN JOB WORK CASE
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 job=$2 work=$3 case=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
common=(--config "$job" --set trainer.eval_max_batches=0 --set accelerator.timeout_s=60)
eval_loss() { py -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if 'eval_loss' in l][-1]['eval_loss'])" "$1/metrics.jsonl"; }
fails() {  # fails <log> <regex> -- args...: exit code 2 within 120 s, the message in the output
  local log=$1 re=$2 rc=0; shift 3
  timeout 120 "$tr" "$@" >"$log" 2>&1 || rc=$?
  cat "$log"
  expect_rc 2 "$rc"
  expect_in "$log" "$re"
}

case $case in
  state_dict)
    run "$work/fsdp.log" "$tr" "${common[@]}" --set strategy.plugin=fsdp --set launch.nproc_per_node=2 \
      --set trainer.run_dir="$work/fsdp"
    run "$work/single.log" "$tr" "${common[@]}" --set strategy.plugin=single --set accelerator.plugin=cpu \
      --set trainer.init_weights="$work/fsdp/model.safetensors" --set trainer.max_steps=1 \
      --set optimizer.lr=0 --set trainer.run_dir="$work/single"
    a=$(eval_loss "$work/fsdp") b=$(eval_loss "$work/single")
    echo "evaluation loss: fsdp world 2 $a, single from its state dict $b"
    py -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-6 * abs(a) else 1)" "$a" "$b" \
      || fail "evaluation losses differ: $a vs $b"
    ;;
  bad_input)
    fails "$work/group.log" "shard_group_size = 3 does not divide world_size 4" -- "${common[@]}" \
      --set strategy.plugin=fsdp --set strategy.sharding_strategy=HYBRID_SHARD \
      --set strategy.shard_group_size=3 --set launch.nproc_per_node=4 --set trainer.run_dir="$work/g"
    fails "$work/stage.log" "\\[strategy\\] stage: 4 is out of range \\[1, 3\\]" -- "${common[@]}" --set strategy.plugin=zero \
      --set strategy.stage=4 --set trainer.run_dir="$work/s"
    run "$work/ref.log" "$tr" "${common[@]}" --set strategy.plugin=single --set accelerator.plugin=cpu \
      --set trainer.max_steps=1 --set trainer.run_dir="$work/ref"
    py - "$work/ref/model.safetensors" "$work/partial.safetensors" <<'PY'
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + n])
header.pop("ln_f.weight")  # drop one tensor from the header: the data stays, the name is gone
h = json.dumps(header).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + blob[8 + n:])
PY
    fails "$work/init.log" "init_weights = .*partial.safetensors.*no tensor 'ln_f.weight'" -- "${common[@]}" \
      --set strategy.plugin=single --set accelerator.plugin=cpu \
      --set trainer.init_weights="$work/partial.safetensors" --set trainer.run_dir="$work/i"
    fails "$work/missing.log" "init_weights = \"$work/nope.safetensors\": no such file" -- "${common[@]}" \
      --set strategy.plugin=single --set accelerator.plugin=cpu \
      --set trainer.init_weights="$work/nope.safetensors" --set trainer.run_dir="$work/m"
    fails "$work/dir.log" "init_weights = \"$work\": is a directory" -- "${common[@]}" \
      --set strategy.plugin=single --set accelerator.plugin=cpu \
      --set trainer.init_weights="$work" --set trainer.run_dir="$work/d"
    ;;
  auto)
    # The equivalence gpt: 33952 parameters, AdamW fp32: model state 531 KiB at stage 0; with
    # buckets of 5000 elements and no persistent parameters, at world 2 stage 1 needs 398 KiB and
    # stage 2 351 KiB (+20 KB bucket), so a budget of 370 kB is stage 2.
    zero_auto=(--set strategy.plugin=zero --set strategy.stage=auto --set strategy.reduce_bucket_size=5000
               --set strategy.param_persistence_threshold=0)
    run "$work/z.log" "$tr" "${common[@]}" "${zero_auto[@]}" --set strategy.memory_budget_gb=0.00037 \
      --set launch.nproc_per_node=2 --set trainer.max_steps=2 --set trainer.run_dir="$work/z"
    expect_in "$work/z.log" "stage 2 chosen: .* per rank fits the budget of 361 KiB \\(stage 1 needs"
    run "$work/f.log" "$tr" "${common[@]}" --set strategy.plugin=fsdp --set strategy.sharding_strategy=auto \
      --set strategy.memory_budget_gb=0.00037 --set launch.nproc_per_node=2 --set trainer.max_steps=2 \
      --set trainer.run_dir="$work/f"
    expect_in "$work/f.log" "SHARD_GRAD_OP chosen: estimate .* fits the budget of 361 KiB \\(NO_SHARD needs"
    fails "$work/none.log" "no stage fits the memory budget of 97.7 KiB per rank: stage 3 needs .* at world size 2; a world size of at least [0-9]+ would fit" -- \
      "${common[@]}" "${zero_auto[@]}" --set strategy.prefetch_bucket_size=0 --set strategy.memory_budget_gb=0.0001 \
      --set launch.nproc_per_node=2 --set trainer.run_dir="$work/n"
    ;;
  sharded_state)
    for cell in "fsdp 4 --set strategy.sharding_strategy=FULL_SHARD" \
                "fsdp 4 --set strategy.sharding_strategy=HYBRID_SHARD --set strategy.shard_group_size=2" \
                "zero 2 --set strategy.stage=2 --set strategy.reduce_bucket_size=5000" \
                'fsdp 2 --set trainer.freeze=["blocks.1.*","blocks.0.attn.*"]'; do
      read -r -a c <<<"$cell"
      name="${c[0]}-${c[1]}-$(echo "${c[*]}" | md5sum | cut -c1-6)"
      for type in full sharded; do
        run "$work/$name-$type.log" "$tr" "${common[@]}" --set strategy.plugin="${c[0]}" "${c[@]:2}" \
          --set launch.nproc_per_node="${c[1]}" --set trainer.max_steps=3 \
          --set trainer.state_dict_type=$type --set trainer.run_dir="$work/$name-$type"
      done
      [ ! -e "$work/$name-sharded/model.safetensors" ] || fail "$name: sharded run also wrote the full model"
      py "$here/sharded_state_check.py" "$work/$name-sharded/model-shards" "$work/$name-full/model.safetensors" \
        || fail "$cell: the pieces do not rebuild the full state dict"
    done
    ;;
  checkpointing)
    run "$work/ref.log" "$tr" "${common[@]}" --set strategy.plugin=single --set accelerator.plugin=cpu \
      --set trainer.run_dir="$work/ref"
    for s in zero fsdp; do
      run "$work/$s.log" "$tr" "${common[@]}" --set strategy.plugin=$s --set trainer.activation_checkpointing=true \
        --set launch.nproc_per_node=2 --set trainer.run_dir="$work/$s" \
        $([ $s = zero ] && echo --set strategy.stage=3 --set strategy.param_persistence_threshold=100)
      py "$here/compare_runs.py" "$work/ref" "$work/$s" --rtol 1e-5 --label "$s + checkpointing"
    done
    ;;
  hybrid)
    port=$(free_port)
    run "$work/ref.log" "$tr" "${common[@]}" --set strategy.plugin=single --set accelerator.plugin=cpu \
      --set trainer.run_dir="$work/ref"
    both=("${common[@]}" --set strategy.plugin=fsdp --set strategy.sharding_strategy=HYBRID_SHARD
          --set launch.nproc_per_node=2 --set launch.nnodes=2 --set launch.master_addr=127.0.0.1
          --set launch.master_port="$port")
    rc1=0
    timeout 200 "$tr" "${both[@]}" --set launch.node_rank=1 --set trainer.run_dir="$work/node1" \
      >"$work/node1.log" 2>&1 &
    pid1=$!
    rc0=0
    timeout 200 "$tr" "${both[@]}" --set launch.node_rank=0 --set trainer.run_dir="$work/hybrid" \
      >"$work/node0.log" 2>&1 || rc0=$?
    wait $pid1 || rc1=$?
    [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || { cat "$work/node0.log" "$work/node1.log"; fail "exit codes $rc0 / $rc1"; }
    py "$here/compare_runs.py" "$work/ref" "$work/hybrid" --rtol 1e-5 --label "HYBRID_SHARD 2 nodes x 2"
    ;;
  mixed_precision)
    # float32 FULL_SHARD is the reference (every fp32 sharding strategy reproduces it within 1e-5).
    fsdp=(--set strategy.plugin=fsdp --set launch.nproc_per_node=2)
    run "$work/fp32.log" "$tr" "${common[@]}" "${fsdp[@]}" --set trainer.run_dir="$work/fp32"
    run "$work/bf16.log" "$tr" "${common[@]}" "${fsdp[@]}" --set strategy.param_dtype=bf16 \
      --set trainer.run_dir="$work/bf16"
    expect_in "$work/bf16.log" "parameters in bf16, gradients reduced in bf16"
    # bf16 gathers and reduce-scatters: half the bytes of gathered parameters and on the wire.
    py "$here/fsdp_mixed_check.py" "$work/fp32" "$work/bf16" "FULL_SHARD bf16" --gather-ratio 0.5 --comm-ratio 0.5
    run "$work/grad_op.log" "$tr" "${common[@]}" "${fsdp[@]}" --set strategy.param_dtype=bf16 \
      --set strategy.reduce_dtype=fp32 --set strategy.sharding_strategy=SHARD_GRAD_OP \
      --set trainer.run_dir="$work/grad_op"
    py "$here/fsdp_mixed_check.py" "$work/fp32" "$work/grad_op" "SHARD_GRAD_OP bf16, fp32 reduce" --gather-ratio 0.5
    run "$work/no_shard.log" "$tr" "${common[@]}" "${fsdp[@]}" --set strategy.param_dtype=bf16 \
      --set strategy.sharding_strategy=NO_SHARD --set trainer.run_dir="$work/no_shard"
    py "$here/fsdp_mixed_check.py" "$work/fp32" "$work/no_shard" "NO_SHARD bf16"
    run "$work/hybrid.log" "$tr" "${common[@]}" --set strategy.plugin=fsdp --set launch.nproc_per_node=4 \
      --set strategy.sharding_strategy=HYBRID_SHARD --set strategy.shard_group_size=2 \
      --set strategy.param_dtype=bf16 --set trainer.run_dir="$work/hybrid"
    py "$here/fsdp_mixed_check.py" "$work/fp32" "$work/hybrid" "HYBRID_SHARD 2x2 bf16"
    fails "$work/fp16.log" "param_dtype = \"fp16\": float16 compute is not implemented on CPU" -- \
      "${common[@]}" "${fsdp[@]}" --set strategy.param_dtype=fp16 --set trainer.run_dir="$work/f"
    ;;
  *) fail "unknown case $case" ;;
esac
echo "ok: $case"
