#!/usr/bin/env bash
# bench/h3mem.sh - memory of HTTP/3 connections (issue 12 item 5), load-independent figures:
#   1. idle h2 over TLS: IDLE_CONNS connections (TLS 1.3 handshake, preface, SETTINGS, one GET
#      each, response read) held idle; server PSS delta / IDLE_CONNS (bench/lib/h2bench.py idle)
#   2. idle h3: IDLE_CONNS kh-h3get processes (--fork, BATCH at a time), one GET each then idle;
#      server PSS delta / IDLE_CONNS, taken 1 s after the last response
#   3. churn: one kh-h3get opens and closes CHURN connections one after another (a GET each);
#      server RSS after WARM connections and after all of them (1 s later: closing periods over)
# Each part on a fresh server (khamsin --http3, one worker, on SERVER_CORE; clients on
# CLIENT_CORE), the same TLS listener for h2 and h3 (self-signed ECDSA certificate).
#
#   bench/h3mem.sh                                    # ~2-4 min
#   IDLE_CONNS=200 CHURN=2000 WARM=500 bench/h3mem.sh  # smoke run
#
# Env knobs (defaults): IDLE_CONNS=1000 BATCH=50 CHURN=10000 WARM=1000 PORT=26480
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
BATCH=${BATCH:-50}
PARTS=${PARTS:-"h2idle h3idle churn"}
CHURN=${CHURN:-10000}
WARM=${WARM:-1000}
PORT=${PORT:-26480}
KHAMSIN_BIN=${KHAMSIN_BIN:-$ROOT/build/khamsin}
H3GET=$(dirname "$KHAMSIN_BIN")/kh-h3get
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

main() {
  trap cleanup EXIT
  trap 'exit 130' INT TERM HUP
  [[ -x $KHAMSIN_BIN && -x $H3GET ]] || fail "build first: cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build --target khamsin khamsin-tls khamsin-h3 kh-h3get"
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
  taskset -c "$CLIENT_CORE" "$H3GET" --connections 200 -o /dev/null "$URL" # warm-up
  sleep 1
  local before after n i
  before=$(pss_kib "$SPID")
  # in batches of BATCH processes (1000 handshakes at once would overrun one busy core's
  # handshake timeout), each holding its connection idle until killed
  local holds=() b got=0
  for ((b = 0; b * BATCH < IDLE_CONNS; b++)); do
    local k=$(( IDLE_CONNS - b * BATCH < BATCH ? IDLE_CONNS - b * BATCH : BATCH ))
    # (--timeout: QUIC's idle timeout is the smaller of the two sides')
    taskset -c "$CLIENT_CORE" "$H3GET" --fork "$k" --linger 1200 --timeout 1200 -w -o /dev/null "$URL" 2>"$TMP/hold.$b.err" &
    holds+=($!)
    # a batch is in when each of its processes got its response or gave up
    for ((i = 0; i < 1200; i++)); do
      n=$(cat "$TMP/hold.$b.err" | grep -c -e status=200 -e 'connections failed' || true)
      ((n >= k)) && break
      sleep 0.1
    done
  done
  sleep 1
  got=$(cat "$TMP"/hold.*.err | grep -c status=200 || true)
  ((got >= IDLE_CONNS * 9 / 10)) || fail "only $got of $IDLE_CONNS h3 connections got their response"
  after=$(pss_kib "$SPID")
  echo "  khamsin-h3    $got idle h3 connections ($((IDLE_CONNS - got)) of $IDLE_CONNS did not get theirs on the loaded box): PSS $before KiB -> $after KiB, $(( (after - before) * 1024 / got )) bytes per connection"
  for b in "${holds[@]}"; do kill_tree "$b" >/dev/null 2>&1; done
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
