#!/usr/bin/env bash
# The long forms of the concurrency and fault tests (issue 29; CI runs each
# for a few seconds): prints one record per part, and "stress.sh: N passed,
# M failed" at the end. docs/limits.md, "Reliability", has the records.
#
#   bash scripts/stress.sh                # 600 s each for the thread runs
#   STRESS_SECONDS=180 bash scripts/stress.sh
#
#   1. C++ threads: build/tests/stress/softdot_threads_stress, 8 callers,
#      OMP_NUM_THREADS=2, STRESS_SECONDS (default 600).
#   2. Python threads: scripts/stress_threads.py, the same, with the package
#      importable by STRESS_PYTHON (default python3; set PYTHONPATH to a
#      built package), STRESS_SECONDS.
#   3. MPI: tests/mpi/kill_test.sh, a rank SIGKILLed at a random point, for
#      STRESS_KILL_SEEDS seeds (default 10) x {ring, vocab} x P {2, 4} x
#      {shared memory, TCP}: each job must end non-zero naming the lost rank
#      within the script's 30 s limit. (Only where softdot::mpi is built.)
#   4. MPI, the command: tests/mpi/cli_ring_kill_test.py, a rank of
#      `mpirun softdot attention --ring` / `softdot cross-entropy --ring`
#      SIGKILLed at a random moment, STRESS_KILL_SEEDS seeds x both commands
#      x P {2, 4} x {shared memory, TCP}: each job must end non-zero naming
#      the lost rank within 30 s, each output path old or whole.
#   5. The command: softdot_cli_test's CliFaults.* (concurrent writers, a
#      full tmpfs, a read-only tmpfs) and CliSignal.* repeated
#      STRESS_CLI_REPEAT times (default 20).
#
# Settings (environment): STRESS_BUILD_DIR (default build/, a Release tree
# with the tests built), STRESS_LOG (default $STRESS_BUILD_DIR/stress.log:
# every part's whole output). Runs under `nice -n 10`: the CPU is shared.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${STRESS_BUILD_DIR:-$root/build}"
seconds="${STRESS_SECONDS:-600}"
seeds="${STRESS_KILL_SEEDS:-10}"
repeat="${STRESS_CLI_REPEAT:-20}"
python="${STRESS_PYTHON:-python3}"
log_file="${STRESS_LOG:-$build/stress.log}"
: >"$log_file"
passed=0 failed=0
records=()

record() {  # record NAME STATUS SECONDS TEXT
  local verdict=OK
  if [[ $2 -ne 0 ]]; then verdict="FAILED (status $2)"; failed=$((failed + 1)); else passed=$((passed + 1)); fi
  records+=("$1: $verdict in $3 s: $4")
  printf 'stress.sh: %s: %s in %s s: %s\n' "$1" "$verdict" "$3" "$4"
}

run_part() {  # run_part NAME COMMAND...: runs it, logs it, returns status
  local name=$1
  shift
  printf '\n==== %s: %s\n' "$name" "$*" >>"$log_file"
  local t0=$SECONDS
  "$@" >>"$log_file" 2>&1
  local rc=$?
  part_s=$((SECONDS - t0))
  return $rc
}

echo "stress.sh: $(date -u +%FT%TZ), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p')"

# 1. C++ threads.
prog="$build/tests/stress/softdot_threads_stress"
if [[ -x $prog ]]; then
  run_part cxx_threads env OMP_NUM_THREADS=2 nice -n 10 "$prog" --seconds "$seconds" --threads 8
  rc=$?
  record "C++ threads" $rc $part_s "$(grep -a '^threads_stress: threads=' "$log_file" | tail -n 1)"
else
  record "C++ threads" 1 0 "$prog not built"
fi

# 2. Python threads.
run_part python_threads env OMP_NUM_THREADS=2 nice -n 10 "$python" "$root/scripts/stress_threads.py" --seconds "$seconds"
rc=$?
record "Python threads" $rc $part_s "$(grep -a '^stress_threads: threads=' "$log_file" | tail -n 1)"

# 3. MPI: a rank killed.
kill_prog="$build/tests/mpi/softdot_mpi_ring_kill_test"
mpirun="$(command -v mpirun || true)"
if [[ -x $kill_prog && -n $mpirun ]]; then
  runs=0 bad=0 worst=0 t0=$SECONDS
  for seed in $(seq 1 "$seeds"); do
    for mode in ring vocab; do
      for p in 2 4; do
        for btl in self,vader self,tcp; do
          run_part "kill $mode p$p $btl seed $seed" nice -n 10 bash "$root/tests/mpi/kill_test.sh" \
            "$mpirun" "$kill_prog" "$p" "$btl" "$seed" "$mode"
          rc=$?
          runs=$((runs + 1))
          [[ $rc -ne 0 ]] && bad=$((bad + 1))
          ((part_s > worst)) && worst=$part_s
        done
      done
    done
  done
  record "MPI rank killed" $((bad > 0)) $((SECONDS - t0)) \
    "$runs jobs (seeds 1-$seeds x ring, vocab x P 2, 4 x shm, tcp), $bad failed, the slowest ended in $worst s (limit 30 s)"
else
  record "MPI rank killed" 0 0 "skipped: softdot::mpi or mpirun not built"
  passed=$((passed - 1))
fi

# 4. MPI: a rank of the command's ring run killed.
cli="$build/cli/softdot"
if [[ -x $cli && -x $kill_prog && -n $mpirun ]]; then
  runs=0 bad=0 worst=0 t0=$SECONDS
  for seed in $(seq 1 "$seeds"); do
    for command in attention cross-entropy; do
      for p in 2 4; do
        for btl in self,vader self,tcp; do
          run_part "command kill $command p$p $btl seed $seed" nice -n 10 python3 \
            "$root/tests/mpi/cli_ring_kill_test.py" "$mpirun" "$cli" "$p" "$btl" "$command" "$seed"
          rc=$?
          runs=$((runs + 1))
          [[ $rc -ne 0 ]] && bad=$((bad + 1))
          ((part_s > worst)) && worst=$part_s
        done
      done
    done
  done
  record "MPI command rank killed" $((bad > 0)) $((SECONDS - t0)) \
    "$runs jobs (seeds 1-$seeds x attention, cross-entropy x P 2, 4 x shm, tcp), $bad failed, the slowest took $worst s (reference run included; limit 30 s after the kill)"
else
  record "MPI command rank killed" 0 0 "skipped: the command with softdot::mpi or mpirun not built"
  passed=$((passed - 1))
fi

# 5. The command under faults and signals.
cli_test="$build/tests/cli/softdot_cli_test"
if [[ -x $cli_test ]]; then
  run_part cli_faults nice -n 10 "$cli_test" --gtest_filter='CliFaults.*:Signals/CliSignal.*' \
    --gtest_repeat="$repeat" --gtest_brief=1
  rc=$?
  skipped=$(grep -ac 'SKIPPED \]' "$log_file" || true)
  record "CLI faults" $rc $part_s "CliFaults.* and CliSignal.* x $repeat, $skipped skipped"
else
  record "CLI faults" 1 0 "$cli_test not built"
fi

echo
echo "stress.sh: records (the whole output in $log_file):"
for r in "${records[@]}"; do echo "  $r"; done
echo "stress.sh: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
