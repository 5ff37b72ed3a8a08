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
# Env: DURATION=5 ROUNDS=5 CONNS=64 KHAMSIN_BIN=build-release/khamsin SERVER_CORE=1 WRK_CORE=0
#      PORT=24190 (khamsin; nginx proxy PORT+1, upstream PORT+2)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=/usr/bin/python3
LIB=bench/lib/waitbench.py
DURATION=${DURATION:-5}
CONNS=${CONNS:-64}
ROUNDS=${ROUNDS:-5}
SERVER_CORE=${SERVER_CORE:-1}
WRK_CORE=${WRK_CORE:-0}
PORT=${PORT:-24190}
UP_PORT=$((PORT + 2))
NGX_PORT=$((PORT + 1))
KHAMSIN_BIN_DEFAULT="$ROOT/build-release/khamsin"
KHAMSIN_BIN=${KHAMSIN_BIN:-$KHAMSIN_BIN_DEFAULT}
STAMP=$(date +%Y%m%d-%H%M%S)
OUT=bench/results/proxy-$STAMP.txt
TMP=$(mktemp -d /tmp/khproxy.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; sleep 0.3;
            for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

if [[ $KHAMSIN_BIN == "$KHAMSIN_BIN_DEFAULT" || ! -x $KHAMSIN_BIN ]]; then
  cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build-release -j"$(nproc)" --target khamsin >/dev/null
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

exec > >(tee "$OUT") 2>&1
echo "# bench/proxy.sh $STAMP"
echo "# command: ${BASH_SOURCE[0]} (DURATION=$DURATION ROUNDS=$ROUNDS CONNS=$CONNS SERVER_CORE=$SERVER_CORE WRK_CORE=$WRK_CORE)"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (the machine is shared with other runs: figures are noisy, compare the ratios of one run)"
echo "# machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -r)"
echo "# khamsin: $KHAMSIN_BIN ($(git rev-parse --short HEAD 2>/dev/null)); $(nginx -v 2>&1)"

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
printf '%-18s %6s %10s %14s %10s %8s %7s\n' server round req/s req/cpu-s cpu_share non2xx errors
declare -A RC
for run in "${RUNS[@]}"; do # warm-up (JIT, pools)
  read -r name pid port path <<<"$run"
  $PY $LIB window "$pid" "$port" "$path" "$CONNS" 1 "$WRK_CORE" >/dev/null
done
for ((r = 1; r <= ROUNDS; r++)); do
  for run in "${RUNS[@]}"; do
    read -r name pid port path <<<"$run"
    read -r rps cpu_us share non2xx errs < <($PY $LIB window "$pid" "$port" "$path" "$CONNS" "$DURATION" "$WRK_CORE")
    rcpu=$(awk -v c="$cpu_us" 'BEGIN { if (c > 0) printf "%.0f", 1e6 / c; else print 0 }')
    RC[$name]="${RC[$name]:-} $rcpu"
    printf '%-18s %6s %10s %14s %10s %8s %7s\n' "$name" "$r" "$rps" "$rcpu" "$share" "$non2xx" "$errs"
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
spread() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {printf "%s..%s", a[1], a[NR]}'; }
echo
echo "## medians (requests per proxy CPU-second; min..max over $ROUNDS rounds)"
for run in "${RUNS[@]}"; do
  read -r name _ <<<"$run"
  printf '%-18s %12s  (%s)\n' "$name" "$(echo "${RC[$name]}" | median)" "$(echo "${RC[$name]}" | spread)"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
K=$(echo "${RC[khamsin-k.http]}" | median)
N=$(echo "${RC[nginx-proxy_pass]}" | median)
echo
echo "## ratio (medians): khamsin k.http / nginx proxy_pass = $(ratio "$K" "$N")  (target >= 0.8)"
echo "## open upstream connections at the end (ss): khamsin $(ss -tnp 2>/dev/null | grep -c "pid=$KPID,.*" || true)"
