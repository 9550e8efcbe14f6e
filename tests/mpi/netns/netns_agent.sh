#!/usr/bin/env bash
# Open MPI launcher agent (--mca plm_rsh_agent) for tests/mpi/netns/run_netns.sh:
# called as `netns_agent.sh [options] HOST COMMAND...` in place of ssh, it runs
# COMMAND in the network namespace that owns HOST's address, so every rank
# lives in its own namespace and every byte between ranks crosses a veth.
set -euo pipefail
# ssh-style options before the host (Open MPI may pass -x or -o ...): skip.
while [[ $# -gt 0 && "$1" == -* ]]; do
  case "$1" in
    -o | -p | -l | -i) shift 2 ;;
    *) shift ;;
  esac
done
host="$1"
shift
ns="$(cat "${SOFTDOT_NETNS_DIR:?}/host-$host")"
exec ip netns exec "$ns" /bin/sh -c "$*"
