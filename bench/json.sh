#!/bin/sh
# bench/json.sh - k.json (lua/kh_lua_json.c) vs Debian's lua-cjson: decode + encode of a 1 KB
# JSON document in a loop, in a worker's LuaJIT state, with the release build (make build).
# Usage: bench/json.sh [runs]   (N=rounds per run, default 200000)
set -e
BIN=${KHAMSIN_BIN:-build/khamsin}
[ -x "$BIN" ] || { echo "no $BIN: run make build first" >&2; exit 1; }
for _ in $(seq "${1:-3}"); do
  "$BIN" --workers 1 --listen 127.0.0.1:0 bench/apps/json_codec.lua
done
