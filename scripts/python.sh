# The Python package's build and tests, sourced by scripts/test.sh (after
# common.sh). python_suite DIR:
#   1. `pip wheel .` builds the wheel as a user's `pip install .` does (build
#      isolation: scikit-build-core, nanobind and numpy come from PyPI), into
#      DIR/dist; the CMake tree is build/python/<wheel tag> (pyproject.toml).
#   2. A fresh venv DIR/venv-fresh installs that wheel alone (numpy is its one
#      dependency) and imports it from outside the repository; then
#      python_wheel_smoke (below) repairs it into a manylinux wheel and runs
#      that with the system's libhwy and libgomp hidden.
#   3. The test venv DIR/venv gets torch 2.13.0 (the CPU build on this
#      machine's disk) and the wheel with its [test] extras ([test,mpi] where
#      mpirun is on PATH), and runs pytest
#      on tests/python; pytest's "no tests collected" (exit 5) fails too.
#   4. python_lint: ruff (formatter check and linter) and mypy in the test
#      venv, configured in pyproject.toml; it runs before pytest.
# Sets python_tests to the number of tests that passed.
#
# Settings: SOFTDOT_PYTHON (default python3), SOFTDOT_TORCH (default
# torch==2.13.0; another spec may download a CUDA build of several GB).

python_packages=(python3 python3-venv python3-dev)

# A Python >= 3.9 with venv; Debian's python3-venv when none is there.
find_python() {
  local py="${SOFTDOT_PYTHON:-python3}"
  if ! "$py" -c 'import sys, venv, ensurepip; assert sys.version_info >= (3, 9)' 2>/dev/null; then
    [[ "${SOFTDOT_NO_APT:-0}" == 1 ]] && die "no usable $py with venv (SOFTDOT_NO_APT=1)"
    log "installing ${python_packages[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      "${python_packages[@]}" </dev/null
    py=/usr/bin/python3
  fi
  printf '%s\n' "$py"
}

# Pinned: a new release may add rules or change the formatting.
python_lint_tools=(ruff==0.17.6 mypy==2.4.1)

# The lint step checks every Python file of the package, the tests and the
# benchmarks; mypy checks every module of the installed wheel (it holds the
# core's stub, _softdot.pyi, which the build generates).
python_lint_files=(python/softdot tests/python bench/python examples scripts/stress_threads.py
                   scripts/structure.py)
python_typed_modules=(softdot softdot._arrays softdot._attention softdot._attention_grad
                      softdot._autograd softdot._contiguous softdot._losses softdot._terms
                      softdot._cross_entropy softdot._gloo_ring softdot._int8
                      softdot._linear_cross_entropy softdot._linear_cross_entropy_grad
                      softdot._mpi_comm softdot._paged softdot._quantize softdot._request
                      softdot._rowops softdot._sample softdot._softmax softdot._softmax16
                      softdot._vocab_parallel softdot.dask softdot.distributed softdot.torch)

# python_lint DIR: ruff format --check, ruff check and mypy with DIR/venv.
python_lint() {
  local dir="$1" venv="$1/venv/bin" m mods=()
  log "python: ruff and mypy (${python_lint_tools[*]})"
  "$venv/python" -m pip install -q "${python_lint_tools[@]}"
  (cd "$SOFTDOT_ROOT" &&
     "$venv/ruff" format --no-cache --check "${python_lint_files[@]}" &&
     "$venv/ruff" check --no-cache "${python_lint_files[@]}") ||
    die "python: ruff found unformatted files or lint (fix: ruff format FILES; ruff check --fix FILES)"
  for m in "${python_typed_modules[@]}"; do mods+=(-m "$m"); done
  # From DIR, so that `softdot` is the installed wheel, not python/softdot.
  (cd "$dir" && "$venv/mypy" --config-file "$SOFTDOT_ROOT/pyproject.toml" \
     --follow-imports=silent "${mods[@]}") || die "python: mypy reported errors"
}

