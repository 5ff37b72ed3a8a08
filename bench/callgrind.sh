#!/usr/bin/env bash
# bench/callgrind.sh - user-space instructions per request of a hello-world GET, counted by
# valgrind's callgrind (repeatable, unlike time: the same binary and load give the same count).
#
#   bench/callgrind.sh                      # ~1 min; KHAMSIN_BIN=build-release/khamsin SECONDS_LOAD=5
#   PROTO=h2 bench/callgrind.sh             # the same over h2c: h2load -c4 -m10 instead of wrk
#   PROTO=h2 REQUESTS=4000 bench/callgrind.sh  # a fixed number of requests (h2load -n), so two
#                                           # binaries are compared on the same work
#   REQUESTS=20000 CONNS=64 bench/callgrind.sh                   # h1: h2load --h1 -n -c
#   SERVER=nginx-lua REQUESTS=20000 CONNS=64 bench/callgrind.sh  # the anchor, same load (issue 15)
#   APP=bench/apps/hello_headers.lua bench/callgrind.sh   # another app; its nginx counterpart:
#   SERVER=nginx-lua NGX_LUA="$(sed -n 's/^-- nginx: //p' bench/apps/hello_headers.lua)" bench/callgrind.sh
#   KHAMSIN_ARGS="--request-id-header 0" bench/callgrind.sh  # more khamsin options (split on spaces)
#   FOOTPRINT=1 REQUESTS=2000 CONNS=64 bench/callgrind.sh  # instead: distinct 4 KiB pages and
#                                           # 64-byte lines touched between two syscalls, per
#                                           # request (valgrind's lackey; bench/lib/footprint.py says why)
#   CACHE=1 REQUESTS=20000 CONNS=64 bench/callgrind.sh   # also valgrind's cache simulation
#                                           # (--cache-sim=yes): I1/D1 and last-level (LL) misses
#                                           # per request, and the top functions by D1 misses
#   HEADERS=browser APP=bench/apps/hello_headers.lua bench/callgrind.sh  # each request also
#                                           # carries a browser's 9 header fields (BROWSER_HEADERS
#                                           # below; HEADERS='A: 1|B: 2' others), h1 and h2 alike
#
# Two runs of the server under callgrind: one that only starts and stops, one that also serves
# the load. (Ir of the second - Ir of the first) / requests served = instructions per request,
# the whole process: parser, Lua, libuv, libc (the kernel is not counted).
# SERVER=nginx-lua runs nginx (one process: `master_process off`) with bench/http1.sh's
# content_by_lua_block hello (NGX_HELLO_LUA, bench/lib/common.sh; NGX_LUA= another), loaded the same way: the ratio
# of the two is the load-independent stand-in for http1.sh's "req per server CPU-s".
# Under callgrind the server is ~50x slower than the client, so it is saturated: each loop turn
# finds every connection ready (the batching of a saturated server at CONNS connections).
# Also prints the top functions of the loaded run (INCLUSIVE=1: inclusive costs, a call tree's
# split). This is what the figures in comments of core/kh_stream.c and core/kh_h1.c were measured with.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BIN=${KHAMSIN_BIN:-build-release/khamsin}
SECONDS_LOAD=${SECONDS_LOAD:-5}
PORT=${PORT:-23190}
PROTO=${PROTO:-h1}
REQUESTS=${REQUESTS:-}
CONNS=${CONNS:-}
SERVER=${SERVER:-khamsin}
APP=${APP:-bench/apps/hello.lua}
INCLUSIVE=${INCLUSIVE:-0}
CACHE=${CACHE:-0}
VG_ARGS=(--tool=callgrind)
((CACHE == 1)) && VG_ARGS+=(--cache-sim=yes)
KHAMSIN_ARGS=${KHAMSIN_ARGS:-}
# What Firefox sends for a page, less Host (the client's own) and cookies: 9 fields, 350 bytes.
BROWSER_HEADERS='User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0|Accept: text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8|Accept-Language: en-US,en;q=0.5|Accept-Encoding: gzip, deflate, br|Connection: keep-alive|Upgrade-Insecure-Requests: 1|Sec-Fetch-Dest: document|Sec-Fetch-Mode: navigate|Sec-Fetch-Site: none'
HEADERS=${HEADERS:-}
[[ $HEADERS == browser ]] && HEADERS=$BROWSER_HEADERS
HDR_ARGS=()
if [[ -n $HEADERS ]]; then
  IFS='|' read -r -a hdr_list <<<"$HEADERS"
  for h in "${hdr_list[@]}"; do HDR_ARGS+=(-H "$h"); done
fi
KEEP=${KEEP:-} # a directory: the two callgrind.out files are kept there
# WARMUP_SECONDS=n: n seconds of the same load before the counters are zeroed (callgrind_control
# -z), in both runs: then the figure leaves out the JIT's recording and compiling of the first
# requests (LuaJIT's, in khamsin and nginx + lua alike), which the default spreads over the run
WARMUP_SECONDS=${WARMUP_SECONDS:-0}
NGX_MODDIR=${NGX_MODDIR:-/usr/lib/nginx/modules}
source bench/lib/common.sh
NGX_LUA=${NGX_LUA:-$NGX_HELLO_LUA} # the nginx location's content (SERVER=nginx-lua)
command -v valgrind >/dev/null || { echo "needs valgrind" >&2; exit 1; }
if [[ $SERVER == khamsin && ! -x $BIN ]]; then
  cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build-release -j2 --target khamsin >/dev/null
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

