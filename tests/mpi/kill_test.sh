#!/usr/bin/env bash
# A rank killed with SIGKILL at a random point of the ring forward /
# backward, or (MODE vocab) of the vocabulary-split cross_entropy and
# linear_cross_entropy (softdot_mpi_ring_kill_test): mpirun must end the
# whole job, exit non-zero and name the lost rank, within LIMIT seconds
# (never hang).
# Usage: kill_test.sh MPIRUN PROGRAM P BTL [SEED [MODE]]
# (SEED empty or "random": a random one; MODE ring, the default, or vocab).
set -u
mpirun=$1 prog=$2 p=$3 btl=$4
seed=${5:-random}
[[ $seed == random ]] && seed=$RANDOM
mode=${6:-ring}
RANDOM=$seed
victim=$((RANDOM % p))
delay=$((50 + RANDOM % 1500))
limit=30
echo "kill_test: $mode, P = $p, btl $btl, rank $victim killed after $delay ms (seed $seed)"
start=$(date +%s)
out=$(timeout --kill-after=5 $limit "$mpirun" --allow-run-as-root --oversubscribe \
  --mca btl "$btl" --mca btl_tcp_if_include lo --mca mpi_yield_when_idle 1 \
  -x OMP_NUM_THREADS=1 -np "$p" "$prog" "$victim" "$delay" "$mode" 2>&1)
rc=$?
elapsed=$(($(date +%s) - start))
echo "$out" | tail -n 8
echo "kill_test: mpirun exit status $rc after $elapsed s"
if [[ $rc -eq 0 ]]; then
  echo "kill_test: FAILED: the job succeeded although rank $victim was killed" >&2
  exit 1
fi
if [[ $rc -eq 124 || $rc -eq 137 && $elapsed -ge $limit ]]; then
  echo "kill_test: FAILED: the job hung (killed by the $limit s timeout)" >&2
  exit 1
fi
if ! grep -Eq "process rank $victim .*(signal 9|Killed)" <<<"$out"; then
  echo "kill_test: FAILED: no message naming the lost rank $victim" >&2
  exit 1
fi
echo "kill_test: OK"
