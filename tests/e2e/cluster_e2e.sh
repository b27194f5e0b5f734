#!/usr/bin/env bash
# Several hosts with their own addresses (network namespaces joined by a bridge, tests/e2e/netns_lib.sh),
# each running trainrun's own node agent, as on a cluster. One case per CTest entry:
#   cluster_e2e.sh <trainrun> <equivalence jobs dir> <work dir> <case>
# Equivalence (the job of tests/e2e/equivalence, compared with tests/e2e/compare_runs.py at 1e-5 with
# the single-process run): ddp (2 hosts x 2 ranks, mlp, SGD; all_reduce in two levels), ddp3 (3 hosts x 2 ranks),
# fsdp_hybrid (gpt, AdamW, HYBRID_SHARD with the node as the shard group), mpi (MPICH's hydra
# started on host 1, its proxies on every host through `ip netns exec`), pytorchjob (each host
# gets exactly the environment of a Kubeflow PyTorchJob pod, examples/kubernetes/pytorchjob.yaml),
# mpijob (a launcher host runs the mpiexec of examples/kubernetes/mpijob.yaml against two worker
# hosts, with the MPI operator's environment).
# collectives: gloo-cpu's --verify matrix at 2 hosts x 2 ranks (two-level all_reduce, sub-groups
# within and across hosts).
# Faults (a long run, then): link_cut, host_killed, host_missing, master_dies, slow_link;
# each asserts the time to a clean end, the host/rank named, and nothing left behind.
# elastic_rejoin: max_restarts = 1, a host killed and started again, the job resumes on both
# hosts from the latest checkpoint and ends bitwise equal to an uninterrupted run.
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
coll_timeout=6 grace=3 rdzv=20
store_op_timeout=10  # core/src/launcher/agent.cpp kStoreOpTimeoutS: node 1 gives up on node 0's store
agent_lost=15        # kAgentLostS: node 0 gives up on a silent node 1
slack=6              # teardown on two loaded cores
progress_limit=10    # collectives (2 steps) a dead peer's last published progress may be behind
long=(--config "$jobs/mlp.toml" "${sgd[@]}" --set strategy.plugin=ddp --set trainer.max_steps=1000000
      --set trainer.log_every=1 --set trainer.micro_batch_size=8 --set trainer.run_dir="$run_dir"
      --set accelerator.timeout_s=$coll_timeout --set launch.rendezvous_timeout_s=$rdzv
      --set launch.stop_grace_s=$grace --nproc-per-node 2)
