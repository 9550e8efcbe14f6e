#!/usr/bin/env bash
# Runs clang-tidy (Debian 12's clang-tidy 14, through run-clang-tidy) with the
# repository's .clang-tidy over every C++ source git tracks in src/, cli/ and
# tests/ (the headers of include/softdot/, src/, cli/ and tests/ are checked
# where those files include them), and fails on any finding: every enabled
# check is an error. scripts/test.sh runs it on its Release tree.
# Usage: bash scripts/tidy.sh [BUILD_DIR [FILE...]]
#   BUILD_DIR  supplies compile_commands.json (default build/; the `release`
#              preset and scripts/test.sh export it); a tree without one is
#              configured here, which needs no build.
#   FILE...    only these (paths from the repository root); default: all.
# Not checked: python/ (needs nanobind, off by default), bench/, and
# tests/consumer/ (a separate project).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$SOFTDOT_ROOT"
command -v run-clang-tidy >/dev/null ||
  die "tidy.sh: run-clang-tidy not found (apt-get install clang-tidy)"

dir="${1:-$SOFTDOT_ROOT/build}"
if [[ ! -f "$dir/compile_commands.json" ]]; then
  log "tidy.sh: configure $dir for compile_commands.json"
  if [[ -f "$dir/CMakeCache.txt" ]]; then
    cmake -B "$dir" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
  else
    cmake -S "$SOFTDOT_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DSOFTDOT_BUILD_TESTS=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
  fi
fi

# The files, as regular expressions on the database's paths. Every tracked
# source must be in the database, so that none goes unchecked (a tree
# configured without the tests fails here).
if (($# > 1)); then
  files=("${@:2}")
else
  mapfile -t files < <(git ls-files 'src/*.cc' 'cli/*.cc' 'tests/*.cc' |
    grep -v '^tests/consumer/')
fi
# (A command substitution, not <(...): set -e must see python's status.)
patterns_text="$(python3 - "$dir/compile_commands.json" "${files[@]}" <<'EOF'
import json, os, re, sys
db = {}
for e in json.load(open(sys.argv[1])):
    # The path as run-clang-tidy matches it.
    path = os.path.normpath(os.path.join(e["directory"], e["file"]))
    db[os.path.realpath(path)] = path
missing = [f for f in sys.argv[2:] if os.path.realpath(f) not in db]
if missing:
    sys.exit("tidy.sh: not in %s (configure with the tests and the "
             "command): %s" % (sys.argv[1], " ".join(missing)))
for f in sys.argv[2:]:
    print("^" + re.escape(db[os.path.realpath(f)]) + "$")
EOF
)"
mapfile -t patterns <<<"$patterns_text"
# run-clang-tidy checks every file of the database when given no pattern.
((${#files[@]} > 0 && ${#patterns[@]} == ${#files[@]})) || die "tidy.sh: no files"

t0=$SECONDS
log "tidy.sh: clang-tidy on ${#files[@]} files (-j$SOFTDOT_JOBS)"
# run-clang-tidy prints each command line, "N warnings generated." (headers
# outside HeaderFilterRegex) and colours: keep the findings only. Its status
# (pipefail) is non-zero when any file has a finding.
status=0
run-clang-tidy -quiet -j "$SOFTDOT_JOBS" -p "$dir" "${patterns[@]}" 2>&1 |
  sed -u -e 's/\x1b\[[0-9;]*m//g' -e '/^clang-tidy[-0-9]* .*-p=/d' \
    -e '/^[0-9]* warnings\{0,1\} generated\.$/d' || status=$?
((status == 0)) || die "tidy.sh: clang-tidy findings above (.clang-tidy says why each check is on)"
echo "tidy.sh: ${#files[@]} files clean ($((SECONDS - t0))s)"
