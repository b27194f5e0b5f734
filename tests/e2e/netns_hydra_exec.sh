#!/bin/bash
# MPICH hydra's "ssh" for namespaced test hosts (tests/e2e/netns_lib.sh): hydra runs
# `-launcher ssh -launcher-exec THIS [ssh options] HOST COMMAND` (options: its own -x, and those
# of HYDRA_LAUNCH_EXTRA_ARGS, e.g. the MPI operator's "-o ConnectionAttempts=10"); this runs
# COMMAND on HOST (hostN) in its namespace, with its host name. NETNS_TAG comes from the
# environment.
while [ "${1#-}" != "$1" ]; do
  case $1 in -o|-p|-l|-i|-F|-J) shift ;; esac  # ssh options that take a value
  shift
done
host=$1; shift
exec ip netns exec "${NETNS_TAG:?}h${host#host}" unshare --uts sh -c 'hostname "$0" && eval "$@"' "$host" "$@"