# start_node <host> [args]: node <host-1> of the long run in the background; when it ends,
# $work/end<node> holds its exit code and end time.
start_node() {
  local h=$1 k=$(( $1 - 1 )); shift
  ( rc=0
    on_host "$h" "$tr" "${long[@]}" "$@" --nnodes 2 --node-rank "$k" --master-addr "$master" \
      --master-port "$port" >"$work/node$k" 2>&1 || rc=$?
    echo "$rc $(now)" >"$work/end$k" ) &
}
# ended <node> <limit s> <expected code>: waits for the node's end, checks its code and that it
# ended within <limit> s of $t0; prints the time.
ended() {
  for _ in $(seq 1 $(( ($2 + 30) * 10 ))); do [ -s "$work/end$1" ] && break; sleep 0.1; done
  [ -s "$work/end$1" ] || { show; fail "node $1 did not end within $(( $2 + 30 )) s"; }
  local rc t
  read -r rc t <"$work/end$1"
  t=$(py -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$t0" "$t")
  [ "$rc" -eq "$3" ] || { show; fail "node $1 exited with code $rc, expected $3"; }
  within "$2" "$t" "node $1 to a clean end (code $rc)"
}
show() { for f in "$work"/node*; do echo "--- $(basename "$f")"; cat "$f"; done; }
# progress_current <file> <limit>: in the first collective error of <file>, every peer named
# shows, by the progress it last published, a collective at most <limit> behind the failed one
# (ranks run in lockstep; a record that is seconds old names collectives long finished).
progress_current() {
  py - "$1" "$2" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"#(\d+) in group world (?:timed out|failed)[^\n]*?; ((?:not arrived|issued it, then went silent)[^\n]*)", text)
if not m:
    sys.exit(f"no collective error naming peers in {sys.argv[1]}")
seq, worst = int(m.group(1)), 0
for p in re.finditer(r"rank (\d+) \(host (\S+), pid \d+\): last completed (?:none|#(\d+) .*?), first pending (?:none|#(\d+))", m.group(2)):
    at = int(p.group(4)) if p.group(4) else int(p.group(3) or 0) + 1
    print(f"rank {p.group(1)} (host {p.group(2)}) was at #{at} by its last record; the failed collective is #{seq}")
    worst = max(worst, seq - at)
if worst > int(sys.argv[2]):
    sys.exit(f"a peer's published progress is {worst} collectives behind the failed one (limit {sys.argv[2]}): stale")
PY
}
# training: until the run has logged a few steps.
training() { wait_for "$run_dir/metrics.jsonl" '"step": ?5\b' 90; }
# nothing_left: no process on any host, no trainrun process or /dev/shm segment anywhere.
nothing_left() {
  wait
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
  expect_in "$work/node0" "all_reduce in two levels: shm within a machine, TCP between 2 machines"
  for r in 2 3; do expect_in "$work/node1" "^trainrun: started rank $r \(pid [0-9]+, node 1\)"; done
  compare "$run_dir" "ddp, 2 hosts x 2 ranks ($(elapsed "$t0") s)"
  nothing_left
  ;;
collectives)
  # gloo-cpu's correctness matrix across 2 hosts x 2 ranks: the world's all_reduce in two levels
  # (shared memory within a host, TCP between hosts), its sub-groups within one host (shared
  # memory) and across hosts (TCP). Ranks get a torchrun-style environment directly.
  netns_up 2
  t0=$(now)
  pids=()
  for r in 3 2 1 0; do
    on_rank "$r" 4 2 "$port" "$tr" bench collectives --backend gloo-cpu --verify \
      --label "$run_dir" --set accelerator.threads=1 --set accelerator.timeout_s=60 \
      >"$work/rank$r" 2>&1 &
    pids[$r]=$!
  done
  rc=0
  for r in 0 1 2 3; do wait "${pids[$r]}" || { rc=$?; echo "rank $r exited with code $rc"; }; done
  if [ "$rc" -ne 0 ]; then
    for r in 0 1 2 3; do echo "--- rank $r"; cat "$work/rank$r"; done
    fail "a rank failed"
  fi
  expect_in "$work/rank0" "all_reduce in two levels: shm within a machine, TCP between 2 machines"
  # The count tests/collectives.cmake's _verify_checks gives for world 4 and every operation.
  expect_in "$work/rank0" "world_size 4, 441 checks per rank, 0 failure"
  echo "verify matrix, 2 hosts x 2 ranks: $(grep -o 'world_size 4, [0-9]* checks per rank, 0 failure' "$work/rank0") ($(elapsed "$t0") s)"
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
mpi)
  # MPICH's hydra, started on host 1 as an MPIJob's launcher pod would, reaches host 2 through
  # `ip netns exec` in place of ssh (tests/e2e/netns_hydra_exec.sh); trainrun ranks read PMI_*.
  "$tr" plugins mpi >/dev/null 2>&1 || { echo "SKIP: no mpi accelerator plugin in this build"; exit 77; }
  netns_up 2
  export NETNS_TAG
  reference "$jobs/mlp.toml" 32 "${sgd[@]}"
  t0=$(now)
  rc=0
  on_host 1 mpiexec -launcher ssh -launcher-exec "$here/netns_hydra_exec.sh" -hosts host1,host2 \
    -ppn 2 -n 4 "$tr" --config "$jobs/mlp.toml" "${sgd[@]}" --set strategy.plugin=ddp \
    --set accelerator.plugin=mpi --set trainer.micro_batch_size=8 --set trainer.run_dir="$run_dir" \
    >"$work/node0" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { show; fail "mpiexec exited with $rc"; }
  compare "$run_dir" "ddp over mpi (hydra), 2 hosts x 2 ranks ($(elapsed "$t0") s)"
  nothing_left
  ;;
