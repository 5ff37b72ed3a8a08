#!/usr/bin/env bash
# bench/tls-handoff.sh - what the hand-off to our TLS 1.3 record layer (core/kh_tls13.c) costs a
# handshake: khamsin as is against khamsin --tls-own-records 0 (OpenSSL keeps the record layer),
# alternated ROUNDS times, full (-new) and resumed (-reuse) handshakes, 2 parallel
# `openssl s_time -www /` clients on core 0 for SECONDS each, server on core 1; the figure is
# server CPU (utime+stime from /proc, 4 ms ticks) per handshake. bench/tls.sh compares with nginx;
# this isolates the one thing that differs.
#
#   bench/tls-handoff.sh            # ~2 min      ROUNDS=3 SECONDS_EACH=4 PORT=29500
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
ROUNDS=${ROUNDS:-3}
SECONDS_EACH=${SECONDS_EACH:-4}
PORT=${PORT:-29500}
BIN=build-release/khamsin
STAMP=$(date +%Y%m%d-%H%M%S)
RESULT="bench/results/tls-handoff-$STAMP.txt"
TMP=$(mktemp -d /tmp/khbench-handoff.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >"$TMP/build.log" 2>&1 &&
  cmake --build build-release -j2 >>"$TMP/build.log" 2>&1 || { tail -20 "$TMP/build.log"; exit 1; }
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$TMP/key.pem" \
  -out "$TMP/cert.pem" -days 2 -subj /CN=localhost 2>/dev/null

run() { # mode label extra-args...
  local mode=$1 label=$2 w=() n a b P
  shift 2
  taskset -c 1 "$BIN" --workers 1 --listen "tls://127.0.0.1:$PORT" --tls-cert "$TMP/cert.pem" \
    --tls-key "$TMP/key.pem" --log-level warn examples/hello.lua "$@" >/dev/null 2>&1 &
  P=$!
  sleep 0.4
  taskset -c 0 openssl s_time -connect "127.0.0.1:$PORT" -"$mode" -www / -time 1 >/dev/null 2>&1 # warm-up
  a=$(awk '{print $14+$15}' "/proc/$P/stat")
  for i in 1 2; do
    (taskset -c 0 openssl s_time -connect "127.0.0.1:$PORT" -"$mode" -www / -time "$SECONDS_EACH" 2>&1 |
      awk '/connections in .* real/ {print $1}' >"$TMP/n.$i") &
    w+=($!)
  done
  wait "${w[@]}"
  b=$(awk '{print $14+$15}' "/proc/$P/stat")
  kill "$P"
  wait "$P" 2>/dev/null || true
  n=$(($(cat "$TMP/n.1") + $(cat "$TMP/n.2")))
  echo "$mode $label $n $(awk -v t=$((b - a)) -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.1f", t / hz * 1e6 / n}')"
}

{
  echo "# khamsin bench: the cost of the TLS 1.3 record-layer hand-off per handshake"
  echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command:  ROUNDS=$ROUNDS SECONDS_EACH=$SECONDS_EACH bench/tls-handoff.sh"
  echo "git:      $(git rev-parse --short HEAD) ($(git status --porcelain -- core lua | wc -l) uncommitted change(s) under core/ lua/)"
  echo "openssl:  $(openssl version)"
  echo
  for ((r = 1; r <= ROUNDS; r++)); do
    for mode in new reuse; do
      run "$mode" own
      run "$mode" openssl --tls-own-records 0
    done
  done >"$TMP/rows"
  echo "mode   record layer   handshakes   server CPU us per handshake"
  awk '{printf "%-6s %-13s %11d   %8.1f\n", $1, $2, $3, $4}' "$TMP/rows"
  echo
  for mode in new reuse; do
    for l in own openssl; do
      printf '%s %s median %s us\n' "$mode" "$l" \
        "$(awk -v m="$mode" -v l="$l" '$1==m && $2==l {print $4}' "$TMP/rows" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')"
    done
  done
} | tee "$RESULT"
echo "results written to $RESULT"
