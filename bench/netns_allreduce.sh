#!/usr/bin/env bash
# All-reduce bandwidth between two hosts with their own addresses (network namespaces joined by
# a bridge, tests/e2e/netns_lib.sh; root needed), one rank on each, through `trainrun bench
# collectives`: gloo-cpu as two workers (torchrun's variables), mpi through MPICH's hydra; then
# gloo-cpu at 2 hosts x 2 ranks, its all_reduce in two levels (shared memory within a host, TCP
# between hosts: the default) beside Gloo's flat TCP ring (allreduce_algorithm = "ring").
#   bench/netns_allreduce.sh build/bin/trainrun [SIZES, default 64MiB] [ITERS, default 5]
set -euo pipefail
here=$(cd "$(dirname "$0")/../tests/e2e" && pwd)
source "$here/e2e_lib.sh"
source "$here/netns_lib.sh"
tr=$(realpath "$1") sizes=${2:-64MiB} iters=${3:-5}
netns_require
netns_up 2
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for backend in gloo-cpu; do
  for i in 2 1; do
    on_rank $((i - 1)) 2 1 29500 "$tr" bench collectives --backend "$backend" --sizes "$sizes" \
      --iters "$iters" --warmup 1 --label "2 namespaced hosts, 1 rank each" >"/tmp/netns-bench-$$-$i" 2>&1 &
  done
  wait
  echo "--- $backend"; cat "/tmp/netns-bench-$$-1"; cat "/tmp/netns-bench-$$-2" | grep -i error || true
  rm -f /tmp/netns-bench-$$-*
done
# mpi: MPICH's hydra on host 1 reaches host 2 through `ip netns exec` (tests/e2e/netns_hydra_exec.sh).
if "$tr" plugins mpi >/dev/null 2>&1; then
  export NETNS_TAG
  echo "--- mpi"
  on_host 1 mpiexec -launcher ssh -launcher-exec "$here/netns_hydra_exec.sh" -hosts host1,host2 \
    -ppn 1 -n 2 "$tr" bench collectives --backend mpi --sizes "$sizes" --iters "$iters" --warmup 1 \
    --label "2 namespaced hosts, 1 rank each"
fi
# 2 hosts x 2 ranks: the two-level all_reduce against Gloo's flat ring, alternating, 2 rounds.
port=29600
for round in 1 2; do
  for algo in auto ring; do
    for r in 3 2 1 0; do
      on_rank "$r" 4 2 "$port" "$tr" bench collectives --backend gloo-cpu --sizes "$sizes" --iters "$iters" --warmup 1 \
        --set accelerator.threads=1 --set accelerator.allreduce_algorithm=$algo \
        --label "2 namespaced hosts x 2 ranks, allreduce_algorithm $algo, round $round" \
        >"/tmp/netns-bench-$$-$r" 2>&1 &
    done
    wait
    echo "--- gloo-cpu, allreduce_algorithm = $algo (round $round)"
    grep -v "^\[rank [1-3]\]" "/tmp/netns-bench-$$-0"
    rm -f /tmp/netns-bench-$$-*
    port=$((port + 1))
  done
done
