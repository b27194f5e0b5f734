# A throwaway SLURM cluster of one node on this machine: munged, slurmctld and slurmd with their
# own config, sockets, ports and state in a temp dir, stopped and removed on exit (also when the
# test fails). Source it after e2e_lib.sh.
#   slurm_up <dir>       starts everything; exports SLURM_CONF; exits 77 with the reason where
#                        Debian's slurm-wlm / munge are not installed or cannot run here
#   slurm_down           stops the daemons (the EXIT trap does it too)
SLURM_PIDS=()
# Every process of this throwaway cluster's jobs (srun, slurmstepd, the tasks): they inherit
# SLURM_CONF from this shell or from slurmd. Not this shell, its subshells or the daemons.
slurm_job_pids() {
  local p self=" $$ $BASHPID ${SLURM_PIDS[*]} "
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $self == *" $p "* ]] && continue
    has_env "$p" "SLURM_CONF=$SLURM_CONF" && echo "$p"
  done
  return 0
}
slurm_down() {
  local p
  # A failed test must not leave ranks running into the next test: the jobs go first, while the
  # controller can still cancel them, then whatever is left of them is killed outright.
  if [ -n "${SLURM_CONF:-}" ] && ((${#SLURM_PIDS[@]})); then
    timeout 10 scancel --user="$(id -un)" --signal=KILL --full >/dev/null 2>&1 || true
    for p in $(slurm_job_pids); do kill -KILL "$p" 2>/dev/null || true; done
  fi
  for p in "${SLURM_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${SLURM_PIDS[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  SLURM_PIDS=()
}

slurm_up() {
  local d=$1 m
  for m in munged slurmctld slurmd srun sbatch scancel; do
    command -v "$m" >/dev/null || { echo "SKIP: no $m (apt-get install slurm-wlm munge; scripts/bootstrap)"; exit 77; }
  done
  [ "$(id -u)" -eq 0 ] || { echo "SKIP: slurmd must run as root to start jobs as their user"; exit 77; }
  mkdir -p "$d/state" "$d/spool" "$d/munge"
  chmod 711 "$d/munge"
  trap 'slurm_down' EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  head -c 1024 /dev/urandom >"$d/munge/key"
  chmod 400 "$d/munge/key"
  munged --force --socket="$d/munge/socket" --key-file="$d/munge/key" --pid-file="$d/munge/pid" \
    --log-file="$d/munge/log" --seed-file="$d/munge/seed" --foreground >"$d/munge/out" 2>&1 &
  SLURM_PIDS+=($!)
  for _ in $(seq 1 50); do [ -S "$d/munge/socket" ] && break; sleep 0.1; done
  [ -S "$d/munge/socket" ] || { cat "$d/munge/log"; fail "munged did not start"; }
  local host ctl_port node_port cpus
  host=$(hostname -s)
  ctl_port=$(free_port) node_port=$(free_port)
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc obeys OMP_NUM_THREADS
  cat >"$d/slurm.conf" <<CONF
ClusterName=trainrun-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$node_port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge/socket
CredType=cred/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=5
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  export SLURM_CONF=$d/slurm.conf
  slurmctld -D -i -f "$d/slurm.conf" >"$d/slurmctld.out" 2>&1 &
  SLURM_PIDS+=($!)
  slurmd -D -f "$d/slurm.conf" -N "$host" >"$d/slurmd.out" 2>&1 &
  SLURM_PIDS+=($!)
  for _ in $(seq 1 100); do
    grep -qE "^idle" <<<"$(sinfo -h -o %T 2>/dev/null)" && return 0
    sleep 0.2
  done
  tail -20 "$d"/slurmctld.log "$d"/slurmd.log "$d"/*.out 2>/dev/null
  fail "the SLURM node did not become idle within 20 s"
}
