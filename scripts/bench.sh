#!/usr/bin/env bash
# Builds softdot (Release) and runs softdot_bench pinned to one core, 5
# repetitions, medians only; writes the JSON next to the binary and prints a
# compact table (ns per element, GB/s, ratio to the 2R+1W roofline and copy
# loops). Extra arguments go to the benchmark, e.g.
#   bash scripts/bench.sh --benchmark_filter=softmax
# BUILD_DIR overrides the build tree (default: build/); BENCH_CPU the core.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

build_dir="${BUILD_DIR:-$SOFTDOT_ROOT/build}"
# Core 1 by default (core 0 takes more interrupts); core 0 on a 1-CPU machine.
cpu="${BENCH_CPU:-$(( $(nproc) > 1 ? 1 : 0 ))}"

SOFTDOT_PACKAGES+=(python3)  # scripts/bench_table.py (standard library only)
ensure_deps
configure_build "$build_dir" Release -DSOFTDOT_BUILD_BENCH=ON
bench="$build_dir/bench/softdot_bench"
[[ -x "$bench" ]] || die "$bench was not built (is libbenchmark-dev installed?)"

json="$build_dir/bench/softdot_bench.json"
log "taskset -c $cpu $bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true $*"
taskset -c "$cpu" "$bench" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out="$json" --benchmark_out_format=json "$@"
log "medians ($json)"
python3 "$SOFTDOT_ROOT/scripts/bench_table.py" "$json"