mpijob)
  # A Kubeflow MPIJob (examples/kubernetes/mpijob.yaml, MPICH): host 1 is the launcher pod and
  # runs no rank; hosts 2 and 3 are the worker pods, 2 slots each. The launcher gets the
  # operator's environment (HYDRA_HOST_FILE in the operator's "host:slots" format,
  # HYDRA_LAUNCH_EXTRA_ARGS) and runs the yaml's command; hydra's ssh launcher is pointed at the
  # namespaces through its environment (HYDRA_LAUNCHER_EXEC) instead of ssh, so the command
  # line is the yaml's, word for word, plus the test's job settings.
  "$tr" plugins mpi >/dev/null 2>&1 || { echo "SKIP: no mpi accelerator plugin in this build"; exit 77; }
  netns_up 3
  export NETNS_TAG
  reference "$jobs/mlp.toml" 32 "${sgd[@]}"
  printf 'host2:2\nhost3:2\n' >"$work/hostfile"
  t0=$(now)
  rc=0
  on_host 1 env HYDRA_HOST_FILE="$work/hostfile" HYDRA_LAUNCH_EXTRA_ARGS="-o ConnectionAttempts=10" \
    HYDRA_LAUNCHER=ssh HYDRA_LAUNCHER_EXEC="$here/netns_hydra_exec.sh" \
    mpiexec -n 4 "$tr" --config "$jobs/mlp.toml" --set accelerator.plugin=mpi \
    --set trainer.run_dir="$run_dir" "${sgd[@]}" --set strategy.plugin=ddp --set trainer.micro_batch_size=8 \
    >"$work/node0" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { show; fail "the launcher's mpiexec exited with $rc"; }
  # Ranks 0-1 on host 2 and 2-3 on host 3, none on the launcher: runtime/rank-N.json says where.
  for r in 0 1 2 3; do
    want=host$(( r / 2 + 2 ))
    got=$(py -c "import json,sys; print(json.load(open(sys.argv[1])).get('host', '?'))" "$run_dir/runtime/rank-$r.json")
    [ "$got" = "$want" ] || fail "rank $r ran on $got, the hostfile puts it on $want"
  done
  compare "$run_dir" "ddp over mpi as an MPIJob, launcher + 2 workers x 2 slots ($(elapsed "$t0") s)"
  nothing_left
  ;;
pytorchjob)
  # Each host is a pod of a Kubeflow PyTorchJob (examples/kubernetes/pytorchjob.yaml: a Master
  # and one Worker, nprocPerNode "2"), with exactly the training operator's variables; MASTER_ADDR
  # is a host name, as the master's service is. trainrun gets no launch flag at all.
  netns_up 2
  reference "$jobs/mlp.toml" 32 "${sgd[@]}"
  t0=$(now)
  pids=()
  for i in 2 1; do
    on_host "$i" env MASTER_ADDR=host1 MASTER_PORT=$port WORLD_SIZE=4 RANK=$((i - 1)) \
      PET_NPROC_PER_NODE=2 PET_NODE_RANK=$((i - 1)) PET_NNODES=2 PYTHONUNBUFFERED=0 \
      "$tr" --config "$jobs/mlp.toml" "${sgd[@]}" --set strategy.plugin=ddp \
      --set trainer.micro_batch_size=8 --set trainer.run_dir="$run_dir" >"$work/node$((i - 1))" 2>&1 &
    pids[$i]=$!
  done
  rc=0
  for i in 1 2; do wait "${pids[$i]}" || rc=$?; done
  [ "$rc" -eq 0 ] || { show; fail "a pod failed"; }
  for k in 0 1; do
    expect_in "$work/node$k" "^trainrun: Kubeflow PyTorchJob environment: nnodes 2, node_rank $k, nproc_per_node 2, master_addr host1, master_port $port"
  done
  for r in 2 3; do expect_in "$work/node1" "^trainrun: started rank $r \(pid [0-9]+, node 1\)"; done
  compare "$run_dir" "ddp as a PyTorchJob, 2 pods x 2 ranks ($(elapsed "$t0") s)"
  nothing_left
  ;;
