#!/usr/bin/env bash
# bench/websocket.sh - WebSocket figures for issue 10, khamsin and nginx + lua-resty-websocket
# (Debian lua-nginx-websocket: require "nginx.websocket.server") in ONE run:
#   1. memory per idle WebSocket: RSS growth of the (single-worker) server from N/10 to N open
#      sockets (handshake done, nothing sent), divided by the 0.9 N sockets added: h1 cleartext, h1 over TLS, h2 (RFC 8441, one
#      connection per socket: the h2 connection's own cost is included);
#   2. echo messages (64-byte text, WINDOW=64 in flight per connection) per server CPU-second (utime +
#      stime of the server process from /proc), on the noisy-box method of bench/lib/common.sh:
#      khamsin and nginx alternating (A B, B A), ROUNDS kept rounds (disturbed rounds discarded and
#      redone), median [min..max] and the per-round ratio with a bootstrap CI95;
#   3. one k.publish to BCAST_N sockets: time from the publish request to the last delivery;
#   4. (PARTS=ir, not in the default set) user-space instructions per echoed 64-byte message,
#      khamsin only: the server under valgrind's callgrind, one socket, one message per round
#      trip; the counters are zeroed after IR_WARM round trips and dumped after IR_N more, so
#      the handshake and start-up are not counted (load-independent, like bench/callgrind.sh).
# For khamsin the idle part also prints, per socket, the C heap in use (glibc mallinfo2) and the
# Lua heap, each after a full Lua GC (GET /gc of bench/apps/websocket.lua): what the idle
# sockets themselves hold, beside VmRSS (which also keeps the allocators' high-water marks), and
# the growth of the resident pages of the [heap] mapping (glibc's main arena) and of the
# anonymous mappings (LuaJIT's allocator maps its own regions): what each allocator touched.
# PARTS ("idle echo broadcast") picks the parts; IDLE_CASES the idle part's server:mode cases
# ("khamsin:h1 nginx:h1 khamsin:tls khamsin:h2").
# Server pinned to SERVER_CORE, clients to CLIENT_CORE (taskset). The box is shared with other
# jobs: absolute figures move, ratios measured in the same run hold better.
#
#   bench/websocket.sh                                    # ~5 min
#   IDLE_N=2000 ROUNDS=1 ECHO_SECONDS=3 BCAST_N=1000 bench/websocket.sh   # smoke run
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CMDLINE="$0${*:+ $*}"
PY=/usr/bin/python3
. bench/lib/common.sh
W=bench/lib/wsbench.py
KHAMSIN_BIN=${KHAMSIN_BIN:-$ROOT/build/khamsin}
IDLE_N=${IDLE_N:-10000}
IDLE_N_TLS=${IDLE_N_TLS:-2000}
IDLE_N_H2=${IDLE_N_H2:-2000}
ECHO_CONNS=${ECHO_CONNS:-16}
ECHO_SECONDS=${ECHO_SECONDS:-8}
WINDOW=${WINDOW:-64}
ROUNDS=${ROUNDS:-5}
PARTS=${PARTS:-"idle echo broadcast"}
IR_WARM=${IR_WARM:-300}
IR_N=${IR_N:-2000}
IDLE_CASES=${IDLE_CASES:-"khamsin:h1 nginx:h1 khamsin:tls khamsin:h2"}
BCAST_N=${BCAST_N:-10000}
SERVER_CORE=${SERVER_CORE:-1}
CLIENT_CORE=${CLIENT_CORE:-0}
PORT=${PORT:-24080}
TLS_PORT=$((PORT + 1))
NGX_MODDIR=${NGX_MODDIR:-/usr/lib/nginx/modules}
TMP=$(mktemp -d /tmp/wsbench.XXXXXX)
OUT=${OUT:-bench/results/websocket-$(date -u +%Y%m%d-%H%M).txt}
ulimit -n 65536 2>/dev/null || ulimit -n 20000 2>/dev/null || true
SRV=""
cleanup() { [[ -n $SRV ]] && kill "$SRV" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

say() { echo "$*" | tee -a "$OUT"; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
# "HEAP ANON": resident KiB of the [heap] mapping (glibc's main arena: the C heap) and of the
# anonymous mappings (LuaJIT's allocator, which maps its own regions, plus mmapped blocks)
pages_kb() {
  awk '/^[0-9a-f]+-[0-9a-f]+ / {m = ($6 == "[heap]") ? "h" : ($6 == "" ? "a" : "")}
       /^Rss:/ {if (m == "h") h += $2; else if (m == "a") a += $2}
       END {print h + 0, a + 0}' "/proc/$1/smaps"
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
wait_port() { for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; return 1; }

# every server start takes fresh ports: a server that is still going away keeps none busy
next_ports() { PORT=$((PORT + 2)); TLS_PORT=$((PORT + 1)); }

start_khamsin() {
  next_ports
  taskset -c "$SERVER_CORE" "$KHAMSIN_BIN" --workers 1 --listen "tcp://127.0.0.1:$PORT" \
    --listen "tls://127.0.0.1:$TLS_PORT" --tls-self-signed bench/apps/websocket.lua \
    >"$TMP/khamsin.log" 2>&1 &
  SRV=$!
  wait_port "$PORT" || { say "khamsin did not start: $(tail -3 "$TMP/khamsin.log")"; exit 1; }
  MEASURE=$SRV
}

start_nginx() {
  next_ports
  mkdir -p "$TMP/ngx"
  cat >"$TMP/ngx/nginx.conf" <<NGX
$( [[ $(id -u) == 0 ]] && echo "user root;" )
worker_processes 1;
daemon off;
master_process on;
pid $TMP/ngx/nginx.pid;
worker_rlimit_nofile 65536;
load_module $NGX_MODDIR/ndk_http_module.so;
load_module $NGX_MODDIR/ngx_http_lua_module.so;
error_log $TMP/ngx/error.log warn;
events { worker_connections 30000; }
http {
  access_log off;
  client_body_temp_path $TMP/ngx; proxy_temp_path $TMP/ngx; fastcgi_temp_path $TMP/ngx;
  uwsgi_temp_path $TMP/ngx; scgi_temp_path $TMP/ngx;
  lua_package_path "/usr/share/lua/5.1/?.lua;;";
  server {
    listen 127.0.0.1:$PORT;
    location /echo {
      content_by_lua_block {
        local server = require "nginx.websocket.server"
        local wb = server:new { timeout = 600000, max_payload_len = 1048576 }
        if not wb then return ngx.exit(444) end
        while true do
          local data, typ, err = wb:recv_frame()
          if not data then
            if not (err and err:find("timeout", 1, true)) then return end
          elseif typ == "close" then wb:send_close(1000) return
          elseif typ == "ping" then wb:send_pong(data)
          elseif typ == "text" then wb:send_text(data)
          elseif typ == "binary" then wb:send_binary(data) end
        end
      }
    }
  }
}
NGX
  taskset -c "$SERVER_CORE" nginx -c "$TMP/ngx/nginx.conf" -p "$TMP/ngx" >"$TMP/ngx/out.log" 2>&1 &
  SRV=$!
  wait_port "$PORT" || { say "nginx did not start: $(tail -3 "$TMP/ngx/error.log")"; exit 1; }
  sleep 0.2
  MEASURE=$(pgrep -P "$SRV" | head -1) # the worker
}

stop_server() { kill "$SRV" 2>/dev/null || true; wait "$SRV" 2>/dev/null || true; SRV=""; sleep 0.3; }

# idle SERVER MODE N PATH -> bytes per socket
idle() {
  local srv=$1 mode=$2 n=$3 path=$4
  "start_$srv"
  local port=$PORT
  [[ $mode == tls ]] && port=$TLS_PORT
  sleep 1
  local r0 r1 k0 got
  mkfifo "$TMP/hold"
  taskset -c "$CLIENT_CORE" $PY $W idle "$port" "$n" "$mode" "$path" <"$TMP/hold" >"$TMP/idle.out" 2>&1 &
  local cl=$!
  exec 7>"$TMP/hold"
  waitready() { # COUNT: wait for the COUNTth "ready" line
    for _ in $(seq 1 1800); do
      [[ $(grep -c ready "$TMP/idle.out" 2>/dev/null) -ge $1 ]] && return 0
      kill -0 "$cl" 2>/dev/null || return 1 # the client failed
      sleep 0.1
    done
    return 1
  }
  waitready 1 || true
  sleep 1
  local g0="0 0" g1="0 0"
  [[ $srv == khamsin ]] && g0=$(curl -s --max-time 10 "http://127.0.0.1:$PORT/gc")
  r0=$(rss_kb "$MEASURE")
  local p0 p1
  p0=$(pages_kb "$MEASURE")
  k0=$(awk '/ready/ {print $2; exit}' "$TMP/idle.out")
  echo go >&7
  waitready 2 || true
  sleep 2
  [[ $srv == khamsin ]] && g1=$(curl -s --max-time 10 "http://127.0.0.1:$PORT/gc")
  r1=$(rss_kb "$MEASURE")
  p1=$(pages_kb "$MEASURE")
  got=$(awk '/ready/ {n = $2} END {print n}' "$TMP/idle.out")
  exec 7>&-
  wait "$cl" 2>/dev/null || true
  rm -f "$TMP/hold"
  stop_server
  if [[ -z $got || -z $k0 || $got == "$k0" ]]; then say "  $srv $mode: client failed: $(tail -2 "$TMP/idle.out")"; return; fi
  local heaps="" l0 m0 l1 m1
  read -r l0 m0 <<<"$g0"
  read -r l1 m1 <<<"$g1"
  local h0 a0 h1 a1
  read -r h0 a0 <<<"$p0"
  read -r h1 a1 <<<"$p1"
  [[ $srv == khamsin ]] && heaps=" (C heap $(( (m1 - m0) / (got - k0) )) + Lua heap $(( (l1 - l0) / (got - k0) )); pages: [heap] $(( (h1 - h0) * 1024 / (got - k0) )), anonymous $(( (a1 - a0) * 1024 / (got - k0) )))"
  say "  $srv $mode: $got sockets; RSS $r0 KiB at $k0 sockets -> $r1 KiB at $got: $(( (r1 - r0) * 1024 / (got - k0) )) bytes per idle WebSocket$heaps"
  local name=$srv; [[ $srv == nginx ]] && name=nginx-lua
  echo "{\"round\": 1, \"server\": \"$name\", \"mode\": \"$mode\", \"bytes_per_ws\": $(( (r1 - r0) * 1024 / (got - k0) ))}" >>"$TMP/idle.jsonl"
}

echo_round() { # SERVER -> messages per server CPU-second
  local srv=$1
  "start_$srv"
  taskset -c "$CLIENT_CORE" $PY $W echo "$PORT" "$ECHO_CONNS" 1 64 "$WINDOW" >/dev/null # warm-up
  local c0 c1 n
  c0=$(cpu_ticks "$MEASURE")
  n=$(taskset -c "$CLIENT_CORE" $PY $W echo "$PORT" "$ECHO_CONNS" "$ECHO_SECONDS" 64 "$WINDOW")
  c1=$(cpu_ticks "$MEASURE")
  stop_server
  local tck
  tck=$(getconf CLK_TCK)
  awk -v n="$n" -v c="$((c1 - c0))" -v t="$tck" 'BEGIN { if (c == 0) c = 1; printf "%d %.0f\n", n, n / (c / t) }'
}

: >"$OUT"
say "# bench/websocket.sh, $(date -u +%FT%TZ), command: $CMDLINE"
say "# khamsin: $KHAMSIN_BIN ($(git rev-parse --short HEAD)); nginx $(nginx -v 2>&1 | sed 's/.*\///') + lua-nginx-websocket"
say "# host: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start (shared with other jobs)"
say "# server on core $SERVER_CORE, clients on core $CLIENT_CORE"
say ""
if [[ " $PARTS " == *" idle "* ]]; then
say "1. memory per idle WebSocket (RSS growth / sockets)"
for c in $IDLE_CASES; do
  case $c in
    *:h1) idle "${c%:*}" h1 "$IDLE_N" /echo ;;
    *:tls) idle "${c%:*}" tls "$IDLE_N_TLS" /echo ;;
    *:h2) idle "${c%:*}" h2 "$IDLE_N_H2" /echo ;;
  esac
