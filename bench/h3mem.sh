#!/usr/bin/env bash
# bench/h3mem.sh - memory of HTTP/3 connections (issue 12 item 5), load-independent figures:
#   1. idle h2 over TLS: IDLE_CONNS connections (TLS 1.3 handshake, preface, SETTINGS, one GET
#      each, response read) held idle; server PSS and RssAnon delta / IDLE_CONNS
#      (bench/lib/h2bench.py idle)
#   2. idle h3: IDLE_CONNS connections from one kh-h3load (--hold: one GET each, then idle;
#      --ramp BATCH handshakes at a time); server PSS and RssAnon delta / IDLE_CONNS, taken 1 s
#      after the last response. RssAnon (private anonymous resident memory, /proc/PID/status) is
#      the figure to compare: PSS also drops when a client maps the server's libraries (it splits
#      shared pages), which kh-h3load does (ngtcp2, nghttp3, GnuTLS) and python's ssl (libssl)
#      does too, by an amount that does not depend on the connections.
#   3. churn: one kh-h3get opens and closes CHURN connections one after another (a GET each);
#      server RSS after WARM connections and after all of them (1 s later: closing periods over)
# Each part on a fresh server (khamsin --http3, one worker, on SERVER_CORE; clients on
# CLIENT_CORE), the same TLS listener for h2 and h3 (self-signed ECDSA certificate).
#
#   bench/h3mem.sh                                    # ~2-4 min
#   IDLE_CONNS=200 CHURN=2000 WARM=500 bench/h3mem.sh  # smoke run
#   IDLE_CONNS=5000 PARTS="h2idle h3idle" bench/h3mem.sh
# Where an idle h3 connection's bytes go (per allocation site, resident pages of each pool
# block): bench/lib/h3-memtrace.patch, see its head.
#
# Env knobs (defaults): IDLE_CONNS=1000 BATCH=20 CHURN=10000 WARM=1000 PORT=26480
#   PARTS="h2idle h3idle churn" (two runs on different PORTs may split the parts)
#   KHAMSIN_BIN=build/khamsin (release; kh-h3get beside it) SERVER_CORE=1 CLIENT_CORE=0
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CMDLINE="$0${*:+ $*}"
PY=/usr/bin/python3
. bench/lib/common.sh
H2=bench/lib/h2bench.py

IDLE_CONNS=${IDLE_CONNS:-1000}
BATCH=${BATCH:-20}
PARTS=${PARTS:-"h2idle h3idle churn"}
CHURN=${CHURN:-10000}
WARM=${WARM:-1000}
PORT=${PORT:-26480}
KHAMSIN_BIN=${KHAMSIN_BIN:-$ROOT/build/khamsin}
H3GET=$(dirname "$KHAMSIN_BIN")/kh-h3get
H3LOAD=$(dirname "$KHAMSIN_BIN")/kh-h3load
SERVER_CORE=${SERVER_CORE:-1}
CLIENT_CORE=${CLIENT_CORE:-0}
URL="https://127.0.0.1:$PORT/"

STAMP=$(date +%Y%m%d-%H%M%S)
RESULT="bench/results/h3mem-$STAMP.txt"
mkdir -p bench/results
TMP=$(mktemp -d /tmp/khbench-h3mem.XXXXXX)
SPID=
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
cleanup() { [[ -n $SPID ]] && kill_tree "$SPID" >/dev/null 2>&1; rm -rf "$TMP"; }

