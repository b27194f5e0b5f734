#!/usr/bin/env bash
# All-reduce bandwidth between two hosts with their own addresses (network namespaces joined by
# a bridge, tests/e2e/netns_lib.sh; root needed), one rank on each, through `trainrun bench
# collectives`: gloo-cpu as two workers (torchrun's variables), mpi through MPICH's hydra.
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
    on_host "$i" env RANK=$((i - 1)) WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=$((i - 1)) \
      MASTER_ADDR="$(host_addr 1)" MASTER_PORT=29500 \
      "$tr" bench collectives --backend "$backend" --sizes "$sizes" --iters "$iters" --warmup 1 \
      --label "2 namespaced hosts, 1 rank each" >"/tmp/netns-bench-$$-$i" 2>&1 &
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
