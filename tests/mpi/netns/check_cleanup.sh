#!/usr/bin/env bash
# Checks that a run_netns.sh run killed outright (SIGKILL of the script and
# every process under it, as a ctest timeout or an OOM kill may leave it)
# leaves nothing behind once the next run has run: the next run removes the
# killed run's namespaces, veths, bridge, state file and directory.
# Needs what run_netns.sh needs; exits 77 (skipped) otherwise.
# Usage: check_cleanup.sh   (mpirun from PATH or $MPIRUN)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ((EUID != 0)) || ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
  echo "check_cleanup.sh: needs root and ip netns; skipped" >&2
  exit 77
fi
# The victim: a run whose program sleeps, so it is killed mid-way.
bash "$here/run_netns.sh" 2 sleep 60 >/dev/null 2>&1 &
victim=$!
# Wait until it has made its namespaces: its bridge (the state file that
# holds its PID names it) and its second namespace exist.
br=
for ((t = 0; t < 300; t++)); do
  br="$(grep -lx "$victim" /run/softdot-netns/sdbr* 2>/dev/null | head -n 1 || true)"
  br="${br##*/}"
  [[ -n "$br" && -e "/run/netns/sdns${br#sdbr}-1" ]] && break
  sleep 0.1
done
if [[ -z "$br" ]]; then
  echo "check_cleanup.sh: the victim run did not start" >&2
  kill -KILL "$victim" 2>/dev/null || true
  exit 1
fi
sleep 1
id="${br#sdbr}"
# SIGKILL for the script and every process under it (timeout, mpirun, the
# agents and daemons, which stay attached): none can clean up.
tree() {
  local p c
  for p in "$@"; do
    echo "$p"
    for c in $(pgrep -P "$p" || true); do tree "$c"; done
  done
}
kill -KILL $(tree "$victim") 2>/dev/null || true
wait "$victim" 2>/dev/null || true
left() {
  ip netns list | grep "^sdns$id-" || true
  ip -o link show | awk -F': ' '{print $2}' | grep -E "^sd(v|br)$id" || true
  ls -d "/run/softdot-netns/sdbr$id" "/tmp/softdot-netns-$id".* 2>/dev/null || true
}
if [[ -z "$(left)" ]]; then
  echo "check_cleanup.sh: the killed run left nothing to clean: not a test" >&2
  exit 1
fi
# The next run (a program that does nothing) cleans up.
bash "$here/run_netns.sh" 2 true
if [[ -n "$(left)" ]]; then
  echo "check_cleanup.sh: left behind by the killed run $id:" >&2
  left >&2
  exit 1
fi
echo "check_cleanup.sh: the killed run $id left nothing behind"
