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
# The "host" also gets a host name of its own (the namespace's name, in a
# UTS namespace of its own), as a real host has. Open MPI keeps a daemon's
# session directory at <tmpdir>/ompi.<host name>.<uid>/jf.<job family>/, and
# a daemon starting up removes the empty directories under that job-family
# directory. With one host name for every namespace (and one /tmp), the P
# daemons of a run shared that directory: under load one daemon's start-up
# clean-up removed the directory another was creating, whose orte_init then
# failed ("A call to mkdir was unable to create the desired directory",
# exit 213) unseen, and mpirun waited for it until the timeout (issue 24).
exec ip netns exec "$ns" unshare --uts /bin/sh -c \
  'hostname "$1" && exec /bin/sh -c "$2"' sh "$ns" "$*"
