#!/usr/bin/env bash
# Builds bench/peers/softdot_peers (Release) and runs softdot next to XNNPACK,
# oneDNN, Eigen, libtorch, OpenBLAS and Highway's contrib Dot (softmax, dot,
# dots; attention: libtorch, OpenBLAS + Eigen, a naive loop), then prints the
# tables of scripts/peers_report.py and writes its SVG charts.
#
# Two runs of the same binary, each writing its own JSON next to it (and run
# 1b between them: PyTorch 2 from Python, see PEERS_TORCH2 below):
#   1. every single-thread benchmark, pinned to one core
#      (taskset -c $BENCH_CPU, SOFTDOT_PEERS_SET=single), the 1-thread
#      attention and decode benchmarks included;
#   2. the threads/ benchmarks (softdot at 1 and 2 OpenMP threads) and the
#      2-thread attention and decode benchmarks (softdot and the attention
#      peers with OpenMP, libtorch and OpenBLAS at 2 threads) on the first two
#      cores (SOFTDOT_PEERS_SET=threads): under the one-core pin of run 1 two
#      threads would only take turns. Skipped on a 1-CPU machine.
# 3 repetitions, medians only. Extra arguments go to both runs, e.g.
#   bash scripts/peers.sh --benchmark_filter=softmax/memory
#   bash scripts/peers.sh --benchmark_filter='^(attention|decode)/'  # attention only
# The attention benchmarks (bench/peers/attention_cases.cc) add one to two
# minutes per run (libtorch's SDPA takes about 1 s per call at n = 4096);
# peers_report.py prints their tables after the others.
# Settings (environment):
#   BUILD_DIR          build tree (default: build-peers/)
#   BENCH_CPU          core of run 1 (default 1; 0 on a 1-CPU machine)
#   PEERS_THREAD_CPUS  cores of run 2 (default 0,1)
#   PEERS_MIN_TIME     --benchmark_min_time in seconds (default 0.1)
#   PEERS_REPETITIONS  --benchmark_repetitions (default 3)
#   PEERS_SVG          chart path for peers_report.py --svg (default
#                      docs/img/softmax_peers.svg -> ..._cache.svg, ..._memory.svg)
#   SOFTDOT_BENCH_TARGET  e.g. AVX2: softdot's (and Highway's Dot's) SIMD target;
#                      with OPENBLAS_CORETYPE=Haswell for OpenBLAS's AVX2 kernels
#   PEERS_TIME         real (default) or cpu: the time of the single-thread
#                      tables (cpu leaves out waits for a core on a busy machine)
#   PEERS_TORCH2       0 skips run 1b (PyTorch 2's softmax from Python,
#                      bench/python/softmax_torch2.py, after run 1 on its core);
#                      PEERS_TORCH2_PYTHON a Python with torch 2 and numpy (default:
#                      a venv build-peers/venv-torch2 with ${SOFTDOT_TORCH:-torch==2.13.0})
#   and those of scripts/common.sh (SOFTDOT_JOBS, SOFTDOT_NO_APT, SOFTDOT_CMAKE_ARGS).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

build_dir="${BUILD_DIR:-$SOFTDOT_ROOT/build-peers}"
ncpu="$(nproc)"
cpu="${BENCH_CPU:-$(( ncpu > 1 ? 1 : 0 ))}"
thread_cpus="${PEERS_THREAD_CPUS:-0,1}"
min_time="${PEERS_MIN_TIME:-0.1}"
reps="${PEERS_REPETITIONS:-3}"
svg="${PEERS_SVG:-$SOFTDOT_ROOT/docs/img/softmax_peers.svg}"
time_kind="${PEERS_TIME:-real}"

# The peers (each optional for the build; installed here so all are measured).
# libpthreadpool-dev: xnnpack.h includes pthreadpool.h, but Debian 12's
# libxnnpack-dev does not depend on it. OpenMP comes with GCC (libgomp).
SOFTDOT_PACKAGES+=(
  python3            # scripts/peers_report.py (standard library only)
  libxnnpack-dev libpthreadpool-dev
  libdnnl-dev
  libopenblas-dev
  libeigen3-dev
  libtorch-dev
)
ensure_deps

