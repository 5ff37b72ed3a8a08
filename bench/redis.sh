#!/usr/bin/env bash
# bench/redis.sh - Redis round trips per second of server CPU from Lua handlers (issue 14, item 5,
# the Redis part). Each request does one SET and one GET (2 round trips) on a pooled connection:
#   khamsin /lua-redis  Debian's lua-redis (redis-lua, written for luasocket) unchanged on k.socket
#   khamsin /raw        a minimal RESP exchange on k.socket (bench/apps/redis_raw.lua): what
#                       lua-redis itself costs
#   khamsin /blocking   lua-redis on blocking luasocket in k.blocking pool threads (the way
#                       before k.socket; the pool threads' CPU counts, they are in the process)
#   nginx   /raw        the same RESP code on OpenResty's cosockets (lua-nginx-module), the anchor
# Debian 12 has no lua-resty-redis package (apt-cache show lua-resty-redis: "No packages
# found"), so OpenResty runs the same hand-written RESP exchange as khamsin's /raw.
# Server pinned to SERVER_CORE, wrk and redis-server to WRK_CORE; server CPU from /proc/PID/stat
# (utime+stime, all threads) over each wrk window; rounds alternate the servers.
#
#   bench/redis.sh                         # ~2 min; result in bench/results/redis-<stamp>.txt
#   DURATION=3 ROUNDS=3 bench/redis.sh
# Env: DURATION=5 ROUNDS=5 CONNS=64 KHAMSIN_BIN=build-release/khamsin SERVER_CORE=1 WRK_CORE=0
#      PORT=24090 REDIS_PORT=24091 BLOCKING=1 (0: without the k.blocking run)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
NAME=redis
DURATION=${DURATION:-5}
CONNS=${CONNS:-64}
PORT=${PORT:-24090}
REDIS_PORT=${REDIS_PORT:-24091}
source bench/lib/upstream.sh

up_header
echo "# $(redis-server --version | cut -d' ' -f1-3), lua-redis $(dpkg-query -W -f='${Version}' lua-redis)"
echo "# lua-resty-redis: $(apt-cache show lua-resty-redis >/dev/null 2>&1 && echo packaged || echo 'not packaged in Debian 12: OpenResty runs the same hand-written RESP code as /raw')"

taskset -c "$WRK_CORE" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done

REDIS_PORT=$REDIS_PORT taskset -c "$SERVER_CORE" "$KHAMSIN_BIN" --workers 1 --listen "127.0.0.1:$PORT" \
  --log-level warn --slice-warn-ms 0 --pool-threads 4 --pool-queue 1024 bench/apps/redisbench.lua \
  >"$TMP/khamsin.log" 2>&1 &
KPID=$!
PIDS+=("$KPID")
$PY $LIB ready "$PORT" / 10 || { cat "$TMP/khamsin.log"; exit 1; }
for p in /lua-redis /raw /blocking; do
  v=$(curl -s -m 5 "http://127.0.0.1:$PORT$p")
  [[ $v == hello ]] || { echo "khamsin $p answered '$v'"; tail -5 "$TMP/khamsin.log"; exit 1; }
done

NGINX=0
NPID=
if [[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ]]; then
  mkdir -p "$TMP/ngx"
  user=""; [[ $(id -u) == 0 ]] && user="user root;"
  cat >"$TMP/ngx/nginx.conf" <<NGX
$user
worker_processes 1;
master_process off;
daemon off;
pid $TMP/ngx/nginx.pid;
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
error_log $TMP/ngx/error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 4096; }
http {
  access_log off;
  lua_package_path "$ROOT/bench/apps/?.lua;;";
  lua_socket_log_errors off;
  client_body_temp_path $TMP/ngx/cb; proxy_temp_path $TMP/ngx/px; fastcgi_temp_path $TMP/ngx/fc;
  uwsgi_temp_path $TMP/ngx/uw; scgi_temp_path $TMP/ngx/sc;
  server {
    listen 127.0.0.1:$((PORT + 2));
    location = / { content_by_lua_block { ngx.print("ok") } }
    location = /raw { content_by_lua_block {
      local v, err = require("redis_raw").getset(ngx.socket.tcp, $REDIS_PORT)
      if not v then ngx.status = 500 ngx.print(err) return end
      ngx.header["Content-Length"] = #v
      ngx.print(v)
    } }
  }
}
NGX
  taskset -c "$SERVER_CORE" nginx -p "$TMP/ngx/" -c "$TMP/ngx/nginx.conf" -e "$TMP/ngx/error.log" >"$TMP/ngx.out" 2>&1 &
  NPID=$!
  PIDS+=("$NPID")
  if $PY $LIB ready "$((PORT + 2))" / 10 && [[ $(curl -s -m 5 "http://127.0.0.1:$((PORT + 2))/raw") == hello ]]; then
    NGINX=1
  else
    echo "# nginx + lua-nginx-module did not run the /raw location: OpenResty column left out"
    tail -5 "$TMP/ngx/error.log" "$TMP/ngx.out"
  fi
fi

# name pid port path
RUNS=("khamsin-lua-redis $KPID $PORT /lua-redis" "khamsin-raw $KPID $PORT /raw")
# BLOCKING=0 leaves out lua-redis in the k.blocking pool (all.sh: no summary row uses it)
[[ ${BLOCKING:-1} == 1 ]] && RUNS+=("khamsin-blocking $KPID $PORT /blocking")
[[ $NGINX == 1 ]] && RUNS+=("openresty-raw $NPID $((PORT + 2)) /raw")

echo
echo "## round trips (2 per request: SET + GET) per second of server CPU; wrk -c$CONNS, ${DURATION}s windows"
up_rounds 2 rt/cpu-s "${RUNS[@]}"
echo
echo "## medians (round trips per server CPU-second; min..max over the kept rounds)"
up_medians "${RUNS[@]}"
LR=$(echo "${PER_CPU[khamsin-lua-redis]}" | median)
RAW=$(echo "${PER_CPU[khamsin-raw]}" | median)
BLK=$(echo "${PER_CPU[khamsin-blocking]:-}" | median || true)
echo
echo "## ratios (medians)"
echo "lua-redis on k.socket / raw RESP on k.socket:          $(ratio "$LR" "$RAW")"
echo "lua-redis on k.socket / lua-redis in k.blocking pool:  $(ratio "$LR" "$BLK")"
if [[ $NGINX == 1 ]]; then
  ORR=$(echo "${PER_CPU[openresty-raw]}" | median)
  echo "raw RESP: khamsin k.socket / OpenResty ngx.socket:     $(ratio "$RAW" "$ORR")"
  echo "lua-redis on k.socket / OpenResty raw RESP:            $(ratio "$LR" "$ORR")"
fi
echo
if [[ $NGINX == 1 ]]; then
  up_summary khamsin-raw openresty-raw "Redis SET+GET round trips per server CPU-second, raw RESP: k.socket vs OpenResty cosocket"
  up_summary khamsin-lua-redis openresty-raw "Redis round trips per server CPU-second: lua-redis on k.socket vs OpenResty raw RESP"
else
  up_summary khamsin-lua-redis khamsin-raw "Redis round trips per server CPU-second: lua-redis vs raw RESP, both on k.socket"
fi