link_cut)
  # Host 2's cable is pulled mid-run: its packets vanish, no connection is reset. Node 0's ranks
  # time out in their collective naming host 2's ranks; node 0's agent, which serves the store,
  # waits for node 1's heartbeat to stop; node 1's agent gives up on the store.
  netns_up 2
  start_node 2; start_node 1
  training
  cut_link 2
  t0=$(now)
  ended 0 $(( coll_timeout + agent_lost + slack )) 2
  ended 1 $(( store_op_timeout + grace + slack )) 1
  show
  # Host 2's ranks either had not issued the collective or issued it and then went silent.
  for r in 2 3; do
    expect_in "$work/node0" "timed out after $coll_timeout s; (not arrived|issued it, then went silent).*rank $r \(host host2, pid [0-9]+\): last completed"
  done
  progress_current "$work/node0" $progress_limit
  expect_in "$work/node0" "^trainrun: rank [01] \(pid [0-9]+, node 0\) exited with code 2"
  expect_in "$work/node0" "^trainrun: node 1's agent stopped responding \(no heartbeat for $agent_lost\.0 s\)"
  expect_in "$work/node1" "^trainrun: lost the rendezvous store at $master:$port \(node 0's agent is gone or its host unreachable"
  nothing_left
  ;;
host_killed)
  # Every process of host 2 (its agent and both ranks) is SIGKILLed mid-run: the connections
  # are reset, node 0's ranks fail at once naming host 2's ranks, and node 0's agent stops
  # waiting for node 1 when its heartbeat stops.
  netns_up 2
  start_node 2; start_node 1
  training
  kill_host 2 KILL
  t0=$(now)
  ended 0 $(( agent_lost + slack )) 2
  show
  expect_in "$work/node0" "rank [23] \(host host2, pid [0-9]+\)"
  progress_current "$work/node0" $progress_limit
  expect_in "$work/node0" "^trainrun: node 1's agent stopped responding"
  nothing_left
  ;;
host_missing)
  # Host 2 never starts its node: node 0 names the missing node within the rendezvous timeout.
  # Then host 2 alone, with host 1 cut off (SYNs vanish: no "connection refused" to go by),
  # names the address it could not reach within the same timeout.
  netns_up 2
  start_node 1 --set launch.rendezvous_timeout_s=5
  wait_for "$work/node0" "waiting for 1 more node" 60
  t0=$(now)
  ended 0 $(( 5 + slack )) 1
  expect_in "$work/node0" "rendezvous at $master:$port: node\(s\) 1 of 2 did not arrive within 5\.0 s \(\[launch\] rendezvous_timeout_s\); arrived: node 0 \(host host1, pid [0-9]+\)"
  cut_link 1
  start_node 2 --set launch.rendezvous_timeout_s=5
  # Timed from node 1's first connection attempt (its SYN, which vanishes), not from its
  # start-up, which takes from 2 to 25 s on this loaded machine.
  for _ in $(seq 1 900); do
    grep -q . <<<"$(ip netns exec "$(host_ns 2)" ss -Htn state syn-sent "dst $master" 2>/dev/null)" && break
    sleep 0.1
  done
  t0=$(now)
  ended 1 $(( 5 + slack )) 1
  show
  expect_in "$work/node1" "node 1: could not reach node 0's rendezvous store at $master:$port within 5\.0 s"
  grep -q "started rank" "$work/node0" "$work/node1" && fail "a worker was started"
  nothing_left
  ;;