done
# memory is not a rate: one measure per case (no rounds); the summary row says n=1
[[ -s $TMP/idle.jsonl ]] && $PY $METHOD summary "$TMP/idle.jsonl" --metric bytes_per_ws --lower bytes_per_ws --group mode \
  --label "memory per idle WebSocket (RSS growth / sockets, one measure)" 2>&1 | tee -a "$OUT"
say ""
fi
if [[ " $PARTS " == *" echo "* ]]; then
say "2. echo, 64-byte text, $ECHO_CONNS connections x $WINDOW in flight, $ECHO_SECONDS s windows"
say "   $(bench_method_line | tail -1)"
bench_rounds_init "$TMP"
while bench_round_next; do
  r=$BENCH_ROUND
  if ((r % 2)); then order="khamsin nginx"; else order="nginx khamsin"; fi
  line="  round $r:"
  for srv in $order; do
    read -r n rate < <(echo_round "$srv")
    name=$srv; [[ $srv == nginx ]] && name=nginx-lua
    echo "{\"round\": $r, \"server\": \"$name\", \"msg_per_cpu\": $rate, \"messages\": $n}" >>"$TMP/echo.jsonl"
    line="$line $name $rate msg/CPU-s ($n messages)"
  done
  say "$line"
  bench_round_end 2>&1 | tee -a "$OUT" || true