# Only the benchmark and what it needs (configure_build would build every
# target, the CLI and softdot_bench included).
read -r -a extra <<<"${SOFTDOT_CMAKE_ARGS:-}"
log "configure $build_dir (Release) ${extra[*]}"
cmake -S "$SOFTDOT_ROOT" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSOFTDOT_BUILD_BENCH=ON -DSOFTDOT_BUILD_PEERS=ON -DSOFTDOT_BUILD_TESTS=OFF -DSOFTDOT_BUILD_CLI=OFF "${extra[@]}"
log "build softdot_peers (-j$SOFTDOT_JOBS)"
cmake --build "$build_dir" -j "$SOFTDOT_JOBS" --target softdot_peers
bench="$build_dir/bench/peers/softdot_peers"
[[ -x "$bench" ]] || die "$bench was not built (is libbenchmark-dev installed?)"

common_args=(--benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true
             --benchmark_min_time="$min_time" --benchmark_out_format=json)
json="$build_dir/bench/peers/softdot_peers.json"
json_threads="$build_dir/bench/peers/softdot_peers_threads.json"
rm -f "$json" "$json_threads"
start="$(now)"

log "run 1: SOFTDOT_PEERS_SET=single taskset -c $cpu $bench ${common_args[*]} $*"
SOFTDOT_PEERS_SET=single taskset -c "$cpu" "$bench" "${common_args[@]}" \
  --benchmark_out="$json" "$@"

# Run 1b: PyTorch 2's softmax from Python (bench/python/softmax_torch2.py), on
# the same core, right after run 1; its results file joins the report.
json_torch2="$build_dir/bench/peers/softmax_torch2.json"
rm -f "$json_torch2"
if [[ "${PEERS_TORCH2:-1}" != 0 ]]; then
  torch_py="${PEERS_TORCH2_PYTHON:-}"
  if [[ -z "$torch_py" ]]; then
    torch_py="$build_dir/venv-torch2/bin/python"
    if ! "$torch_py" -c 'import torch, numpy' 2>/dev/null; then
      log "venv $build_dir/venv-torch2: numpy, ${SOFTDOT_TORCH:-torch==2.13.0}"
      "${SOFTDOT_PYTHON:-python3}" -m venv "$build_dir/venv-torch2"
      "$torch_py" -m pip install -q numpy "${SOFTDOT_TORCH:-torch==2.13.0}"
    fi
  fi
  filter=""
  for a in "$@"; do
    [[ "$a" == --benchmark_filter=* ]] && filter="${a#--benchmark_filter=}"
  done
  log "run 1b: taskset -c $cpu softmax_torch2.py (PyTorch 2 from Python)"
  taskset -c "$cpu" "$torch_py" "$SOFTDOT_ROOT/bench/python/softmax_torch2.py" \
    --out "$json_torch2" --min-time "$min_time" --repetitions "$reps" --filter "$filter"
fi

if ((ncpu > 1)); then
  log "run 2: SOFTDOT_PEERS_SET=threads taskset -c $thread_cpus $bench ${common_args[*]} $*"
  SOFTDOT_PEERS_SET=threads taskset -c "$thread_cpus" "$bench" "${common_args[@]}" \
    --benchmark_out="$json_threads" "$@"
else
  log "run 2 skipped: one CPU, no thread scaling to measure"
fi
log "benchmarks took $(( $(now) - start )) s; medians from $json ${json_threads}"

reports=()
for f in "$json" "$json_torch2" "$json_threads"; do
  [[ -s "$f" ]] && reports+=("$f")
done
((${#reports[@]} > 0)) || die "no benchmark results (did --benchmark_filter match nothing?)"
/usr/bin/python3 "$SOFTDOT_ROOT/scripts/peers_report.py" "${reports[@]}" --svg "$svg" \
  --time "$time_kind"
