#!/usr/bin/env bash
# bench/proxy.sh - a reverse-proxy hop per request, per second of the proxy's CPU (issue 14,
# item 5): every request to the proxy makes one request to an upstream nginx that serves a
# static "hello" (keep-alive to the upstream in both cases).
#   khamsin  /proxy   a Lua handler: k.http.get(upstream) (bench/apps/proxy.lua), HTTP/1.1 pool
#   nginx    /proxy   nginx's own C proxy_pass with `keepalive 64` to the same upstream
# Proxies pinned to SERVER_CORE; wrk and the upstream nginx to WRK_CORE (the box has 2 cores);
# proxy CPU from /proc/PID/stat (utime+stime) over each wrk window; rounds alternate the proxies.
#
#   bench/proxy.sh                         # ~1 min; result in bench/results/proxy-<stamp>.txt
#   DURATION=3 ROUNDS=3 bench/proxy.sh
#   CALLGRIND=1 bench/proxy.sh             # + instructions per proxied request (~2 min more)
# Also: syscalls per proxied request of each proxy (strace -c). Shared glue: bench/lib/upstream.sh.
# Env: DURATION=5 ROUNDS=5 CONNS=64 KHAMSIN_BIN=build-release/khamsin SERVER_CORE=1 WRK_CORE=0
#      PORT=24190 (khamsin; nginx proxy PORT+1, upstream PORT+2) CALLGRIND=0
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
NAME=proxy
DURATION=${DURATION:-5}
CONNS=${CONNS:-64}
PORT=${PORT:-24190}
UP_PORT=$((PORT + 2))
NGX_PORT=$((PORT + 1))
CALLGRIND=${CALLGRIND:-0}
source bench/lib/upstream.sh

up_header
echo "# $(nginx -v 2>&1)"

user=""; [[ $(id -u) == 0 ]] && user="user root;"
ngx_conf() { # name listen-block
  mkdir -p "$TMP/$1"
  cat >"$TMP/$1/nginx.conf" <<NGX
$user
worker_processes 1;
master_process off;
daemon off;
pid $TMP/$1/nginx.pid;
error_log $TMP/$1/error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $TMP/$1/cb; proxy_temp_path $TMP/$1/px; fastcgi_temp_path $TMP/$1/fc;
  uwsgi_temp_path $TMP/$1/uw; scgi_temp_path $TMP/$1/sc;
  $2
}
NGX
}
ngx_conf upstream "server { listen 127.0.0.1:$UP_PORT; keepalive_requests 1000000;
    location = /hello { default_type text/plain; return 200 'hello'; } }"