done
bench_summary "$TMP/echo.jsonl" --metric msg_per_cpu --label "WebSocket echo 64 B (x$ECHO_CONNS conns, $WINDOW in flight) vs lua-resty-websocket" 2>&1 | tee -a "$OUT"
say ""
fi
if [[ " $PARTS " == *" broadcast "* ]]; then
say "3. one k.publish to $BCAST_N sockets (64 bytes): seconds to the last delivery, 3 publishes"
start_khamsin
say "  $(taskset -c "$CLIENT_CORE" $PY $W broadcast "$PORT" "$BCAST_N" 3)"
stop_server
fi
if [[ " $PARTS " == *" ir "* ]]; then
say "4. instructions per echoed 64-byte message (callgrind, one socket, one message in flight; counters zeroed after $IR_WARM, dumped after $IR_N)"
command -v valgrind >/dev/null || { say "  needs valgrind"; exit 1; }
next_ports
valgrind --tool=callgrind --callgrind-out-file="$TMP/ws.cg" "$KHAMSIN_BIN" --workers 1 \
  --listen "tcp://127.0.0.1:$PORT" bench/apps/websocket.lua >"$TMP/cg.log" 2>&1 &
SRV=$!
for _ in $(seq 1 600); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
mkfifo "$TMP/cghold"
$PY $W pingpong "$PORT" "$IR_WARM" "$IR_N" 64 <"$TMP/cghold" >"$TMP/pp.out" 2>&1 &
PP=$!
exec 8>"$TMP/cghold"
waitline() { for _ in $(seq 1 3000); do grep -q "$1" "$TMP/pp.out" && return 0; kill -0 "$PP" 2>/dev/null || return 1; sleep 0.1; done; return 1; }
waitline '^warm' || { say "  the client failed: $(tail -2 "$TMP/pp.out"); server: $(tail -3 "$TMP/cg.log")"; exit 1; }
callgrind_control -z "$SRV" >/dev/null 2>&1
echo go >&8
waitline '^done' || { say "  the client failed: $(tail -2 "$TMP/pp.out")"; exit 1; }
callgrind_control -d "$SRV" >/dev/null 2>&1
exec 8>&-
wait "$PP" || true
stop_server
dump=$(ls "$TMP"/ws.cg.* 2>/dev/null | head -1)
[[ -n $dump ]] || { say "  no callgrind dump"; exit 1; }
ir=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
say "  khamsin ($(git rev-parse --short HEAD), $KHAMSIN_BIN): $ir Ir for $IR_N messages: $((ir / IR_N)) instructions per echoed message"
fi