master_dies)
  # Host 1 (node 0: the store and ranks 0-1) is SIGKILLed mid-run: host 2's ranks lose their
  # peers and its agent the store; nobody waits for a timeout.
  netns_up 2
  start_node 2; start_node 1
  training
  kill_host 1 KILL
  t0=$(now)
  ended 1 $(( grace + slack )) 1
  show
  expect_in "$work/node1" "^trainrun: lost the rendezvous store at $master:$port \(node 0's agent is gone"
  nothing_left
  ;;
slow_link)
  # 150 ms on host 2's link (tc netem; or 4 Mbit/s, tc tbf, where the kernel has no netem):
  # every step waits on it, the stall inspector
  # warns (stall_warning_s = 0.2) naming host 2's ranks, and the run ends normally with the
  # single-process losses. (The two-level all_reduce sends each byte over the link once per
  # host: each step's all_reduce waits ~0.44 s under tbf, below the 0.5 s this test had used.)
  command -v tc >/dev/null || { echo "SKIP: no tc (Debian's iproute2)"; exit 77; }
  netns_up 2
  slow_link 2 150ms || { echo "SKIP: neither tc netem nor tc tbf works here"; exit 77; }
  reference "$jobs/mlp.toml" 32 "${sgd[@]}" --set trainer.max_steps=6
  t0=$(now)
  nodes 2 --config "$jobs/mlp.toml" "${sgd[@]}" --set strategy.plugin=ddp --nproc-per-node 2 \
    --set trainer.max_steps=6 --set trainer.micro_batch_size=8 --set trainer.run_dir="$run_dir" \
    --set accelerator.stall_warning_s=0.2
  echo "6 steps over the slowed link in $(elapsed "$t0") s"
  grep -h "warning: rank" "$work"/node* | sed -n 1,3p
  # A warning, not a failure: the operation is named with how long it has waited, and either
  # the ranks that have not issued it or that its data is still on the wire.
  grep -qhE "^\[rank [0-3]\] trainrun gloo-cpu: warning: rank [0-3]: all_reduce\(.*\) #[0-9]+ in group world has waited [0-9.]+ s; (every peer has issued it: its data is still in transit \(a slow or congested link between the hosts\?\)|not arrived: rank [0-3] \(host host[12])" "$work"/node0 "$work"/node1 ||
    { show; fail "no stall warning"; }
  grep -h "error" "$work"/node0 "$work"/node1 && fail "the slow link caused an error"
  compare "$run_dir" "ddp over the slowed link"
  nothing_left
  ;;
