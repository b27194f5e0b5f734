#!/usr/bin/env bash
# Several hosts with their own addresses (network namespaces joined by a bridge, tests/netns_lib.sh),
# each running trainrun's own node agent, as on a cluster. One case per CTest entry:
#   cluster_e2e.sh <trainrun> <equivalence jobs dir> <work dir> <case>
# Equivalence (the job of tests/equivalence, compared with tests/compare_runs.py at 1e-5 with
# the single-process run): ddp (2 hosts x 2 ranks, mlp, SGD), ddp3 (3 hosts x 2 ranks),
# fsdp_hybrid (gpt, AdamW, HYBRID_SHARD with the node as the shard group), mpi (MPICH's hydra
# started on host 1, its proxies on every host through `ip netns exec`), pytorchjob (each host
# gets exactly the environment of a Kubeflow PyTorchJob pod, examples/kubernetes/pytorchjob.yaml).
# Faults (a long run, then): link_cut, host_killed, host_missing, master_dies, slow_link;
# each asserts the time to a clean end, the host/rank named, and nothing left behind.
source "$(dirname "$0")/e2e_lib.sh"
source "$(dirname "$0")/netns_lib.sh"
tr=$1 jobs=$2 work=$3 case=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
if ! "$tr" plugins gloo-cpu >/dev/null 2>&1; then echo "SKIP: no gloo-cpu accelerator plugin in this build"; exit 77; fi
netns_require
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
master=$(host_addr 1)
port=29500  # inside this test's own namespaces: nothing else listens there
run_dir=$work/run-$case-$$  # unique: finds this test's processes with pgrep -f
sgd=(--set optimizer.plugin=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9)
adamw=(--set optimizer.plugin=adamw --set optimizer.lr=0.002 --set optimizer.weight_decay=0.01)

# reference <job> <global batch> <optimizer args...>: the single-process run, in $work/ref.
reference() {
  local job=$1 g=$2; shift 2
  quiet_run "$work/ref.log" "$tr" --config "$job" "$@" --set strategy.plugin=single \
    --set accelerator.plugin=cpu --set trainer.global_batch_size="$g" \
    --set trainer.micro_batch_size="$g" --set trainer.run_dir="$work/ref"
}
# nodes <hosts> <args...>: trainrun on hosts 1..N as nodes 0..N-1 (host 1 serves the store),
# output in $work/nodeK; waits for all and fails unless every node exits 0.
nodes() {
  local n=$1 i rc=0; shift
  local pids=()
  for i in $(seq "$n" -1 1); do  # the others first: they must wait for node 0's store
    on_host "$i" "$tr" "$@" --nnodes "$n" --node-rank $((i - 1)) --master-addr "$master" \
      --master-port "$port" >"$work/node$((i - 1))" 2>&1 &
    pids[$i]=$!
  done
  for i in $(seq 1 "$n"); do
    wait "${pids[$i]}" || { rc=$?; echo "node $((i - 1)) exited with code $rc"; }
  done
  if [ "$rc" -ne 0 ]; then
    for i in $(seq 1 "$n"); do echo "--- node $((i - 1))"; cat "$work/node$((i - 1))"; done
    fail "a node failed"
  fi
}
compare() { py "$here/compare_runs.py" "$work/ref" "$1" --rtol 1e-5 --label "$2"; }

# A long ddp run of the mlp for the fault cases: 2 hosts x 2 ranks, a collective timeout of
# $coll_timeout s, every step logged, so the fault lands mid-run.
coll_timeout=6
long=(--config "$jobs/mlp.toml" "${sgd[@]}" --set strategy.plugin=ddp --set trainer.max_steps=1000000
      --set trainer.log_every=1 --set trainer.micro_batch_size=8 --set trainer.run_dir="$run_dir"
      --set accelerator.timeout_s=$coll_timeout --set launch.rendezvous_timeout_s=30
      --set launch.stop_grace_s=3 --nproc-per-node 2)
# start_long <host>: node <host-1> of the long run, in the background; its pid in $node_pid[host].
declare -a node_pid
start_long() {
  on_host "$1" "$tr" "${long[@]}" "${@:2}" --nnodes 2 --node-rank $(( $1 - 1 )) --master-addr "$master" \
    --master-port "$port" >"$work/node$(( $1 - 1 ))" 2>&1 &
  node_pid[$1]=$!
}
# wait_node <host>: its exit code in $rc.
wait_node() { rc=0; wait "${node_pid[$1]}" || rc=$?; }
show() { for f in "$work"/node*; do echo "--- $(basename "$f")"; cat "$f"; done; }
# training <seconds>: until the run has logged a few steps.
training() { wait_for "$run_dir/metrics.jsonl" '"step": ?5\b' "${1:-60}"; }
# nothing_left: no trainrun process on any host, no /dev/shm segment.
nothing_left() {
  local i
  for i in $(seq 1 "$NETNS_HOSTS"); do
    [ -z "$(host_pids "$i")" ] || { ps -fp "$(host_pids "$i" | tr '\n' ',')0" || true; fail "processes left on host$i"; }
  done
  no_leftovers "$run_dir"
}

case $case in
ddp)
  netns_up 2
  reference "$jobs/mlp.toml" 32 "${sgd[@]}"
  t0=$(now)
  nodes 2 --config "$jobs/mlp.toml" "${sgd[@]}" --set strategy.plugin=ddp --nproc-per-node 2 \
    --set trainer.micro_batch_size=8 --set trainer.run_dir="$run_dir"
  expect_in "$work/node0" "tcp host1 \+ shm \(1 of 3 peers\)"
  for r in 2 3; do expect_in "$work/node1" "^trainrun: started rank $r \(pid [0-9]+, node 1\)"; done
  compare "$run_dir" "ddp, 2 hosts x 2 ranks ($(elapsed "$t0") s)"
  nothing_left
  ;;
ddp3)
  netns_up 3
  reference "$jobs/mlp.toml" 24 "${sgd[@]}"
  t0=$(now)
  nodes 3 --config "$jobs/mlp.toml" "${sgd[@]}" --set strategy.plugin=ddp --nproc-per-node 2 \
    --set trainer.global_batch_size=24 --set trainer.micro_batch_size=4 --set trainer.run_dir="$run_dir"
  expect_in "$work/node0" "tcp host1 \+ shm \(1 of 5 peers\)"
  compare "$run_dir" "ddp, 3 hosts x 2 ranks ($(elapsed "$t0") s)"
  nothing_left
  ;;
fsdp_hybrid)
  netns_up 2
  reference "$jobs/gpt.toml" 32 "${adamw[@]}"
  t0=$(now)
  nodes 2 --config "$jobs/gpt.toml" "${adamw[@]}" --set strategy.plugin=fsdp \
    --set strategy.sharding_strategy=HYBRID_SHARD --nproc-per-node 2 \
    --set trainer.micro_batch_size=8 --set trainer.run_dir="$run_dir"
  expect_in "$work/node0" "HYBRID_SHARD as configured; shard groups of 2 ranks, 2 replica"
  compare "$run_dir" "fsdp HYBRID_SHARD, shard group = node, 2 hosts x 2 ranks ($(elapsed "$t0") s)"
  nothing_left
  ;;
*)
  fail "unknown case $case"
  ;;
esac
