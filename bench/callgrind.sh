#!/usr/bin/env bash
# bench/callgrind.sh - user-space instructions per request of a hello-world GET, counted by
# valgrind's callgrind (repeatable, unlike time: the same binary and load give the same count).
#
#   bench/callgrind.sh                      # ~1 min; KHAMSIN_BIN=build-release/khamsin SECONDS_LOAD=5
#   PROTO=h2 bench/callgrind.sh             # the same over h2c: h2load -c4 -m10 instead of wrk
#   PROTO=h2 REQUESTS=4000 bench/callgrind.sh  # a fixed number of requests (h2load -n), so two
#                                           # binaries are compared on the same work
#
# Two runs of the server under callgrind: one that only starts and stops, one that also serves
# wrk -c4 for SECONDS_LOAD. (Ir of the second - Ir of the first) / requests served = instructions
# per request, the whole process: parser, Lua, libuv, libc (the kernel is not counted).
# Also prints the top functions of the loaded run. This is what the figures in comments of
# core/kh_stream.c and core/kh_h1.c were measured with.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BIN=${KHAMSIN_BIN:-build-release/khamsin}
SECONDS_LOAD=${SECONDS_LOAD:-5}
PORT=${PORT:-23190}
PROTO=${PROTO:-h1}
REQUESTS=${REQUESTS:-}
command -v valgrind >/dev/null || { echo "needs valgrind" >&2; exit 1; }
[[ -x $BIN ]] || { cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build-release -j2 --target khamsin >/dev/null; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

run() { # out_file load_seconds -> prints requests served
  local out=$1 secs=$2 pid i n=0
  valgrind --tool=callgrind --callgrind-out-file="$out" "$BIN" --workers 1 --pool-threads 1 \
    --listen "127.0.0.1:$PORT" --log-level warn bench/apps/hello.lua >"$TMP/log" 2>&1 &
  pid=$!
  for ((i = 0; i < 200; i++)); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.1; done
  if ((secs > 0)) && [[ $PROTO == h2 ]]; then
    local how=(-D "$secs")
    [[ -n $REQUESTS ]] && how=(-n "$REQUESTS")
    n=$(h2load -c4 -m10 "${how[@]}" "http://127.0.0.1:$PORT/" | awk '/^requests:/ {print $8}')
  elif ((secs > 0)); then
    n=$(wrk -t1 -c4 -d"${secs}s" "http://127.0.0.1:$PORT/" | awk '/requests in/ {print $1}')
  fi
  kill -TERM "$pid"; wait "$pid" || true
  echo $((n + 1)) # + the readiness probe
}

total_ir() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'; }

base_req=$(run "$TMP/base.out" 0)
load_req=$(run "$TMP/load.out" "$SECONDS_LOAD")
base=$(total_ir "$TMP/base.out")
load=$(total_ir "$TMP/load.out")
echo "binary:   $BIN ($(git rev-parse --short HEAD))"
echo "command:  PROTO=$PROTO REQUESTS=$REQUESTS SECONDS_LOAD=$SECONDS_LOAD bench/callgrind.sh"
echo "start+stop only: $base Ir ($base_req request)"
echo "with load:       $load Ir ($load_req requests)"
echo "instructions per request: $(( (load - base) / (load_req - base_req) ))"
echo
echo "top functions of the loaded run:"
callgrind_annotate "$TMP/load.out" 2>/dev/null | sed -n '/file:function/,$p' | sed -n 2,16p
