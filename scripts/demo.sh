#!/usr/bin/env bash
# Quick start: installs what softdot needs, builds it (Release) and runs
# `softdot demo`. Usage: bash scripts/demo.sh   (from a clone, as root)
# BUILD_DIR overrides the build tree (default: build/ in the repository).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

build_dir="${BUILD_DIR:-$SOFTDOT_ROOT/build}"
ensure_deps
configure_build "$build_dir" Release -DSOFTDOT_BUILD_CLI=ON -DSOFTDOT_PYTHON=OFF \
  -DSOFTDOT_INSTALL_CXX=ON
log "softdot demo"
"$build_dir/cli/softdot" demo
log "demo: OK (the command is $build_dir/cli/softdot; try --help)"
