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
# Settings (environment): STRESS_PARTS (default "1 2 3 4 5": the parts to
# run, by number), STRESS_BUILD_DIR (default build/, a Release tree
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
parts=" ${STRESS_PARTS:-1 2 3 4 5} "
part() { [[ $parts == *" $1 "* ]]; }
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
if ! part 1; then
  :
elif [[ -x $prog ]]; then
  run_part cxx_threads env OMP_NUM_THREADS=2 nice -n 10 "$prog" --seconds "$seconds" --threads 8
  rc=$?
  record "C++ threads" $rc $part_s "$(grep -a '^threads_stress: threads=' "$log_file" | tail -n 1)"
else
  record "C++ threads" 1 0 "$prog not built"
fi

# 2. Python threads.
if part 2; then
  run_part python_threads env OMP_NUM_THREADS=2 nice -n 10 "$python" "$root/scripts/stress_threads.py" --seconds "$seconds"
  rc=$?
  record "Python threads" $rc $part_s "$(grep -a '^stress_threads: threads=' "$log_file" | tail -n 1)"
fi

# kill_jobs NAME PROGRAM SCRIPT MODE...: SCRIPT (kill_test.sh or
# cli_ring_kill_test.py: MPIRUN PROGRAM P BTL SEED MODE) for every seed, MODE,
# P in {2, 4} and btl; records NAME with the count of failed jobs and the
# slowest.
kill_jobs() {
  local name=$1 prog=$2 script=$3 runs=0 bad=0 worst=0 t0=$SECONDS seed mode p btl rc
  shift 3
  local modes=("$@") runner=(bash)
  [[ $script == *.py ]] && runner=(python3)
  for seed in $(seq 1 "$seeds"); do
    for mode in "${modes[@]}"; do
      for p in 2 4; do
        for btl in self,vader self,tcp; do
          run_part "$name: $mode p$p $btl seed $seed" nice -n 10 "${runner[@]}" "$script" \
            "$mpirun" "$prog" "$p" "$btl" "$seed" "$mode"
          rc=$?
          runs=$((runs + 1))
          [[ $rc -ne 0 ]] && bad=$((bad + 1))
          ((part_s > worst)) && worst=$part_s
        done
      done
    done
  done
  record "$name" $((bad > 0)) $((SECONDS - t0)) \
    "$runs jobs (seeds 1-$seeds x ${modes[*]} x P 2, 4 x shm, tcp), $bad failed, the slowest took $worst s (limit 30 s after the kill)"
}

# 3. MPI: a rank killed.
kill_prog="$build/tests/mpi/softdot_mpi_ring_kill_test"
mpirun="$(command -v mpirun || true)"
if ! part 3; then
  :
elif [[ -x $kill_prog && -n $mpirun ]]; then
  kill_jobs "MPI rank killed" "$kill_prog" "$root/tests/mpi/kill_test.sh" ring vocab
else
  record "MPI rank killed" 0 0 "skipped: softdot::mpi or mpirun not built"
  passed=$((passed - 1))
fi

# 4. MPI: a rank of the command's ring run killed (the job's time includes
# the script's run without a kill).
cli="$build/cli/softdot"
if ! part 4; then
  :
elif [[ -x $cli && -x $kill_prog && -n $mpirun ]]; then
  kill_jobs "MPI command rank killed" "$cli" "$root/tests/mpi/cli_ring_kill_test.py" \
    attention cross-entropy
else
  record "MPI command rank killed" 0 0 "skipped: the command with softdot::mpi or mpirun not built"
  passed=$((passed - 1))
fi

# 5. The command under faults and signals.
cli_test="$build/tests/cli/softdot_cli_test"
if ! part 5; then
  :
elif [[ -x $cli_test ]]; then
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
