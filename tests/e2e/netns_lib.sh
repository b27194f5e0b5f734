# Test hosts with their own addresses on one machine: network namespaces joined by a bridge.
# Source it after e2e_lib.sh. Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN), iproute2 and
# util-linux's unshare; netns_require exits 77 (CTest's skip) with the reason where they are
# missing. Only addresses inside the namespaces made here are used (10.231.0.0/24); every
# namespace, process in it and file made here is removed on exit, also when the test fails.
#
#   netns_up N            hosts 1..N: namespace ${NETNS_TAG}hI, host name hostI (its own UTS
#                         namespace, resolved through /etc/netns/<ns>/hosts), address
#                         10.231.0.I on eth0, plugged into a bridge that lives in a namespace of
#                         its own (${NETNS_TAG}sw), so the machine's own network is never touched
#   on_host I CMD...      runs CMD on host I (in the foreground; add & yourself)
#   on_rank R N PER PORT CMD...  runs CMD as rank R of N with PER ranks per host (on host
#                         R / PER + 1), given torchrun's variables (the store on host 1, PORT)
#   host_addr I           10.231.0.I
#   cut_link I / mend_link I    pulls / plugs host I's cable (the switch port, so the host's
#                         interface stays up and its packets vanish, as with a cut cable)
#   slow_link I DELAY     delays host I's outgoing packets (tc netem), e.g. "200ms", or where the
#                         kernel has no netem, limits its rate to 4 Mbit/s (tc tbf)
#   kill_host I [SIG]     sends SIG (default KILL) to every process on host I
#   host_pids I           the processes on host I
# Names carry the test's pid, so concurrent tests never share a namespace.

NETNS_TAG=${NETNS_TAG:-trn$$-}
NETNS_HOSTS=0
NETNS_SUBNET=10.231.0

netns_require() {
  local why=""
  [ "$(id -u)" -eq 0 ] || why="not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  [ -z "$why" ] && ! command -v ip >/dev/null && why="no ip command (Debian's iproute2)"
  [ -z "$why" ] && ! command -v unshare >/dev/null && why="no unshare command (Debian's util-linux)"
  if [ -z "$why" ] && ! ip netns add "${NETNS_TAG}probe" 2>/dev/null; then
    why="cannot create a network namespace here (ip netns add failed; a container without CAP_SYS_ADMIN?)"
  fi
  ip netns del "${NETNS_TAG}probe" 2>/dev/null || true
  if [ -n "$why" ]; then echo "SKIP: $why"; exit 77; fi
}

host_ns() { echo "${NETNS_TAG}h$1"; }
host_addr() { echo "$NETNS_SUBNET.$1"; }
host_pids() { ip netns pids "$(host_ns "$1")" 2>/dev/null || true; }

netns_down() {
  local i pids
  for i in $(seq 1 "$NETNS_HOSTS"); do
    pids=$(host_pids "$i")
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  done
  for i in $(seq 1 "$NETNS_HOSTS"); do
    ip netns del "$(host_ns "$i")" 2>/dev/null || true
    rm -rf "/etc/netns/$(host_ns "$i")"
  done
  ip netns del "${NETNS_TAG}sw" 2>/dev/null || true
}

netns_up() {
  local n=$1 i ns sw="${NETNS_TAG}sw"
  NETNS_HOSTS=$n
  trap 'netns_down' EXIT
  trap 'exit 143' TERM  # CTest's timeout: run the EXIT trap
  trap 'exit 130' INT
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for i in $(seq 1 "$n"); do
    ns=$(host_ns "$i")
    ip netns add "$ns"
    ip link add "h$i" netns "$sw" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "h$i" master br0
    ip -n "$sw" link set "h$i" up
    ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    mkdir -p "/etc/netns/$ns"
    {
      echo "127.0.0.1 localhost"
      local j
      for j in $(seq 1 "$n"); do echo "$(host_addr "$j") host$j"; done
    } >"/etc/netns/$ns/hosts"
  done
  # The bridge forwards only once its ports leave the listening state.
  for i in $(seq 1 "$n"); do
    for _ in $(seq 1 50); do
      grep -q "LOWER_UP" <<<"$(ip -n "$(host_ns "$i")" link show eth0)" && break
      sleep 0.1
    done
  done
}

on_host() {
  local i=$1; shift
  ip netns exec "$(host_ns "$i")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "host$i" "$@"
}

on_rank() {
  local r=$1 n=$2 per=$3 port=$4; shift 4
  on_host $(( r / per + 1 )) env RANK="$r" WORLD_SIZE="$n" LOCAL_RANK=$(( r % per )) \
    LOCAL_WORLD_SIZE="$per" GROUP_RANK=$(( r / per )) MASTER_ADDR="$(host_addr 1)" \
    MASTER_PORT="$port" "$@"
}

cut_link() { ip -n "${NETNS_TAG}sw" link set "h$1" down; }
mend_link() { ip -n "${NETNS_TAG}sw" link set "h$1" up; }
# A delay needs sch_netem, which some kernels lack (Firecracker's); then the link is slowed by
# a token bucket instead (sch_tbf): 4 Mbit/s, which makes every large message wait.
slow_link() {
  local ns
  ns=$(host_ns "$1")
  if ip netns exec "$ns" tc qdisc replace dev eth0 root netem delay "$2" 2>/dev/null; then
    echo "host$1: eth0 delayed by $2 each way (tc netem)"
  elif ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate 4mbit burst 16kb latency 5s; then
    echo "host$1: no sch_netem in this kernel; eth0 limited to 4 Mbit/s instead (tc tbf)"
  else
    return 1
  fi
}
kill_host() {
  local pids
  pids=$(host_pids "$1")
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -"${2:-KILL}" $pids 2>/dev/null || true
}
