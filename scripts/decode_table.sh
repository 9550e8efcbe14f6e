#!/usr/bin/env bash
# The decode table of the "attention decode at the memory limit" issue:
# softdot_bench's BM_decode_sweep (bench/attention_bench.cc) on the best SIMD
# target of the machine, then again with SOFTDOT_BENCH_TARGET=AVX2 (skipped
# when the best target is AVX2), printed as one markdown table: bytes of K
# and V read per second, the read roofline measured in the same run over the
# same arena, their ratio and the issue's goal for the format.
#
#   bash scripts/decode_table.sh            # the whole sweep (192 cases per target)
#   bash scripts/decode_table.sh --quick    # n_kv 32768, batch 1, n_q 1 (16 per target)
#   bash scripts/decode_table.sh --quick --benchmark_min_time=0.2
#
# Other arguments go to softdot_bench. Settings (environment):
#   BUILD_DIR              build tree (default build/); softdot_bench is built
#                          there (that target only) when missing
#   DECODE_FILTER          a regex replacing the sweep's filter
#   SOFTDOT_BENCH_MAX_GIB  memory cap of the K/V arena (default 5; cases whose
#                          two copies exceed it are skipped and listed)
# The JSON of each run is kept in $BUILD_DIR/bench/decode_table_<target>.json.
# Needs both cores free for the 2-thread rows: run it on an idle machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"

quick=0
args=()
for a in "$@"; do
  if [[ "$a" == --quick ]]; then quick=1; else args+=("$a"); fi
done
if [[ -n "${DECODE_FILTER:-}" ]]; then
  filter="$DECODE_FILTER"
elif ((quick)); then
  filter='^BM_decode_sweep/[^/]+/H[0-9]+_[0-9]+/nq1/B1/nkv32768/'
else
  filter='^BM_decode_sweep/'
fi

bench="$build_dir/bench/softdot_bench"
if [[ ! -x "$bench" ]]; then
  [[ -f "$build_dir/CMakeCache.txt" ]] ||
    cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DSOFTDOT_BUILD_BENCH=ON >&2
  cmake --build "$build_dir" -j "${SOFTDOT_JOBS:-2}" --target softdot_bench >&2
fi

run() {  # run <json> [target]
  local json="$1" target="${2:-}"
  echo "==> ${target:+SOFTDOT_BENCH_TARGET=$target }$bench --benchmark_filter='$filter' ${args[*]}" >&2
  local cmd=("$bench" --benchmark_filter="$filter" --benchmark_out="$json"
    --benchmark_out_format=json "${args[@]}")
  if [[ -n "$target" ]]; then
    SOFTDOT_BENCH_TARGET="$target" "${cmd[@]}" >&2
  else
    env -u SOFTDOT_BENCH_TARGET "${cmd[@]}" >&2
  fi
}
target_of() {
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["context"].get("simd_target", "?"))' "$1"
}

best_json="$build_dir/bench/decode_table_best.json"
run "$best_json"
best="$(target_of "$best_json")"
jsons=("$best_json")
if [[ "$best" != AVX2 ]]; then
  avx2_json="$build_dir/bench/decode_table_avx2.json"
  run "$avx2_json" AVX2
  jsons+=("$avx2_json")
fi

cpu="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)"
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  commit+="-dirty"
fi
python3 - "$cpu" "$commit" "${jsons[@]}" <<'PY'
import json
import re
import sys

GOAL = {"f32": 0.80, "f16": 0.80, "bf16": 0.80, "bf16q": 0.80, "int8": 0.70, "e4m3": 0.70}
NAME = re.compile(r"BM_decode_sweep/(\w+)/H(\d+)_(\d+)/nq(\d+)/B(\d+)/nkv(\d+)/(\d+)threads?")
cpu, commit, files = sys.argv[1], sys.argv[2], sys.argv[3:]
rows, skipped = [], []
for path in files:
    data = json.load(open(path))
    target = data["context"].get("simd_target", "?")
    for b in data["benchmarks"]:
        m = NAME.search(b["name"])
        if not m:
            continue
        fmt, hq, hkv, nq, batch, nkv, threads = m.groups()
        shape = f"H{hq}/{hkv} nq{nq} B{batch} nkv{nkv}"
        if b.get("error_occurred"):
            skipped.append(f"{shape} {fmt} {threads}t {target}: {b.get('error_message', '')}")
            continue
        frac = b["of_roofline"]
        rows.append((shape, fmt, threads, target, b["GB/s"], b["roofline_GB/s"], frac,
                     GOAL[fmt], b.get("rel_err", float("nan"))))
print(f"Decode, d = 128, K and V from memory; CPU: {cpu}; commit {commit}\n")
print("| shape | format | threads | target | GB/s | roofline GB/s | fraction | goal | rel_err |")
print("|---|---|---:|---|---:|---:|---:|---:|---:|")
for shape, fmt, threads, target, gbs, roof, frac, goal, err in rows:
    mark = "" if frac >= goal else " (below)"
    print(f"| {shape} | {fmt} | {threads} | {target} | {gbs:.2f} | {roof:.2f} | "
          f"{frac:.2f}{mark} | {goal:.2f} | {err:.1e} |")
if skipped:
    print("\nNot run:")
    for s in skipped:
        print(f"- {s}")
PY
