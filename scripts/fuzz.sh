#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan + UBSan + fuzzer
# coverage, one Highway target: AVX2) and runs each for SECONDS from its
# committed corpus. Fails on any crash, leak, timeout or failed check, and
# prints where the reproducer was saved. docs/fuzzing.md has the details.
#
#   bash scripts/fuzz.sh 60                 # every target, 60 s each
#   bash scripts/fuzz.sh 3600 fuzz_npy      # one target for an hour
#   FUZZ_KEEP=1 FUZZ_MERGE=1 bash scripts/fuzz.sh 3600   # a campaign: see below
#
# Settings (environment):
#   FUZZ_BUILD_DIR  the build tree (default build-fuzz/)
#   FUZZ_WORK_DIR   where each run's corpus copy, log and crashes go
#                   (default $FUZZ_BUILD_DIR/fuzz-work)
#   FUZZ_PARALLEL   targets run at once (default: SOFTDOT_JOBS, 2)
#   FUZZ_SEED, FUZZ_RUNS  a fixed libFuzzer seed and at most this many inputs
#                   per target: the run is then the same sequence of inputs
#                   on every machine (scripts/test.sh uses it, so that CI
#                   fails only on a change, never on a lucky find; finding
#                   new faults is what longer runs without them are for)
#   FUZZ_KEEP=1     keep each work directory's corpus from earlier runs (the
#                   committed one is copied in beside it), so that runs add up
#   FUZZ_MERGE=1    when every target passed, add to fuzz/corpus/<target>/ the
#                   work corpus's inputs that cover edges the committed corpus
#                   does not (libFuzzer -merge=1 -use_counters=0); commit them
# Without FUZZ_MERGE the committed corpus (fuzz/corpus/<target>/) is only
# read. Each target's line gives its executions, coverage and the CPU time
# its fuzzer used (user + sys, every thread). Ends with
# "fuzz.sh: N passed, M failed".
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

seconds="${1:-}"
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 0 ]] ||
  die "usage: bash scripts/fuzz.sh SECONDS [target...] (SECONDS a positive integer)"
shift
all_targets=(fuzz_npy fuzz_csv fuzz_parse fuzz_attention fuzz_paged fuzz_request fuzz_backward fuzz_rows16)
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || die "unknown target $t (known: ${all_targets[*]})"
done

build_dir="${FUZZ_BUILD_DIR:-$SOFTDOT_ROOT/build-fuzz}"
work_dir="${FUZZ_WORK_DIR:-$build_dir/fuzz-work}"
parallel="${FUZZ_PARALLEL:-$SOFTDOT_JOBS}"

ensure_deps
command -v clang++ >/dev/null || die "clang++ not found (Debian package clang)"
configure_build "$build_dir" RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DSOFTDOT_BUILD_FUZZ=ON -DSOFTDOT_WERROR=ON \
  -DSOFTDOT_BUILD_TESTS=OFF -DSOFTDOT_BUILD_BENCH=OFF -DSOFTDOT_MPI=OFF

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=$(lsan_works clang++ && echo 1 || echo 0)}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}"

# run_one TARGET: fuzzes TARGET for $seconds; its status is libFuzzer's.
run_one() {
  local t="$1" dir="$work_dir/$1" f st=0
  [[ -n "${FUZZ_KEEP:-}" ]] || rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/crashes"
  for f in "$SOFTDOT_ROOT/fuzz/corpus/$t/"*; do
    [[ -e "$dir/corpus/${f##*/}" ]] || cp "$f" "$dir/corpus/"
  done
  local fixed=()
  [[ -n "${FUZZ_SEED:-}" ]] && fixed+=(-seed="$FUZZ_SEED")
  [[ -n "${FUZZ_RUNS:-}" ]] && fixed+=(-runs="$FUZZ_RUNS")
  "$build_dir/fuzz/$t" "$dir/corpus" -max_total_time="$seconds" -timeout=30 \
    -rss_limit_mb=2048 -artifact_prefix="$dir/crashes/" -print_final_stats=1 \
    "${fixed[@]}" >"$dir/log" 2>&1 || st=$?
  # The CPU of this subshell's children, the fuzzer (and a few cp): `times`
  # in this process (a pipe or $(...) would fork one whose children have none).
  times >"$dir/times"
  awk 'NR == 2 { split($1, u, "[ms]"); split($2, s, "[ms]");
    printf "%.1f\n", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$dir/times" >"$dir/cpu"
  return "$st"
}

log "fuzzing ${targets[*]} for ${seconds}s each, $parallel at a time; logs in $work_dir/<target>/log"
declare -A status
pids=()
names=()
next=0
while ((next < ${#targets[@]})) || ((${#pids[@]})); do
  while ((next < ${#targets[@]} && ${#pids[@]} < parallel)); do
    run_one "${targets[next]}" &
    pids+=($!)
    names+=("${targets[next]}")
    next=$((next + 1))
  done
  # Wait for the oldest run.
  st=0
  wait "${pids[0]}" || st=$?
  status[${names[0]}]=$st
  pids=("${pids[@]:1}")
  names=("${names[@]:1}")
done

passed=0
failed=0
for t in "${targets[@]}"; do
  dir="$work_dir/$t"
  stats="$(grep -E '^(#[0-9]+\s+DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$dir/log" | tr -s ' ' | tr '\n' ' ')"
  cov="$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9A-Za-z]+' "$dir/log" | tail -1)"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log")"
  if ((status[$t] == 0)); then
    passed=$((passed + 1))
    log "$t: OK, ${execs:-?} executions (at most ${seconds}s, CPU $(cat "$dir/cpu" 2>/dev/null || echo ?) s), $cov"
  else
    failed=$((failed + 1))
    log "$t: FAILED (status ${status[$t]}); reproducer(s): $(ls "$dir/crashes" 2>/dev/null | sed "s|^|$dir/crashes/|" | tr '\n' ' ')"
    grep -E 'ERROR|check failed|SUMMARY|runtime error' "$dir/log" | head -5 >&2 || true
  fi
  : "$stats"
done
if [[ -n "${FUZZ_MERGE:-}" ]] && ((failed == 0)); then
  for t in "${targets[@]}"; do
    dir="$work_dir/$t"
    rm -rf "$dir/merged"
    mkdir -p "$dir/merged"
    cp "$SOFTDOT_ROOT/fuzz/corpus/$t/"* "$dir/merged/"
    before=$(find "$dir/merged" -type f | wc -l)
    "$build_dir/fuzz/$t" -merge=1 -use_counters=0 -timeout=30 -rss_limit_mb=2048 \
      "$dir/merged" "$dir/corpus" >"$dir/merge.log" 2>&1 || die "$t: merge failed ($dir/merge.log)"
    for f in "$dir/merged/"*; do
      [[ -e "$SOFTDOT_ROOT/fuzz/corpus/$t/${f##*/}" ]] || cp "$f" "$SOFTDOT_ROOT/fuzz/corpus/$t/"
    done
    log "$t: corpus $before -> $(find "$SOFTDOT_ROOT/fuzz/corpus/$t" -type f | wc -l) files ($(grep -oE '[0-9]+ new coverage edges' "$dir/merge.log" | tail -1 || echo '0 new coverage edges'))"
  done
fi
echo "fuzz.sh: ${passed} passed, ${failed} failed"
((failed == 0))
