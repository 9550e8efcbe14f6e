#!/usr/bin/env bash
# Runs an MPI program with each of its P ranks in a network namespace of its
# own ("hosts" of the project's own): namespaces sdns<id>-<i>, each joined by
# a veth pair to a bridge in the calling namespace, addresses 10.<a>.<b>.(i+1)
# (the bridge .254); mpirun reaches the "hosts" through netns_agent.sh instead
# of ssh, and the TCP BTL and the runtime use only that subnet, so every
# byte between ranks crosses a network interface. Needs root and `ip netns`;
# exits 77 (skipped) when either is missing. Everything made is removed on
# exit; mpirun runs under `timeout` (SOFTDOT_NETNS_TIMEOUT seconds, default
# 90, below the tests' ctest TIMEOUT of 120) so that a hang still ends here
# and cleans up. A run killed outright (SIGKILL) cannot clean up: each run
# first removes what runs whose process is gone left behind (namespaces,
# veths, bridge and its directory /tmp/softdot-netns-<id>.*; the owner's PID
# is kept in $state/<bridge>), and picks a subnet that no interface uses.
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
state=/run/softdot-netns
mkdir -p "$state"
# Leftovers of runs whose process is gone (or that predate the state files).
remove_run() {
  local rid="$1" ns
  for ns in $(ip netns list | awk '{print $1}' | grep "^sdns$rid-" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  for link in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep -E "^sd(v|br)$rid" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  rm -rf "/tmp/softdot-netns-$rid".*
  rm -f "$state/sdbr$rid"
}
for link in $(ip -o link show type bridge | awk -F': ' '{print $2}' | grep -E '^sdbr[0-9a-f]{4}$' || true); do
  owner="$(cat "$state/$link" 2>/dev/null || true)"
  if [[ -z "$owner" ]] || ! kill -0 "$owner" 2>/dev/null; then
    remove_run "${link#sdbr}"
  fi
done
for ns in $(ip netns list | awk '{print $1}' | grep -E '^sdns[0-9a-f]{4}-' || true); do
  rid="${ns#sdns}"
  rid="${rid%%-*}"
  [[ -e "/sys/class/net/sdbr$rid" ]] || remove_run "$rid"
done
# A run makes its directory after its bridge and removes it before: a
# directory without a bridge is a leftover.
for d in /tmp/softdot-netns-????.*; do
  [[ -d "$d" ]] || continue
  rid="${d#/tmp/softdot-netns-}"
  rid="${rid%%.*}"
  [[ -e "/sys/class/net/sdbr$rid" ]] || remove_run "$rid"
done
# A short id unique to this run (names are limited to 15 characters), and a
# /24 that no interface on this machine has yet.
id="$(printf '%04x' $(($$ % 65536)))"
while [[ -e "/sys/class/net/sdbr$id" ]]; do
  id="$(printf '%04x' $(((16#$id + 1) % 65536)))"
done
a=$((10 + $$ % 200))
b=$(($$ / 200 % 250))
while ip -o addr show | grep -q " inet 10\.$a\.$b\."; do
  b=$(((b + 1) % 250))
done
subnet="10.$a.$b"
br="sdbr$id"
dir=
cleanup() {
  [[ -z "$dir" ]] || rm -rf "$dir"
  for ((i = 0; i < P; i++)); do
    ip netns del "sdns$id-$i" 2>/dev/null || true
    ip link del "sdv$id-$i" 2>/dev/null || true
  done
  ip link del "$br" 2>/dev/null || true
  rm -f "$state/$br"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
echo $$ >"$state/$br"
ip link add "$br" type bridge
ip addr add "$subnet.254/24" dev "$br"
ip link set "$br" up
dir="$(mktemp -d "/tmp/softdot-netns-$id.XXXXXX")"
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
# Open MPI's session directories go under the run's directory (removed with
# it, or by the next run if this one is killed); each "host" has a host name
# of its own (netns_agent.sh), so each daemon has a directory of its own.
# The daemons stay attached to their agent instead of daemonizing, as under
# ssh: a daemon that fails at start-up then fails the run at once, with its
# message, where a daemonized one failed unseen and mpirun waited for it
# until the timeout. (Attached, the daemons and ranks also stay in the
# caller's session and so in its scheduler autogroup: CPU-bound load started
# from the same session slows them more than it slowed daemonized ones,
# which had sessions of their own; ring_test P = 4 took ~10 s instead of
# ~3 s beside two `yes` loops of the same shell, the same ~3 s when the
# loops ran in a session of their own.)
timeout --kill-after=5 "${SOFTDOT_NETNS_TIMEOUT:-90}" \
  "$mpirun" --hostfile "$dir/hosts" -np "$P" \
  --mca plm_rsh_agent "$here/netns_agent.sh" \
  --mca plm_rsh_no_tree_spawn 1 \
  --mca orte_leave_session_attached 1 \
  --mca orte_tmpdir_base "$dir" \
  --mca btl self,tcp \
  --mca btl_tcp_if_include "$subnet.0/24" \
  --mca oob_tcp_if_include "$subnet.0/24" \
  --mca mpi_yield_when_idle 1 \
  -x OMP_NUM_THREADS=1 -x SOFTDOT_NETNS_DIR \
  "$@"