ngx_conf proxy "upstream up { server 127.0.0.1:$UP_PORT; keepalive 64; keepalive_requests 1000000; }
  server { listen 127.0.0.1:$NGX_PORT; keepalive_requests 1000000;
    location = / { return 200 'ok'; }
    location = /proxy { proxy_pass http://up/hello; proxy_http_version 1.1;
      proxy_set_header Connection \"\"; proxy_buffering on; } }"

taskset -c "$WRK_CORE" nginx -p "$TMP/upstream/" -c "$TMP/upstream/nginx.conf" >"$TMP/up.out" 2>&1 &
PIDS+=($!)
taskset -c "$SERVER_CORE" nginx -p "$TMP/proxy/" -c "$TMP/proxy/nginx.conf" >"$TMP/ngx.out" 2>&1 &
NPID=$!
PIDS+=("$NPID")
UPSTREAM_PORT=$UP_PORT taskset -c "$SERVER_CORE" "$KHAMSIN_BIN" --workers 1 --listen "127.0.0.1:$PORT" \
  --log-level warn --slice-warn-ms 0 bench/apps/proxy.lua >"$TMP/khamsin.log" 2>&1 &
KPID=$!
PIDS+=("$KPID")
$PY $LIB ready "$UP_PORT" /hello 10 || { cat "$TMP/up.out" "$TMP/upstream/error.log"; exit 1; }
$PY $LIB ready "$NGX_PORT" / 10 || { cat "$TMP/ngx.out" "$TMP/proxy/error.log"; exit 1; }
$PY $LIB ready "$PORT" / 10 || { cat "$TMP/khamsin.log"; exit 1; }
for p in "$PORT" "$NGX_PORT"; do
  v=$(curl -s -m 5 "http://127.0.0.1:$p/proxy")
  [[ $v == hello ]] || { echo "port $p /proxy answered '$v'"; tail -5 "$TMP/khamsin.log"; exit 1; }
done

RUNS=("khamsin-k.http $KPID $PORT /proxy" "nginx-proxy_pass $NPID $NGX_PORT /proxy")
echo
echo "## proxied requests per second of proxy CPU; wrk -c$CONNS, ${DURATION}s windows"
up_rounds 1 req/cpu-s "${RUNS[@]}"
echo
echo "## medians (requests per proxy CPU-second; min..max over the kept rounds)"
up_medians "${RUNS[@]}"
K=$(echo "${PER_CPU[khamsin-k.http]}" | median)
N=$(echo "${PER_CPU[nginx-proxy_pass]}" | median)
echo
echo "## ratio (medians): khamsin k.http / nginx proxy_pass = $(ratio "$K" "$N")  (target >= 0.8)"
echo "## ratio within each round, median: $(up_pair_ratio khamsin-k.http nginx-proxy_pass)"
up_summary khamsin-k.http nginx-proxy_pass "reverse proxy hop per proxy CPU-second, vs nginx proxy_pass (wrk -c$CONNS)"
echo "## open upstream connections at the end (ss): khamsin $(ss -tnp 2>/dev/null | grep -c "pid=$KPID,.*" || true)"
echo "## syscalls per proxied request (strace -c -f over a 2 s wrk window; strace slows the"
echo "## server, the counts are what matters):"
for run in "${RUNS[@]}"; do
  read -r name pid port path <<<"$run"
  if ! command -v strace >/dev/null; then echo "(no strace)"; break; fi
  timeout 4 strace -c -f -p "$pid" -o "$TMP/strace.$name" >/dev/null 2>&1 &
  SPID=$!
  sleep 0.5
  n=$(taskset -c "$WRK_CORE" wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$port$path" | awk '/requests in/ {print $1}')
  wait "$SPID" || true
  awk -v n="$n" -v name="$name" '$NF ~ /^[a-z_0-9]+$/ && $4 ~ /^[0-9]+$/ && $NF != "epoll_wait" && $NF != "total" {
      s = s sprintf(" %s %.2f", $NF, $4 / n); t += $4 }
    END { printf "%-20s %.2f per request (epoll_wait left out):%s\n", name, t / n, s }' "$TMP/strace.$name"
done
if [[ $CALLGRIND == 1 ]]; then
  # Instructions per proxied request in khamsin's user space (load-independent): callgrind runs
  # of the server, one with a warm-up only, one with the warm-up and then a load window; the
  # difference of their totals over the difference of their request counts.
  kill -TERM "$KPID"; wait "$KPID" 2>/dev/null || true
  cg_run() { # out seconds -> requests served
    UPSTREAM_PORT=$UP_PORT valgrind --tool=callgrind --callgrind-out-file="$1" "$KHAMSIN_BIN" \
      --workers 1 --listen "127.0.0.1:$PORT" --log-level warn --slice-warn-ms 0 bench/apps/proxy.lua \
      >"$TMP/cg.log" 2>&1 &
    local p=$! w n=0
    $PY $LIB ready "$PORT" / 60 >/dev/null
    w=$(taskset -c "$WRK_CORE" wrk -t1 -c4 -d4s "http://127.0.0.1:$PORT/proxy" | awk '/requests in/ {print $1}')
    if (($2 > 0)); then
      n=$(taskset -c "$WRK_CORE" wrk -t1 -c4 -d"$2"s "http://127.0.0.1:$PORT/proxy" | awk '/requests in/ {print $1}')
    fi
    kill -TERM "$p"; wait "$p" 2>/dev/null || true
    echo $((w + n + 1))
  }
  cg_total() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'; }
  b=$(cg_run "$TMP/cg.base" 0)
  l=$(cg_run "$TMP/cg.load" 10)
  echo "## callgrind: $(( ($(cg_total "$TMP/cg.load") - $(cg_total "$TMP/cg.base")) / (l - b) )) instructions per proxied request in khamsin (user space; $((l - b)) requests)"
fi
