#!/usr/bin/env bash
# Cross-builds softdot for 64-bit Arm (aarch64) with Debian's cross compiler
# and arm64 multiarch packages, and runs its C++ tests under qemu-user:
# the NEON target, then the same tests with SVE CPUs of 128, 256 and 512 bits
# (softdot leaves SVE out, so NEON must be picked there too). Installs what
# it needs (dpkg --add-architecture arm64, apt-get) when something is missing.
#
#   bash scripts/test_arm64.sh        # every C++ test (about 20 minutes on 2 cores)
#   bash scripts/test_arm64.sh --ci   # the subset scripts/test.sh runs
#
# The whole suite includes the command's tests: they start the aarch64
# `softdot` through the same emulator (tests/cli/CMakeLists.txt passes
# CMAKE_CROSSCOMPILING_EMULATOR to them), since nothing registers qemu with
# the kernel here; unit tests get 3600 s each instead of 600 (the slowest,
# AttentionUnits.WithinBoundAndHardwareMatchesModel, takes about 300 s under
# qemu). MPI is off in the cross build (no arm64 Open MPI is installed).
#
# --ci builds and runs the tests that compare bits with x86 and check the
# dispatch: the golden files (tests/golden_test: the same outputs, bit for
# bit, as x86's AVX2 and AVX-512 produce), the seed's worked examples, the
# special values, dot products and the target list; the SVE runs take the
# dispatch test. Ends with "test_arm64.sh: N passed, 0 failed".
# BUILD_ARM64_DIR overrides the build tree (default build-arm64/).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ci=0
for a in "$@"; do
  case "$a" in
    --ci) ci=1 ;;
    *) die "usage: bash scripts/test_arm64.sh [--ci]" ;;
  esac
done
build_dir="${BUILD_ARM64_DIR:-$SOFTDOT_ROOT/build-arm64}"
start=$SECONDS

# Host tools and the arm64 libraries softdot and its tests link.
host_packages=(g++-aarch64-linux-gnu qemu-user cmake ninja-build libcli11-dev)
arm_packages=(libhwy-dev libgtest-dev libmpfr-dev libgmp-dev libgomp1 libstdc++6)
missing=()
for p in "${host_packages[@]}"; do
  st="$(dpkg-query -W -f='${db:Status-Status}' "$p:$(dpkg --print-architecture)" 2>/dev/null ||
    dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
  [[ "$st" == installed ]] || missing+=("$p")
done
for p in "${arm_packages[@]}"; do
  st="$(dpkg-query -W -f='${db:Status-Status}' "$p:arm64" 2>/dev/null || true)"
  [[ "$st" == installed ]] || missing+=("$p:arm64")
done
if ((${#missing[@]})); then
  [[ "${SOFTDOT_NO_APT:-0}" == 1 ]] && die "missing packages (SOFTDOT_NO_APT=1): ${missing[*]}"
  ((EUID == 0)) || die "missing packages ${missing[*]}; run as root"
  export DEBIAN_FRONTEND=noninteractive
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    log "dpkg --add-architecture arm64"
    dpkg --add-architecture arm64
  fi
  log "installing: ${missing[*]}"
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}" </dev/null
fi

subset_targets=(softdot_golden_test softdot_seed_test softdot_special_values_test
  softdot_dot_test softdot_simd_test)
subset_regex='Golden|Seed|SpecialValues|Dot|Simd|Dispatch'

log "configure $build_dir (aarch64, Release)"
cmake -S "$SOFTDOT_ROOT" -B "$build_dir" -G Ninja \
  -DCMAKE_TOOLCHAIN_FILE="$SOFTDOT_ROOT/cmake/toolchain-aarch64.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DSOFTDOT_WERROR=ON -DSOFTDOT_BUILD_TESTS=ON \
  -DSOFTDOT_BUILD_BENCH=OFF -DSOFTDOT_MPI=OFF
if ((ci)); then
  log "build $build_dir: ${subset_targets[*]} (-j$SOFTDOT_JOBS)"
  cmake --build "$build_dir" -j "$SOFTDOT_JOBS" --target "${subset_targets[@]}"
else
  log "build $build_dir (-j$SOFTDOT_JOBS)"
  cmake --build "$build_dir" -j "$SOFTDOT_JOBS"
fi
built_s=$((SECONDS - start))

total=0
# run_ctest LABEL [ctest arguments...]: runs ctest under qemu, adds the
# number of tests to $total; fails on any failure or on no tests.
run_ctest() {
  local label="$1" log_file n
  shift
  log_file="$build_dir/ctest-${label//[^A-Za-z0-9]/_}.log"
  log "ctest $label"
  ctest --test-dir "$build_dir" --output-on-failure --no-tests=error \
    -j "$SOFTDOT_JOBS" --timeout 1800 "$@" 2>&1 | tee "$log_file"
  n="$(sed -n 's/^100% tests passed\(, 0 tests failed\)\{0,1\} out of \([0-9]*\).*/\2/p' "$log_file" | tail -1)"
  [[ -n "$n" ]] || die "$label: could not read the test count from $log_file"
  total=$((total + n))
  log "$label: $n tests passed"
}

# NEON: the default qemu CPU (cortex-a57 class, no SVE).
unset QEMU_CPU
if ((ci)); then
  run_ctest "NEON" -R "$subset_regex"
else
  run_ctest "NEON" -E 'consumer_'
fi
# SVE at 128, 256 and 512 bits (sve-default-vector-length is in bytes): the
# build has no SVE code, so the dispatch must pick NEON
# (SimdTargets.ArmPicksNeon in tests/unit/simd_test.cc).
for bytes in 16 32 64; do
  export QEMU_CPU="max,sve-default-vector-length=$bytes"
  run_ctest "SVE $((bytes * 8)) bits" -R 'Simd|Golden'
done
unset QEMU_CPU

log "aarch64: built in ${built_s}s, total $(((SECONDS - start) / 60))m$(((SECONDS - start) % 60))s"
echo "test_arm64.sh: ${total} passed, 0 failed"