elastic_rejoin|elastic_worker)
  [ "$case" = elastic_worker ] && ELASTIC_CASE=worker
  # [launch] max_restarts = 1, checkpoints every 10 steps, a run_dir both hosts share. Host 2's
  # processes (its agent and both ranks) are SIGKILLed after the first checkpoint, and host 2
  # starts its node again at once, as Kubernetes restarts a pod. The new agent finds node_rank
  # 1 taken in the running round: it ends that round and waits for the next; node 0's agent
  # stops its ranks, opens round 1, and every node starts its workers again, which resume from
  # the latest checkpoint. The final weights are bitwise equal to an uninterrupted 2-host run.
  netns_up 2
  job=(--config "$jobs/mlp.toml" "${sgd[@]}" --set strategy.plugin=ddp --nproc-per-node 2
       --set trainer.micro_batch_size=8 --set trainer.max_steps=60 --set trainer.log_every=1
       --set 'callbacks=[{plugin="checkpoint", every_n_steps=10}]' --set accelerator.timeout_s=$coll_timeout
       --set launch.stop_grace_s=$grace --set launch.rendezvous_timeout_s=$rdzv)
  nodes 2 "${job[@]}" --set trainer.run_dir="$work/straight"
  # The new node 1 may take 25 s to start on this loaded machine; node 0 waits for it this long.
  job+=(--set launch.rendezvous_timeout_s=60)
  # Each save waits 1 s (a test hook that changes no number), so the kill lands mid-run.
  elastic() {
    local h=$1 out=$2; shift 2
    ( rc=0
      on_host "$h" env TRAINRUN_TEST_SAVE_DELAY_S=1 "$tr" "${job[@]}" --set launch.max_restarts=1 \
        --set trainer.run_dir="$run_dir" --nnodes 2 --node-rank $((h - 1)) --master-addr "$master" \
        --master-port "$port" >"$work/$out" 2>&1 || rc=$?
      echo "$rc $(now)" >"$work/end-$out" ) &
  }
  if [ "${ELASTIC_CASE:-rejoin}" = worker ]; then
    # The other path of a restart: both agents stay; rank 2 (on host 2) SIGKILLs itself as
    # step 15 starts (test hook, first round only), node 1's agent reports it, every agent
    # stops its ranks and joins round 1.
    elastic() {
      local h=$1 out=$2
      ( rc=0
        on_host "$h" env TRAINRUN_TEST_SIGKILL_AT_STEP=15 TRAINRUN_TEST_SIGKILL_RANK=2 "$tr" "${job[@]}" \
          --set launch.max_restarts=1 --set trainer.run_dir="$run_dir" --nnodes 2 --node-rank $((h - 1)) \
          --master-addr "$master" --master-port "$port" >"$work/$out" 2>&1 || rc=$?
        echo "$rc $(now)" >"$work/end-$out" ) &
    }
    t0=$(now)
    elastic 2 node1; elastic 1 node0
    for out in node0 node1; do
      for _ in $(seq 1 1800); do [ -s "$work/end-$out" ] && break; sleep 0.1; done
      read -r rc t <"$work/end-$out" || { show; fail "$out did not end"; }
      [ "$rc" -eq 0 ] || { show; fail "$out exited with code $rc"; }
    done
    show
    expect_in "$work/node1" "rank 2 SIGKILLs itself at step 15"
    for out in node0 node1; do expect_in "$work/$out" "restart 1 of 1: a worker failed"; done
    expect_in "$work/node0" "resumed from .*step-0000010 at step 10"
    expect_in "$work/node1" "joined the rendezvous at .* \(round 1\)"
    echo "measured: 60 steps with one restart of both nodes in $(elapsed "$t0") s"
    py "$here/checkpoint_check.py" same-weights "$work/straight/model.safetensors" "$run_dir/model.safetensors"
    nothing_left
    exit 0
  fi
  elastic 2 node1; elastic 1 node0
  wait_for "$run_dir/checkpoints/latest" "step-" 120
  kill_host 2 KILL
  t0=$(now)
  elastic 2 node1-again
  for out in node0 node1-again; do
    for _ in $(seq 1 1200); do [ -s "$work/end-$out" ] && break; sleep 0.1; done
    [ -s "$work/end-$out" ] || { show; fail "$out did not end within 120 s of the kill"; }
    read -r rc t <"$work/end-$out"
    [ "$rc" -eq 0 ] || { show; fail "$out exited with code $rc"; }
    echo "measured: $out ended (code 0) $(py -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$t0" "$t") s after the kill"
  done
  show
  expect_in "$work/node1-again" "^trainrun: node 1 \(host host2, pid [0-9]+\) rejoined the job in place of node 1 \(host host2, pid [0-9]+\), which is gone"
  expect_in "$work/node0" "restart 1 of 1: a worker failed .*restarting all 4 workers of 2 nodes"
  expect_in "$work/node0" "resumed from .*step-[0-9]+ at step [0-9]+"
  grep -q "started rank 2" "$work/node1-again" || fail "the new node 1 started no worker"
  py "$here/checkpoint_check.py" same-weights "$work/straight/model.safetensors" "$run_dir/model.safetensors"
  nothing_left
  ;;
*)
  fail "unknown case $case"
  ;;
esac