python_suite() {
  local dir py wheel log reuse=()
  # An absolute path: the steps below run from other folders.
  dir="$(mkdir -p "$1" && cd "$1" && pwd)"
  log="$dir/pytest.log"
  py="$(find_python)"
  rm -rf "$dir/dist"
  # With a second argument, a Release tree of the whole project (test.sh's
  # build/): scikit-build-core builds in it, so the library's objects, which
  # the tree has compiled with the same compiler and flags, are not compiled
  # again; only the extension modules are. The tree keeps its tests, command
  # and benchmarks (configured on), and test.sh's next configure of it sets
  # SOFTDOT_PYTHON and SOFTDOT_INSTALL_CXX back. Without it the wheel builds
  # in build/python/<tag> (pyproject.toml), as a user's `pip install .`.
  if (($# > 1)); then
    reuse=(-C "build-dir=$2" -C cmake.define.SOFTDOT_BUILD_TESTS=ON
           -C cmake.define.SOFTDOT_BUILD_CLI=ON -C cmake.define.SOFTDOT_BUILD_BENCH=ON)
  fi
  log "python: pip wheel . ($("$py" --version))${reuse:+ in $2}"
  "$py" -m pip wheel --no-deps -w "$dir/dist" "${reuse[@]}" "$SOFTDOT_ROOT"
  wheel="$(ls "$dir"/dist/softdot-*.whl)"
  [[ -f "$wheel" ]] || die "python: no wheel in $dir/dist"

  log "python: the wheel in a fresh venv"
  rm -rf "$dir/venv-fresh"
  "$py" -m venv "$dir/venv-fresh"
  "$dir/venv-fresh/bin/python" -m pip install -q "$wheel"
  (cd "$dir" && "$dir/venv-fresh/bin/python" -c '
import numpy as np, softdot
w = softdot.softmax(np.array([2.0, 1.0, 0.1]))
assert abs(w.sum() - 1) < 1e-15 and w.dtype == np.float64, w
print("fresh venv: softdot", softdot.__version__, softdot.simd_target(), np.round(w, 3))
')

  python_wheel_smoke "$dir" "$wheel"

  log "python: test venv (torch, scipy, ml_dtypes, pytest, hypothesis, dask, distributed)"
  [[ -x "$dir/venv/bin/python" ]] || "$py" -m venv "$dir/venv"
  "$dir/venv/bin/python" -m pip install -q "${SOFTDOT_TORCH:-torch==2.13.0}"
  "$dir/venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
  # softdot.distributed's tests need mpi4py (the [mpi] extra) and mpirun; the
  # wheel has softdot._softdot_mpi when CMake found MPI (Open MPI is in
  # SOFTDOT_PACKAGES). Without them those tests skip, saying why.
  if command -v mpirun >/dev/null; then
    "$dir/venv/bin/python" -m pip install -q "${wheel}[test,mpi]"
  else
    "$dir/venv/bin/python" -m pip install -q "${wheel}[test]"
  fi

  python_lint "$dir"

  log "python: pytest tests/python"
  # Run from the build folder so that `import softdot` is the installed wheel.
  (cd "$dir" && "$dir/venv/bin/python" -m pytest "$SOFTDOT_ROOT/tests/python" -q \
     -p no:cacheprovider --rootdir "$SOFTDOT_ROOT") 2>&1 | tee "$log"
  grep -Eq '[0-9]+ (failed|error)' "$log" && die "python: pytest reported failures ($log)"
  python_tests="$(grep -Eo '[0-9]+ passed' "$log" | tail -1 | cut -d' ' -f1)"
  [[ -n "$python_tests" && "$python_tests" -gt 0 ]] || die "python: no passed tests in $log"
  log "python: $python_tests tests passed"
}

# python_wheel_smoke DIR WHEEL: the wheel a user without Debian's Highway and
# OpenMP packages installs. scripts/wheel.sh repairs WHEEL (the one
# python_suite built: nothing is compiled again) into DIR/dist-manylinux; a
# fresh venv DIR/venv-manylinux installs it, and Python runs in a private
# mount namespace (unshare -m, as root) where /dev/null is bind-mounted over
# the system's libhwy and libgomp files, so that loading them fails there.
# The import must then load the copies in softdot.libs/ (checked in
# /proc/self/maps), and softmax and attention must give their known values.
python_wheel_smoke() {
  local dir="$1" wheel="$2" py repaired venv="$1/venv-manylinux"
  py="$(find_python)"
  log "python: manylinux wheel (scripts/wheel.sh $(basename "$wheel"))"
  repaired="$(WHEEL_DIR="$dir/dist-manylinux" bash "$SOFTDOT_ROOT/scripts/wheel.sh" "$wheel" |
    tail -1)"
  [[ -f "$repaired" ]] || die "python: scripts/wheel.sh gave no wheel"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "$repaired"
  command -v unshare >/dev/null || die "python: unshare (util-linux) is needed to hide libhwy"
  log "python: $(basename "$repaired") with the system's libhwy and libgomp hidden"
  (cd "$dir" && unshare --mount --propagation private bash -euo pipefail -c '
    hidden=0
    for name in libhwy.so.1 libhwy_contrib.so.1 libgomp.so.1; do
      while read -r path; do
        mount --bind /dev/null "$(readlink -f "$path")"
        hidden=$((hidden + 1))
      done < <(ldconfig -p | awk -v n="$name" "\$1 == n {print \$NF}")
    done
    echo "hid $hidden system libraries" >&2
    exec "$1" -c "$2"' bash "$venv/bin/python" '
import ctypes
for name in ("libhwy.so.1", "libgomp.so.1"):
    try:
        ctypes.CDLL(name)
    except OSError:
        pass
    else:
        raise SystemExit(f"{name} still loads: the system copy is not hidden")

import numpy as np
import softdot

maps = {line.split()[-1] for line in open("/proc/self/maps") if "/" in line}
for lib in ("libhwy", "libgomp"):
    paths = {p for p in maps if lib in p.rsplit("/", 1)[-1]}
    assert paths and all("/softdot.libs/" in p for p in paths), (lib, paths)
assert not hasattr(softdot._softdot, "_time_cpp"), "benchmark hooks in the shipped module"

w = softdot.softmax(np.array([1.0, 2.0, 3.0]))
want = np.array([0.09003057317038046, 0.24472847105479767, 0.6652409557748219])
assert w.dtype == np.float64 and np.max(np.abs(w - want)) <= 2e-16, w

# One head, L = S = 2, E = 2, scale 1/sqrt(2): the weights of row 0 are
# sigmoid(+-1/sqrt(2)) = 0.669761, 0.330239.
q = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
v = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
o = softdot.scaled_dot_product_attention(q, q, v)
want = np.array([[1.660478, 2.660478], [2.339522, 3.339522]])
assert o.shape == (2, 2) and np.max(np.abs(o - want)) < 2e-6, o
oc = softdot.scaled_dot_product_attention(q, q, v, causal=True)
assert np.max(np.abs(oc - [[1.0, 2.0], [2.339522, 3.339522]])) < 2e-6, oc
print("manylinux wheel:", sorted(p.rsplit("/", 1)[-1] for p in maps if "softdot.libs" in p),
      softdot.simd_target(), np.round(o, 6).tolist())
')
}