if [[ $SERVER == nginx-lua ]]; then
  mkdir -p "$TMP/ngx"
  cat >"$TMP/ngx/nginx.conf" <<NGX
# generated by bench/callgrind.sh (as bench/http1.sh's nginx-lua, in one process)
$([[ $(id -u) == 0 ]] && echo "user root;")
worker_processes 1;
daemon off;
master_process off;
pid $TMP/ngx/nginx.pid;
load_module $NGX_MODDIR/ndk_http_module.so;
load_module $NGX_MODDIR/ngx_http_lua_module.so;
error_log $TMP/ngx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $TMP/ngx/client_body;
  proxy_temp_path $TMP/ngx/proxy;
  fastcgi_temp_path $TMP/ngx/fastcgi;
  uwsgi_temp_path $TMP/ngx/uwsgi;
  scgi_temp_path $TMP/ngx/scgi;
  server {
    listen 127.0.0.1:$PORT;
    location / { $NGX_LUA }
  }
}
NGX
  SERVER_CMD=(nginx -p "$TMP/ngx/" -c "$TMP/ngx/nginx.conf" -e "$TMP/ngx/error.log")
elif [[ $SERVER == khamsin ]]; then
  # shellcheck disable=SC2206 # KHAMSIN_ARGS: more options, split on spaces
  SERVER_CMD=("$BIN" --workers 1 --pool-threads 1 --listen "127.0.0.1:$PORT" --log-level warn $KHAMSIN_ARGS "$APP")
else
  echo "SERVER is khamsin or nginx-lua" >&2; exit 1
fi

run() { # out_file load_seconds -> prints requests served
  local out=$1 secs=$2 pid i n=0 c
  valgrind "${VG_ARGS[@]}" --callgrind-out-file="$out" "${SERVER_CMD[@]}" >"$TMP/log" 2>&1 &
  pid=$!
  for ((i = 0; i < 600; i++)); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.1; done
  local probe=1
  if ((WARMUP_SECONDS > 0)); then # the same load, then the counters zeroed: steady state only
    if [[ $PROTO == h2 ]]; then
      h2load -c"${CONNS:-4}" -m10 -D "$WARMUP_SECONDS" ${HDR_ARGS[@]+"${HDR_ARGS[@]}"} "http://127.0.0.1:$PORT/" >/dev/null
    else
      wrk -t1 -c"${CONNS:-4}" -d"${WARMUP_SECONDS}s" ${HDR_ARGS[@]+"${HDR_ARGS[@]}"} "http://127.0.0.1:$PORT/" >/dev/null
    fi
    callgrind_control -z "$pid" >/dev/null
    probe=0
  fi
  if ((secs > 0)) && [[ $PROTO == h2 ]]; then
    local how=(-D "$secs")
    [[ -n $REQUESTS ]] && how=(-n "$REQUESTS")
    n=$(h2load -c"${CONNS:-4}" -m10 "${how[@]}" ${HDR_ARGS[@]+"${HDR_ARGS[@]}"} "http://127.0.0.1:$PORT/" | awk '/^requests:/ {print $8}')
  elif ((secs > 0)) && [[ -n $REQUESTS ]]; then
    # keep-alive h1, a fixed count: every connection sends REQUESTS/CONNS requests, one at a time
    c=${CONNS:-4}
    n=$(h2load --h1 -c"$c" -n "$REQUESTS" ${HDR_ARGS[@]+"${HDR_ARGS[@]}"} "http://127.0.0.1:$PORT/" | awk '/^requests:/ {print $8}')
  elif ((secs > 0)); then
    n=$(wrk -t1 -c"${CONNS:-4}" -d"${secs}s" ${HDR_ARGS[@]+"${HDR_ARGS[@]}"} "http://127.0.0.1:$PORT/" | awk '/requests in/ {print $1}')
  fi
  kill -TERM "$pid"; wait "$pid" || true
  echo $((n + probe)) # + the readiness probe, unless the counters were zeroed after it
}

