# Shared by scripts/demo.sh, scripts/test.sh, scripts/tidy.sh and
# scripts/bench.sh: source it, do not run it. Installs the Debian 12 packages
# softdot needs (only when one is missing, so a second run is fast and needs no
# network), and configures and builds a tree with CMake + Ninja.
#
# Settings (environment):
#   SOFTDOT_JOBS      parallel build jobs (default 2; the dev machines have 2 cores)
#   SOFTDOT_NO_APT=1  never call apt-get; fail if a package is missing
#   SOFTDOT_CMAKE_ARGS extra arguments for every configure, split on spaces
#                     (e.g. "-DCMAKE_CXX_COMPILER=clang++")

SOFTDOT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SOFTDOT_JOBS="${SOFTDOT_JOBS:-2}"

# Debian 12 (bookworm) package names, checked with apt-cache policy.
SOFTDOT_PACKAGES=(
  g++ cmake ninja-build pkg-config
  libhwy-dev       # Highway 1.0.3: SIMD + runtime dispatch
  libcli11-dev     # the softdot command's argument parser
  libmpfr-dev libgmp-dev  # exact references for the accuracy tests
  libgtest-dev     # unit tests
  libbenchmark-dev # bench/ (optional for the build, installed for bench.sh)
  clang-format     # scripts/format.sh --check, run by scripts/test.sh
  clang-tidy       # scripts/tidy.sh, run by scripts/test.sh
  clang            # the clang build of scripts/test.sh, and scripts/fuzz.sh
  libclang-rt-14-dev  # clang's sanitizer runtimes (ASan, UBSan, LSan)
  libfuzzer-14-dev    # libFuzzer, for fuzz/ (scripts/fuzz.sh)
  libomp-dev       # omp.h for clang-tidy (GCC's omp.h does not parse with clang)
  libopenmpi-dev openmpi-bin  # softdot::mpi (ring attention) and its mpirun tests
)

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Prints the packages of SOFTDOT_PACKAGES that are not installed.
missing_packages() {
  local p status arch
  arch="$(dpkg --print-architecture)"
  for p in "${SOFTDOT_PACKAGES[@]}"; do
    # The native architecture's package first: with a foreign one installed
    # too (scripts/test_arm64.sh adds arm64 -dev packages), the bare name
    # matches both. Architecture: all packages only answer to the bare name.
    status="$(dpkg-query -W -f='${db:Status-Status}' "$p:$arch" 2>/dev/null ||
      dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
    [[ "$status" == installed ]] || printf '%s\n' "$p"
  done
}

ensure_deps() {
  command -v dpkg-query >/dev/null 2>&1 || die "dpkg-query not found: these scripts expect Debian 12"
  local missing
  mapfile -t missing < <(missing_packages)
  if ((${#missing[@]} == 0)); then
    log "Debian packages: all ${#SOFTDOT_PACKAGES[@]} installed"
    return 0
  fi
  [[ "${SOFTDOT_NO_APT:-0}" == 1 ]] && die "missing packages (SOFTDOT_NO_APT=1): ${missing[*]}"
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null 2>&1 || die "missing packages ${missing[*]}; run as root or install them"
    sudo=(sudo)
  fi
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update
  "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}" </dev/null
}

# configure_build BUILD_DIR BUILD_TYPE [extra cmake arguments...]
# Configures (Ninja) and builds every target of the tree.
configure_build() {
  local dir="$1" type="$2" extra=()
  shift 2
  read -r -a extra <<<"${SOFTDOT_CMAKE_ARGS:-}"
  log "configure $dir ($type) $* ${extra[*]}"
  cmake -S "$SOFTDOT_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" "$@" "${extra[@]}"
  log "build $dir (-j$SOFTDOT_JOBS)"
  cmake --build "$dir" -j "$SOFTDOT_JOBS"
}

# lsan_works COMPILER: succeeds when LeakSanitizer works here with that
# compiler's runtime (it needs ptrace-like access that some VMs and
# containers deny): a program that leaks must be reported.
lsan_works() {
  local cxx="$1" dir out
  dir="$(mktemp -d)"
  printf '#include <cstdlib>\nint main() { void* volatile p = std::malloc(64); p = nullptr; return 0; }\n' \
    >"$dir/leak.cc"
  if ! "$cxx" -fsanitize=address -g "$dir/leak.cc" -o "$dir/leak" 2>/dev/null; then
    rm -rf "$dir"
    return 1
  fi
  # The probe exits non-zero when LSan works, so read its output.
  out="$(ASAN_OPTIONS=detect_leaks=1 "$dir/leak" 2>&1 || true)"
  rm -rf "$dir"
  grep -q 'detected memory leaks' <<<"$out"
}

# Seconds since the epoch, for the timing summaries.
now() { date +%s; }
