#!/bin/bash
# MPICH hydra's "ssh" for namespaced test hosts (tests/netns_lib.sh): hydra runs
# `-launcher ssh -launcher-exec THIS [-x] HOST COMMAND`; this runs COMMAND on HOST (hostN) in its
# namespace, with its host name. NETNS_TAG comes from the environment.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
exec ip netns exec "${NETNS_TAG:?}h${host#host}" unshare --uts sh -c 'hostname "$0" && eval "$@"' "$host" "$@"