if [[ ${FOOTPRINT:-0} == 1 ]]; then # lackey's trace through a FIFO, counted only around the load
  [[ -n $REQUESTS ]] || { echo "FOOTPRINT=1 needs REQUESTS" >&2; exit 1; }
  mkfifo "$TMP/trace"
  /usr/bin/python3 bench/lib/footprint.py "$TMP/trace" "$TMP/fp.json" &
  fpid=$!
  valgrind --tool=lackey --trace-mem=yes --trace-syscalls=yes --log-file="$TMP/trace" "${SERVER_CMD[@]}" >"$TMP/log" 2>&1 &
  pid=$!
  for ((i = 0; i < 1200; i++)); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.1; done
  curl -s -o /dev/null "http://127.0.0.1:$PORT/"
  sleep 1
  kill -USR1 "$fpid"
  n=$(h2load --h1 -c"${CONNS:-4}" -n "$REQUESTS" ${HDR_ARGS[@]+"${HDR_ARGS[@]}"} "http://127.0.0.1:$PORT/" | awk '/^requests:/ {print $8}')
  sleep 1
  kill -USR2 "$fpid"
  kill -TERM "$pid"; wait "$pid" || true
  wait "$fpid"
  echo "server:   $SERVER: ${SERVER_CMD[*]}"
  [[ $SERVER == khamsin ]] && echo "binary:   $BIN ($(git rev-parse --short HEAD))${KHAMSIN_ARGS:+ $KHAMSIN_ARGS}"
  echo "command:  FOOTPRINT=1 SERVER=$SERVER REQUESTS=$REQUESTS CONNS=$CONNS APP=$APP${HEADERS:+ HEADERS='$HEADERS'} bench/callgrind.sh"
  /usr/bin/python3 - "$TMP/fp.json" "$n" <<'PY'
import json, sys
t = json.load(open(sys.argv[1])); n = int(sys.argv[2])
print(f"requests: {n}; user segments between syscalls: {t['segments'] / n:.2f} a request")
print(f"per request: instructions {t['instr'] / n:.0f}, data accesses {t['daccess'] / n:.0f}")
print(f"per request, summed over segments (each starts with an empty TLB under PTI without PCID):")
print(f"  distinct 4 KiB pages: code {t['ipages'] / n:.1f}, data {t['dpages'] / n:.1f}, total {(t['ipages'] + t['dpages']) / n:.1f}")
print(f"  distinct 64 B lines:  code {t['ilines'] / n:.1f}, data {t['dlines'] / n:.1f}, total {(t['ilines'] + t['dlines']) / n:.1f}")
print("  by the syscall that ends the segment (segments, code pages, data pages per request):")
for k, v in sorted(t["by_syscall"].items(), key=lambda kv: -kv[1]["ipages"] - kv[1]["dpages"]):
    print(f"    {k:<22} {v['segments'] / n:6.2f} {v['ipages'] / n:7.1f} {v['dpages'] / n:7.1f}")
print("  vDSO calls (clock reads; natively no kernel entry) per request: "
      + (", ".join(f"{k[4:]} {v / n:.2f}" for k, v in sorted(t["vdso"].items())) or "none"))
PY
  exit 0
fi

total_ir() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'; }

base_req=$(run "$TMP/base.out" 0)
load_req=$(run "$TMP/load.out" "$SECONDS_LOAD")
base=$(total_ir "$TMP/base.out")
load=$(total_ir "$TMP/load.out")
if [[ -n $KEEP ]]; then mkdir -p "$KEEP" && cp "$TMP/base.out" "$TMP/load.out" "$KEEP/"; fi
echo "server:   $SERVER: ${SERVER_CMD[*]}"
[[ $SERVER == khamsin ]] && echo "binary:   $BIN ($(git rev-parse --short HEAD))${KHAMSIN_ARGS:+ $KHAMSIN_ARGS}"
echo "command:  SERVER=$SERVER PROTO=$PROTO REQUESTS=$REQUESTS CONNS=$CONNS SECONDS_LOAD=$SECONDS_LOAD WARMUP_SECONDS=$WARMUP_SECONDS APP=$APP${HEADERS:+ HEADERS='$HEADERS'} bench/callgrind.sh"
echo "start+stop only: $base Ir ($base_req request)$( ((WARMUP_SECONDS > 0)) && echo ', counted from the zeroing: the stop')"
echo "with load:       $load Ir ($load_req requests)"
echo "instructions per request: $(( (load - base) / (load_req - base_req) ))"
if ((CACHE == 1)); then # every event of the totals line, per request (D1mr+D1mw = D1 misses, DLmr+DLmw = LL)
  events=$(awk '/^events:/ {$1 = ""; print; exit}' "$TMP/load.out")
  paste <(tr ' ' '\n' <<<"$events" | sed '/^$/d') \
    <(awk '/^(summary|totals):/ {for (i = 2; i <= NF; i++) print $i; exit}' "$TMP/base.out") \
    <(awk '/^(summary|totals):/ {for (i = 2; i <= NF; i++) print $i; exit}' "$TMP/load.out") |
    awk -v n=$((load_req - base_req)) '{printf "  %-5s per request: %.2f\n", $1, ($3 - $2) / n}'
  echo
  echo "top functions of the loaded run by D1 misses (D1mr + D1mw; columns: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw):"
  callgrind_annotate --sort=D1mr,D1mw "$TMP/load.out" 2>/dev/null | sed -n '/file:function/,$p' | sed -n 2,${TOP:-16}p
  echo
fi
echo
echo "top functions of the loaded run:"
callgrind_annotate --inclusive=$([[ $INCLUSIVE == 1 ]] && echo yes || echo no) "$TMP/load.out" 2>/dev/null |
  sed -n '/file:function/,$p' | sed -n 2,${TOP:-16}p
