#!/usr/bin/env bash
# The Python API under hypothesis with the extension built with
# AddressSanitizer and UndefinedBehaviorSanitizer (issue 29; docs/fuzzing.md,
# "Python under ASan"):
#   1. build-pyasan/: RelWithDebInfo, SOFTDOT_SANITIZE=ON, SOFTDOT_PYTHON=ON,
#      only the _softdot module (the library compiled with the sanitizers);
#   2. a package directory (python/softdot/*.py and the sanitized module) and a
#      venv with numpy, hypothesis and pytest;
#   3. tests/python/test_fuzz_api.py with SOFTDOT_FUZZ_EXAMPLES examples per
#      test (default 5000; without conftest.py, which imports torch and
#      mpmath, neither needed here nor loaded under ASan), the interpreter started with GCC's libasan and
#      libubsan preloaded (CPython itself is not instrumented). Any ASan or
#      UBSan report aborts the process, which pytest cannot hide.
# Ends with "python_asan.sh: N passed, M failed" (pytest's counts).
#
#   bash scripts/python_asan.sh               # 5000 examples per test
#   SOFTDOT_FUZZ_EXAMPLES=200 bash scripts/python_asan.sh -k cross_entropy
# Extra arguments go to pytest. PYASAN_BUILD_DIR overrides build-pyasan/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
dir="${PYASAN_BUILD_DIR:-$SOFTDOT_ROOT/build-pyasan}"
examples="${SOFTDOT_FUZZ_EXAMPLES:-5000}"
python="${SOFTDOT_PYTHON_EXE:-python3}"
start=$SECONDS

ensure_deps
venv="$dir/venv"
if [[ ! -x $venv/bin/python ]]; then
  log "venv $venv"
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q numpy hypothesis pytest nanobind ml_dtypes

# Only the module: no tests, command, benchmarks or MPI in this tree.
cmake -S "$SOFTDOT_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSOFTDOT_SANITIZE=ON -DSOFTDOT_PYTHON=ON -DSOFTDOT_BUILD_TESTS=OFF \
  -DSOFTDOT_BUILD_CLI=OFF -DSOFTDOT_BUILD_BENCH=OFF -DSOFTDOT_MPI=OFF \
  -DPython_EXECUTABLE="$venv/bin/python" ${SOFTDOT_CMAKE_ARGS:-}
log "build $dir: _softdot (-j$SOFTDOT_JOBS)"
cmake --build "$dir" -j "$SOFTDOT_JOBS" --target _softdot
built_s=$((SECONDS - start))

pkg="$dir/pkg/softdot"
rm -rf "$dir/pkg"
mkdir -p "$pkg"
cp "$SOFTDOT_ROOT"/python/softdot/*.py "$SOFTDOT_ROOT"/python/softdot/py.typed "$pkg/"
cp "$dir"/python/_softdot*.so "$pkg/"

asan="$(g++ -print-file-name=libasan.so)"
ubsan="$(g++ -print-file-name=libubsan.so)"
[[ -f $asan && -f $ubsan ]] || die "GCC's libasan.so / libubsan.so not found"
# detect_leaks=0: CPython keeps objects alive at exit by design.
# verify_asan_link_order=0: the interpreter is not linked with ASan.
sanitized=(env LD_PRELOAD="$asan:$ubsan"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:verify_asan_link_order=0:strict_string_checks=1
  UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1)

# The control: in this set-up a read past a malloc'd block must be reported
# (else a clean run below would prove nothing).
control="$("${sanitized[@]}" "$venv/bin/python" -c '
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
ctypes.string_at(libc.malloc(16), 32)' 2>&1 || true)"
grep -q 'ERROR: AddressSanitizer: heap-buffer-overflow' <<<"$control" ||
  die "ASan is not active in the interpreter (the control read past a block unreported)"
log "control: ASan reports a read past a malloc'd block in this interpreter"

log "pytest test_fuzz_api.py, $examples examples per test, under ASan + UBSan"
set +e
(
  cd "$SOFTDOT_ROOT/tests/python"
  "${sanitized[@]}" PYTHONPATH="$dir/pkg" SOFTDOT_FUZZ_EXAMPLES="$examples" OMP_NUM_THREADS=2 \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider --noconftest --durations=0 \
    --hypothesis-show-statistics \
    test_fuzz_api.py "$@"
) 2>&1 | tee "$dir/pytest.log"
rc=${PIPESTATUS[0]}
set -e
grep -aq 'AddressSanitizer\|runtime error:' "$dir/pytest.log" && rc=1
passed=$(grep -aoE '[0-9]+ passed' "$dir/pytest.log" | tail -1 | cut -d' ' -f1 || true)
failed=$(grep -aoE '[0-9]+ failed' "$dir/pytest.log" | tail -1 | cut -d' ' -f1 || true)
log "built in ${built_s}s, total $(((SECONDS - start) / 60))m$(((SECONDS - start) % 60))s"
echo "python_asan.sh: ${passed:-0} passed, ${failed:-$((rc != 0))} failed"
exit "$rc"
