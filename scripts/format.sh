#!/usr/bin/env bash
# Formats the C++ sources git tracks with the repository's .clang-format
# (Debian 12's clang-format 14), or with --check fails listing the files that
# are not formatted (scripts/test.sh runs the check).
# Usage: bash scripts/format.sh [--check]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v clang-format >/dev/null || { echo "format.sh: clang-format not found (apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.cc' '*.h')
if [[ "${1:-}" == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    printf 'format.sh: not formatted (run bash scripts/format.sh): %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} files formatted"
else
  clang-format -i "${files[@]}"
fi
