#!/usr/bin/env bash
# ctest consumer_find_package (registered by tests/consumer/CMakeLists.txt).
# 1. cmake --install the softdot build tree to a scratch prefix, configure and
#    build tests/consumer/project with find_package(softdot CONFIG) against it,
#    and run it.
# 2. Install again with DESTDIR (a staged install of the configured prefix) and
#    compile project/main.cc by hand with `pkg-config --cflags --libs softdot`,
#    PKG_CONFIG_PATH and PKG_CONFIG_SYSROOT_DIR pointing into the stage; run it.
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

# ---- 2. pkg-config -----------------------------------------------------------
stage="$work/stage"
step "DESTDIR=$stage cmake --install $build"
DESTDIR="$stage" "$cmake" --install "$build" >"$work/install-destdir.log"
pc="$(find "$stage" -name softdot.pc -print -quit)"
[[ -n "$pc" ]] || { echo "no softdot.pc under $stage" >&2; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
export PKG_CONFIG_SYSROOT_DIR="$stage"
flags="$(pkg-config --cflags --libs softdot)"
echo "pkg-config --cflags --libs softdot: $flags"
case "$flags" in
  *"-I$stage/"*) ;;
  *) echo "pkg-config's -I does not point into the staged install" >&2; exit 1 ;;
esac
step "compile main.cc with pkg-config"
# shellcheck disable=SC2086  # $flags is a list of flags
"$cxx" -std=c++20 -O2 -Wall -Wextra "${san_flags[@]}" "$project/main.cc" \
  -o "$work/consumer-pkgconfig" $flags
step "run (pkg-config)"
lib_dir="$(dirname "$(dirname "$pc")")"
LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/consumer-pkgconfig"

# softdot.pc records the prefix chosen when softdot was configured, so it is
# right for `cmake --install` without --prefix (or with DESTDIR), not for an
# install moved elsewhere with --prefix: say so instead of failing on it.
prefix_pc="$(find "$prefix" -name softdot.pc -print -quit)"
if ! grep -q "^prefix=$prefix\$" "$prefix_pc" && ! grep -q '^prefix=${pcfiledir}' "$prefix_pc"; then
  echo "note: $(grep '^prefix=' "$prefix_pc") in softdot.pc after 'cmake --install --prefix $prefix'" \
       "(the .pc is not relocatable; configure with -DCMAKE_INSTALL_PREFIX instead)"
fi
echo "consumer_find_package: OK"