start_server() {
  taskset -c "$SERVER_CORE" "$KHAMSIN_BIN" --workers 1 --listen "tls://127.0.0.1:$PORT" \
    --tls-self-signed --http3 --keepalive-timeout-ms 600000 --h3-retry-above 100000 \
    --log-level warn bench/apps/hello.lua >>"$TMP/server.out" 2>>"$TMP/server.err" &
  SPID=$!
  $PY $H2 waitready "$PORT" "$SPID" 15 --tls || { tail -n 20 "$TMP/server.err" >&2; fail "khamsin did not start"; }
  sleep 0.5 # the QUIC listener follows the TLS one
}
stop_server() { kill_tree "$SPID"; SPID=; }
pss_kib() { $PY -c "import sys; sys.path.insert(0, 'bench/lib'); import benchlib; print(benchlib.pss_kib($1)[0])"; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
anon_kib() { awk '/^RssAnon/ {print $2}' "/proc/$1/status"; }

main() {
  trap cleanup EXIT
  trap 'exit 130' INT TERM HUP
  [[ -x $KHAMSIN_BIN && -x $H3GET && -x $H3LOAD ]] || fail "build first: cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build --target khamsin khamsin-tls khamsin-h3 kh-h3get kh-h3load"
  ulimit -n 65536 2>/dev/null || true # kh-h3load: a UDP socket per connection
  echo "# bench/h3mem.sh  $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command:  $CMDLINE (IDLE_CONNS=$IDLE_CONNS BATCH=$BATCH CHURN=$CHURN WARM=$WARM PARTS=\"$PARTS\" PORT=$PORT)"
  echo "binary:   $KHAMSIN_BIN ($("$KHAMSIN_BIN" --version 2>&1 | head -n1)), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "uptime:   $(uptime)"
  echo

  if [[ " $PARTS " == *" h2idle "* ]]; then
  echo "## 1. Memory per idle h2 connection over TLS ($IDLE_CONNS connections)"
  start_server
  taskset -c "$CLIENT_CORE" h2load -c 16 -m 10 -n 20000 "$URL" >/dev/null
  taskset -c "$CLIENT_CORE" $PY $H2 idle --name khamsin-tls --port "$PORT" --root "$SPID" --n "$IDLE_CONNS" --jsonl "$TMP/idle.jsonl" --tls
  stop_server
  echo
  fi

  if [[ " $PARTS " == *" h3idle "* ]]; then
  echo "## 2. Memory per idle h3 connection ($IDLE_CONNS connections, one GET each, then idle)"
  start_server
  taskset -c "$CLIENT_CORE" "$H3LOAD" -c 20 -n 200 "$URL" >/dev/null # warm-up
  sleep 1
  local before after abefore aafter got i
  before=$(pss_kib "$SPID")
  abefore=$(anon_kib "$SPID")
  # one process, a UDP socket per connection, BATCH handshakes at a time (1000 at once would
  # overrun one busy core's handshake timeout); each connection idle after its response
  taskset -c "$CLIENT_CORE" "$H3LOAD" -c "$IDLE_CONNS" -n "$IDLE_CONNS" -m 1 --ramp "$BATCH" \
    --hold 1200 -t 60 "$URL" >"$TMP/hold.out" 2>"$TMP/hold.err" &
  local hold=$!
  for ((i = 0; i < 6000; i++)); do
    grep -q '^held:' "$TMP/hold.out" && break
    kill -0 "$hold" 2>/dev/null || { cat "$TMP/hold.out" "$TMP/hold.err" >&2; fail "kh-h3load ended early"; }
    sleep 0.1
  done
  sleep 1
  got=$(sed -n 's/^held: \([0-9]*\) connections idle/\1/p' "$TMP/hold.out")
  ((got >= IDLE_CONNS * 9 / 10)) || fail "only $got of $IDLE_CONNS h3 connections are held"
  after=$(pss_kib "$SPID")
  aafter=$(anon_kib "$SPID")
  echo "  khamsin-h3    $got idle h3 connections ($((IDLE_CONNS - got)) of $IDLE_CONNS lost on the loaded box): PSS $before KiB -> $after KiB, $(( (after - before) * 1024 / got )) bytes per connection; RssAnon $abefore KiB -> $aafter KiB, $(( (aafter - abefore) * 1024 / got )) bytes per connection"
  kill_tree "$hold" >/dev/null 2>&1
  stop_server
  echo
  fi

  if [[ " $PARTS " == *" churn "* ]]; then
  echo "## 3. Churn: one client opens and closes $CHURN h3 connections one after another"
  start_server
  local r0 r1 r2 t0 t1
  r0=$(rss_kib "$SPID")
  t0=$(date +%s.%N)
  taskset -c "$CLIENT_CORE" "$H3GET" --connections "$WARM" -o /dev/null "$URL"
  sleep 1
  r1=$(rss_kib "$SPID")
  taskset -c "$CLIENT_CORE" "$H3GET" --connections "$((CHURN - WARM))" -o /dev/null "$URL"
  t1=$(date +%s.%N)
  sleep 1
  r2=$(rss_kib "$SPID")
  echo "  server RSS: $r0 KiB at start, $r1 KiB after $WARM connections, $r2 KiB after $CHURN ($(( r2 - r1 )) KiB growth over the last $((CHURN - WARM)); $(echo "$t0 $t1" | awk '{printf "%.0f", $2 - $1}') s)"
  stop_server
  echo
  fi
  echo "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg) (at end)"
  [[ -f $TMP/idle.jsonl ]] && { echo "## Appendix: idle.jsonl"; cat "$TMP/idle.jsonl"; }
  true
}

main 2>&1 | tee "$RESULT"
echo "result: $RESULT"
