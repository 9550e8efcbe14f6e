#!/usr/bin/env bash
# Installs what softdot needs, checks the C++ formatting (scripts/format.sh),
# then builds and runs the whole test suite:
#   1. build/         Release, warnings are errors; clang-tidy on its
#                     compile_commands.json (scripts/tidy.sh), findings are errors;
#   2. build/python/  the Python package: `pip wheel .`, the wheel in a fresh
#                     venv, the wheel repaired into a manylinux wheel
#                     (scripts/wheel.sh) and imported with the system's
#                     libhwy and libgomp hidden, ruff and mypy, pytest on
#                     tests/python (scripts/python.sh);
#   3. build-asan/    clang, RelWithDebInfo with AddressSanitizer +
#                     UndefinedBehaviorSanitizer, warnings are errors, the
#                     x86 kernels for SCALAR, AVX2 and AVX3 (SSSE3 and SSE4
#                     are built and tested in step 1): the clang build and the
#                     sanitizer build in one tree;
#   4. build-fuzz/    the libFuzzer targets, 30000 fixed-seed inputs each,
#                     and their corpora as regression tests (scripts/fuzz.sh);
#   5. build-arm64/   aarch64 cross build, the bit-comparison subset under
#                     qemu-user (scripts/test_arm64.sh --ci).
# So every test runs with g++ (step 1) and with clang (step 3), and every
# SIMD target is tested (x86 in step 1, NEON and SVE in step 5).
# The x86 runs include the consumer-package test (tests/consumer: cmake
# --install, then find_package(softdot) and pkg-config from a separate project).
# Usage: bash scripts/test.sh   (from a clone, as root). This is what CI runs.
# BUILD_DIR / ASAN_BUILD_DIR override those build trees.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$(dirname "${BASH_SOURCE[0]}")/python.sh"

release_dir="${BUILD_DIR:-$SOFTDOT_ROOT/build}"
asan_dir="${ASAN_BUILD_DIR:-$SOFTDOT_ROOT/build-asan}"
start=$SECONDS

# run_suite BUILD_DIR LABEL: runs ctest, fails on any failure or on an empty
# suite, and adds the number of tests to $total_tests.
total_tests=0
run_suite() {
  local dir="$1" label="$2" log="$1/ctest.log"
  local listed
  listed="$(ctest --test-dir "$dir" -N)"
  grep -q 'consumer_find_package' <<<"$listed" ||
    die "$label: the consumer_find_package test is not registered"
  log "ctest $label"
  # The pipeline's status is ctest's (pipefail); tee keeps a copy of the log.
  ctest --test-dir "$dir" --output-on-failure --no-tests=error \
    -j "$SOFTDOT_JOBS" --timeout 900 2>&1 | tee "$log"
  local n
  # "100% tests passed, 0 tests failed out of N" (CMake 3) or "100% tests
  # passed out of N" (CMake 4, which pip installs on some machines).
  n="$(sed -n 's/^100% tests passed\(, 0 tests failed\)\{0,1\} out of \([0-9]*\).*/\2/p' "$log" | tail -1)"
  [[ -n "$n" ]] || die "$label: could not read the test count from $log"
  total_tests=$((total_tests + n))
  log "$label: $n tests passed"
}

ensure_deps

# 0. Every C++ file formatted with .clang-format; the structure's limits
# (docs/design.md, "Size"): no function over 150 lines, no product file
# over 700, no import circle among the Python modules.
bash "$SOFTDOT_ROOT/scripts/format.sh" --check
"${SOFTDOT_PYTHON:-python3}" "$SOFTDOT_ROOT/scripts/structure.py" --check ||
  die "structure.py: a limit of docs/design.md, \"Size\", is exceeded (above)"

# 1. Release, and clang-tidy with the tree's compile_commands.json.
t0=$SECONDS
# SOFTDOT_PYTHON and SOFTDOT_INSTALL_CXX stated: step 2 builds the wheel in
# this tree (which turns the one on and the other off), and a second run
# must test the same tree as the first.
configure_build "$release_dir" Release -DSOFTDOT_WERROR=ON -DSOFTDOT_BUILD_TESTS=ON \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DSOFTDOT_PYTHON=OFF -DSOFTDOT_INSTALL_CXX=ON \
  -DSOFTDOT_BUILD_CLI=ON -DSOFTDOT_BUILD_BENCH=ON -DSOFTDOT_PYTHON_BENCH=OFF
t1=$SECONDS
bash "$SOFTDOT_ROOT/scripts/tidy.sh" "$release_dir"
tidy_s=$((SECONDS - t1))
run_suite "$release_dir" "Release"
release_s=$((SECONDS - t0 - tidy_s))

