#!/usr/bin/env bash
# Runs an MPI program with each of its P ranks in a network namespace of its
# own ("hosts" of the project's own): namespaces sdns<id>-<i>, each joined by
# a veth pair to a bridge in the calling namespace, addresses 10.<a>.<b>.(i+1)
# (the bridge .254); mpirun reaches the "hosts" through netns_agent.sh instead
# of ssh, and the TCP BTL and the runtime use only that subnet, so every
# byte between ranks crosses a network interface. Needs root and `ip netns`;
# exits 77 (skipped) when either is missing. Everything made is removed on
# exit.
# Usage: run_netns.sh P PROGRAM [ARGS...]   (mpirun from PATH or $MPIRUN)
set -euo pipefail
if (($# < 2)); then
  echo "usage: $0 P PROGRAM [ARGS...]" >&2
  exit 2
fi
P="$1"
shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mpirun="${MPIRUN:-mpirun}"
if ((EUID != 0)) || ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
  echo "run_netns.sh: needs root and ip netns; skipped" >&2
  exit 77
fi
# A short id unique to this run (names are limited to 15 characters).
id="$(printf '%04x' $(($$ % 65536)))"
a=$((10 + $$ % 200))
b=$(($$ / 200 % 250))
subnet="10.$a.$b"
br="sdbr$id"
dir="$(mktemp -d)"
cleanup() {
  for ((i = 0; i < P; i++)); do
    ip netns del "sdns$id-$i" 2>/dev/null || true
    ip link del "sdv$id-$i" 2>/dev/null || true
  done
  ip link del "$br" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
ip link add "$br" type bridge
ip addr add "$subnet.254/24" dev "$br"
ip link set "$br" up
: >"$dir/hosts"
for ((i = 0; i < P; i++)); do
  ns="sdns$id-$i"
  ip netns add "$ns"
  ip link add "sdv$id-$i" type veth peer name "sdp$id-$i"
  ip link set "sdp$id-$i" netns "$ns"
  ip link set "sdv$id-$i" master "$br"
  ip link set "sdv$id-$i" up
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "sdp$id-$i" name eth0
  ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  echo "$ns" >"$dir/host-$subnet.$((i + 1))"
  echo "$subnet.$((i + 1)) slots=1" >>"$dir/hosts"
done
export SOFTDOT_NETNS_DIR="$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Every rank on its own "host": the shared-memory BTL cannot be used
# between them, and the runtime and the TCP BTL are held to the subnet.
"$mpirun" --hostfile "$dir/hosts" -np "$P" \
  --mca plm_rsh_agent "$here/netns_agent.sh" \
  --mca plm_rsh_no_tree_spawn 1 \
  --mca btl self,tcp \
  --mca btl_tcp_if_include "$subnet.0/24" \
  --mca oob_tcp_if_include "$subnet.0/24" \
  --mca mpi_yield_when_idle 1 \
  -x OMP_NUM_THREADS=1 -x SOFTDOT_NETNS_DIR \
  "$@"
