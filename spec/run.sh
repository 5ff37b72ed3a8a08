#!/bin/sh
# Runs the busted specs from the repository root; the last line is "N passed, N failed".
# KHAMSIN_BIN overrides the binary (default build/khamsin). Extra arguments go to busted.
cd "$(dirname "$0")/.." || exit 1
exec busted "$@"