# 2. The Python package.
t0=$SECONDS
python_suite "$release_dir/python" "$release_dir"
total_tests=$((total_tests + python_tests))
python_s=$((SECONDS - t0))

# 3. ASan + UBSan, with clang (its warnings as errors: the tree is also the
# clang build). Any report aborts the test (abort_on_error), so ctest counts
# it as a failure. LeakSanitizer needs ptrace-like access that some VMs and
# containers deny; probe it and switch leak checks off only where it cannot
# run. scripts/lsan.supp names the one leak that is not softdot's (the
# OpenMP runtime's). UBSan's checks are the "undefined" group, as g++ has
# it: clang's float-cast-overflow (a float to integer conversion out of
# range), which g++ does not put in the group, is left out too (the SIMD
# conversions define that case; HWY_SCALAR's, a C++ cast, is kept in range
# by the kernels: src/kernels/exp-inl.h).
t0=$SECONDS
detect_leaks=0
lsan_works clang++ && detect_leaks=1
((detect_leaks)) || log "LeakSanitizer does not work here: leak checks are off"
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=${detect_leaks}:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$SOFTDOT_ROOT/scripts/lsan.supp:print_suppressions=0"
# -g1 (line tables): every frame of a report still names its function, file
# and line, and the tree compiles and links faster than with full -g (the
# kernels' many Highway targets carry large debug information).
configure_build "$asan_dir" RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DSOFTDOT_SANITIZE=ON -DSOFTDOT_WERROR=ON \
  -DSOFTDOT_FEWER_TARGETS=ON -DSOFTDOT_BUILD_TESTS=ON -DSOFTDOT_BUILD_BENCH=OFF \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
run_suite "$asan_dir" "clang ASan+UBSan"
asan_s=$((SECONDS - t0))

# 4. Fuzzing: every libFuzzer target from its corpus, seed 1, at most 30000
# inputs or ${SOFTDOT_FUZZ_SECONDS:-60} s each (scripts/fuzz.sh builds
# build-fuzz/; the same inputs on every machine, so CI fails only on a
# change), then each committed corpus once more as a regression test (ctest
# fuzz_seeds_<target>).
t0=$SECONDS
unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
fuzz_log="$(mktemp)"
FUZZ_SEED="${FUZZ_SEED:-1}" FUZZ_RUNS="${FUZZ_RUNS:-30000}" \
  bash "$SOFTDOT_ROOT/scripts/fuzz.sh" "${SOFTDOT_FUZZ_SECONDS:-60}" 2>&1 | tee "$fuzz_log"
fuzz_n="$(sed -n 's/^fuzz.sh: \([0-9]*\) passed, 0 failed$/\1/p' "$fuzz_log")"
[[ -n "$fuzz_n" ]] || die "fuzz.sh: no pass line"
total_tests=$((total_tests + fuzz_n))
ctest --test-dir "$SOFTDOT_ROOT/build-fuzz" --output-on-failure --no-tests=error -L fuzz
total_tests=$((total_tests + $(ctest --test-dir "$SOFTDOT_ROOT/build-fuzz" -N -L fuzz | sed -n 's/^Total Tests: //p')))
fuzz_s=$((SECONDS - t0))

# 5. Arm64: cross-built, the tests that compare bits with x86 run under
# qemu-user on NEON and on SVE CPUs (scripts/test_arm64.sh --ci).
t0=$SECONDS
arm_log="$(mktemp)"
bash "$SOFTDOT_ROOT/scripts/test_arm64.sh" --ci 2>&1 | tee "$arm_log"
arm_n="$(sed -n 's/^test_arm64.sh: \([0-9]*\) passed, 0 failed$/\1/p' "$arm_log")"
[[ -n "$arm_n" ]] || die "test_arm64.sh: no pass line"
total_tests=$((total_tests + arm_n))
arm_s=$((SECONDS - t0))
rm -f "$fuzz_log" "$arm_log"

elapsed=$((SECONDS - start))
log "Release ${release_s}s, clang-tidy ${tidy_s}s, Python ${python_s}s (${python_tests} tests), clang ASan+UBSan ${asan_s}s (detect_leaks=${detect_leaks}), fuzz ${fuzz_s}s (${fuzz_n} targets), Arm64 ${arm_s}s (${arm_n} tests), consumer package OK in the two x86 trees; total $((elapsed / 60))m$((elapsed % 60))s"
echo "test.sh: ${total_tests} passed, 0 failed"
