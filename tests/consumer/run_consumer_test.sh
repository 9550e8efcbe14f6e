#!/usr/bin/env bash
# ctest consumer_find_package (registered by tests/consumer/CMakeLists.txt).
# 1. cmake --install the softdot build tree to a scratch prefix, configure and
#    build tests/consumer/project with find_package(softdot CONFIG) against it,
#    and run it.
# 2. Compile project/main.cc by hand with `pkg-config --cflags --libs softdot`
#    (PKG_CONFIG_PATH pointing into the same prefix) and run it.
# Usage: run_consumer_test.sh SOFTDOT_BUILD PROJECT_DIR WORK_DIR CMAKE CXX
#                             GENERATOR SANITIZE(0|1) WERROR(0|1)
set -euo pipefail
if (($# != 8)); then
  echo "usage: $0 SOFTDOT_BUILD PROJECT_DIR WORK_DIR CMAKE CXX GENERATOR SANITIZE WERROR" >&2
  exit 2
fi
build="$1" project="$2" work="$3" cmake="$4" cxx="$5" generator="$6" sanitize="$7" werror="$8"

step() { printf -- '--- %s\n' "$*"; }

rm -rf "$work"
mkdir -p "$work"

# A sanitizer build of softdot needs the sanitizer runtime in the program too.
san_flags=()
if [[ "$sanitize" == 1 ]]; then
  san_flags=(-fsanitize=address,undefined -fno-omit-frame-pointer)
fi

# ---- 1. find_package(softdot CONFIG) ---------------------------------------
prefix="$work/prefix"
step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"
config="$(find "$prefix" -name softdot-config.cmake -print -quit)"
[[ -n "$config" ]] || { echo "no softdot-config.cmake under $prefix" >&2; exit 1; }
echo "installed: ${config#"$prefix"/}"

step "configure + build the consumer project"
"$cmake" -S "$project" -B "$work/build" -G "$generator" \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON \
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
  -DSOFTDOT_CONSUMER_WERROR="$( [[ "$werror" == 1 ]] && echo ON || echo OFF )" \
  -DCMAKE_CXX_FLAGS="${san_flags[*]}" \
  -DCMAKE_EXE_LINKER_FLAGS="${san_flags[*]}"
# The package must come from the scratch prefix, not from a system install.
grep -q "^softdot_DIR:PATH=$prefix/" "$work/build/CMakeCache.txt" || {
  echo "find_package(softdot) did not use $prefix:" >&2
  grep '^softdot_DIR' "$work/build/CMakeCache.txt" >&2
  exit 1
}
"$cmake" --build "$work/build" -j 2
step "run (find_package)"
"$work/build/softdot_consumer"
if [[ -x "$work/build/softdot_consumer_mpi" ]]; then
  step "run softdot::mpi (find_package)"
  "$work/build/softdot_consumer_mpi"
elif [[ -f "$prefix/include/softdot/mpi.h" ]]; then
  echo "softdot::mpi is installed but the consumer did not build against it" >&2
  exit 1
fi

# ---- 2. pkg-config -----------------------------------------------------------
# The same relocated install: softdot.pc finds its prefix from its own place.
step "pkg-config --cflags --libs softdot (PKG_CONFIG_PATH into $prefix)"
pc="$(find "$prefix" -name softdot.pc -print -quit)"
[[ -n "$pc" ]] || { echo "no softdot.pc under $prefix" >&2; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
flags="$(pkg-config --cflags --libs softdot)"
echo "$flags"
# The header must be found through an -I of softdot.pc that lies in $prefix.
found=0
for f in $flags; do
  if [[ "$f" == -I* && -f "${f#-I}/softdot/softdot.h" ]]; then
    dir="$(realpath "${f#-I}")"
    [[ "$dir" == "$(realpath "$prefix")"/* ]] && found=1
  fi
done
((found)) || { echo "pkg-config's -I does not lead to softdot/softdot.h in $prefix" >&2; exit 1; }
step "compile main.cc with pkg-config"
# shellcheck disable=SC2086  # $flags is a list of flags
"$cxx" -std=c++20 -O2 -Wall -Wextra "${san_flags[@]}" "$project/main.cc" \
  -o "$work/consumer-pkgconfig" $flags
step "run (pkg-config)"
lib_dir="$(dirname "$(dirname "$pc")")"
LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/consumer-pkgconfig"
echo "consumer_find_package: OK"
