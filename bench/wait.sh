#!/usr/bin/env bash
# bench/wait.sh - the cost of waiting in khamsin (issue 4): the server's CPU per request for a
# plain reply, one k.sleep(0), one k.blocking round trip and a deferred reply answered by a
# timer; then 500 clients on a handler that blocks 100 ms in the pool (req/s vs the ideal
# M x 10 req/s, errors, 503s, and the p99 of /health on the same worker meanwhile); then the
# same 100 ms pool handler on nginx + lua-nginx-module's ngx.run_worker_thread, if it runs.
# Approach of bench/http1.sh: server pinned to SERVER_CORE, load to WRK_CORE, server CPU from
# /proc/PID/stat (utime+stime of all its threads, pool threads included) over each wrk window;
# rounds on the noisy-box method of bench/lib/common.sh (disturbed rounds discarded and redone).
#
#   bench/wait.sh                      # ~3 min; result in bench/results/wait-<stamp>.txt
#   DURATION=2 ROUNDS=1 bench/wait.sh  # quicker
# Env: DURATION=5 ROUNDS=5 CONNS=256 KHAMSIN_BIN=build-release/khamsin SERVER_CORE=1 WRK_CORE=0
#      CLIENTS=500 SLOW_SECONDS=6 POOLS="2 8" PORT=24080 NGINX=1 WAIT_PATHS (the windows of part 1)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=/usr/bin/python3
. bench/lib/common.sh
LIB=bench/lib/waitbench.py
DURATION=${DURATION:-5}
CONNS=${CONNS:-256}
CLIENTS=${CLIENTS:-500}
SLOW_SECONDS=${SLOW_SECONDS:-6}
POOLS=${POOLS:-"2 8"}
PORT=${PORT:-24080}
NGINX=${NGINX:-1}
bench_knobs
bench_paths wait
OUT=$RESULT
bench_pids_trap

# the default binary is always brought up to date (a no-op when it is): no figure from a stale build
if [[ $KHAMSIN_BIN == "$KHAMSIN_BIN_DEFAULT" || ! -x $KHAMSIN_BIN ]]; then bench_build_release khamsin; fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

exec > >(tee "$OUT") 2>&1
echo "# bench/wait.sh $STAMP"
echo "# command: ${BASH_SOURCE[0]} (DURATION=$DURATION ROUNDS=$ROUNDS CONNS=$CONNS CLIENTS=$CLIENTS SLOW_SECONDS=$SLOW_SECONDS POOLS=\"$POOLS\" SERVER_CORE=$SERVER_CORE WRK_CORE=$WRK_CORE)"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (the machine is shared: other runs add noise)"
bench_method_line
echo "# machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -r)"
echo "# khamsin: $KHAMSIN_BIN ($(git rev-parse --short HEAD 2>/dev/null)), $(wrk --version 2>&1 | head -1 | cut -c1-40)"

start_khamsin() { # pool_threads pool_queue -> SPID
  LUA_PATH="$ROOT/bench/apps/?.lua;;" taskset -c "$SERVER_CORE" "$KHAMSIN_BIN" --workers 1 \
    --listen "127.0.0.1:$PORT" --log-level warn --pool-threads "$1" --pool-queue "$2" \
    --slice-warn-ms 0 bench/apps/wait.lua >>"$TMP/khamsin.log" 2>&1 &
  SPID=$!
  PIDS+=("$SPID")
  $PY $LIB ready "$PORT" / 10 || { cat "$TMP/khamsin.log"; exit 1; }
}
stop() { kill -TERM "$1"; wait "$1" 2>/dev/null || true; }

echo
echo "## 1. server CPU per request (1 worker, 1 pool thread, all on core $SERVER_CORE; wrk -c$CONNS, ${DURATION}s windows)"
start_khamsin 1 1024
printf '%-22s %6s %10s %14s %10s %8s %7s\n' path round req/s cpu_us/req cpu_share non2xx errors
declare -A CPU
# WAIT_PATHS narrows the windows (all.sh leaves out /sleep0?n=1: no summary row uses it); /, /sleep0?n=100,
# /pool and /defer are needed for the rows
read -r -a PATHS <<<"${WAIT_PATHS:-/ /sleep0?n=1 /sleep0?n=100 /pool /defer}"
REVERSED=()
for ((i = ${#PATHS[@]} - 1; i >= 0; i--)); do REVERSED+=("${PATHS[$i]}"); done
for path in "${PATHS[@]}"; do
  $PY $LIB window "$SPID" "$PORT" "$path" "$CONNS" 1 "$WRK_CORE" >/dev/null # warm-up (JIT)
done
bench_rounds_init "$TMP"
while bench_round_next; do # rounds interleave the paths (order flipped each round): noise hits them alike
  r=$BENCH_ROUND
  order=("${PATHS[@]}"); ((r % 2)) || order=("${REVERSED[@]}")
  declare -A THIS=()
  for path in "${order[@]}"; do
    read -r rps cpu share non2xx errs < <($PY $LIB window "$SPID" "$PORT" "$path" "$CONNS" "$DURATION" "$WRK_CORE")
    THIS[$path]=$cpu
    printf '%-22s %6s %10s %14s %10s %8s %7s\n' "$path" "$r" "$rps" "$cpu" "$share" "$non2xx" "$errs"
  done
  # per round: the CPU above the plain reply of the same round (what one wait costs)
  awk -v r="$r" -v base="${THIS[/]}" -v s100="${THIS[/sleep0?n=100]}" -v pool="${THIS[/pool]}" -v defer="${THIS[/defer]}" 'BEGIN {
    printf "{\"round\": %d, \"server\": \"khamsin\", \"case\": \"plain reply\", \"cpu_us\": %.3f}\n", r, base
    printf "{\"round\": %d, \"server\": \"khamsin\", \"case\": \"one k.sleep(0) (above plain)\", \"cpu_us\": %.3f}\n", r, (s100 - base) / 100
    printf "{\"round\": %d, \"server\": \"khamsin\", \"case\": \"one k.blocking (above plain)\", \"cpu_us\": %.3f}\n", r, pool - base
    printf "{\"round\": %d, \"server\": \"khamsin\", \"case\": \"deferred reply by timer (above plain)\", \"cpu_us\": %.3f}\n", r, defer - base
  }' >>"$TMP/cpu.jsonl"
  bench_round_end || true
done
stop "$SPID"
echo "(k.sleep(0) is (n=100 - plain) / 100; k.blocking: submit, pool thread wake + run, mailbox, resume;"
echo " deferred: res:defer + k.timer(0) + d:send. khamsin only: no anchor has these paths.)"
bench_summary "$TMP/cpu.jsonl" --metric cpu_us --lower cpu_us --group case --label "server CPU us per request / per wait"

echo
echo "## 2. $CLIENTS clients on a handler that blocks 100 ms in the pool (k.blocking), ${SLOW_SECONDS}s;"
echo "##    /health probed every 10 ms on the same (only) worker; clients honour Retry-After (+-50% jitter);"
echo "##    and nginx + lua-nginx-module ngx.run_worker_thread on the same handler, alternated within each round"
ngx_slow() { # m q round: nginx + lua-nginx-module ngx.run_worker_thread, same 100 ms pool handler
  local m=$1 q=$2 user=""
  mkdir -p "$TMP/ngx"
  [[ $(id -u) == 0 ]] && user="user root;"
    cat >"$TMP/ngx/nginx.conf" <<NGX
$user
worker_processes 1;
daemon off;
pid $TMP/ngx/nginx.pid;
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
error_log $TMP/ngx/error.log warn;
thread_pool luapool threads=$m max_queue=$q;
worker_rlimit_nofile 65536;
events { worker_connections 4096; }
http {
  access_log off;
  lua_package_path "$ROOT/bench/apps/?.lua;;";
  client_body_temp_path $TMP/ngx/cb; proxy_temp_path $TMP/ngx/px; fastcgi_temp_path $TMP/ngx/fc;
  uwsgi_temp_path $TMP/ngx/uw; scgi_temp_path $TMP/ngx/sc;
  server {
    listen 127.0.0.1:$PORT;
    location = / { content_by_lua_block { ngx.print("Hello, World!") } }
    location = /health { content_by_lua_block { ngx.header["Content-Length"] = 2 ngx.print("ok") } }
    location = /slow { content_by_lua_block {
      local ok, res = ngx.run_worker_thread("luapool", "waitbench_pool", "sleep_ms", 100)
      -- explicit Content-Length: load.py reads Content-Length bodies only
      if not ok then
        res = tostring(res) ngx.status = 503 ngx.header["Retry-After"] = "1"
        ngx.header["Content-Length"] = #res ngx.print(res) return
      end
      ngx.header["Content-Length"] = #res
      ngx.print(res)
    } }
  }
}
NGX
    taskset -c "$SERVER_CORE" nginx -p "$TMP/ngx/" -c "$TMP/ngx/nginx.conf" -e "$TMP/ngx/error.log" >>"$TMP/ngx.out" 2>&1 &
    NPID=$!
    PIDS+=("$NPID")
    if ! $PY $LIB ready "$PORT" / 10; then echo "nginx did not start:"; tail -5 "$TMP/ngx/error.log" "$TMP/ngx.out"; return; fi
    if ! curl -s -m 3 "http://127.0.0.1:$PORT/slow" | grep -q done; then
      echo "ngx.run_worker_thread does not work here:"; curl -s -m 3 "http://127.0.0.1:$PORT/slow"; tail -5 "$TMP/ngx/error.log"
      stop "$NPID"; return
    fi
    res=$(taskset -c "$WRK_CORE" $PY spec/helpers/load.py 127.0.0.1 "$PORT" /slow "$CLIENTS" "$SLOW_SECONDS" /health 10)
    stop "$NPID"
    $PY "$TMP/slow.py" nginx-lua "$m" "$res" "$q" "$3" "$TMP/slow.jsonl"
    grep -E "\[(error|alert|crit)\]" "$TMP/ngx/error.log" | grep -v setrlimit | sed -E 's/^[0-9/: ]+//; s/[0-9]+#[0-9]+: //' | sort | uniq -c | head -3 || true
    : >"$TMP/ngx/error.log"
}
cat >"$TMP/slow.py" <<'PYEOF'
import json, sys
who, m, r, q, rnd = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], int(sys.argv[5])
st, p = r["status"], r["probe"]
other = sum(v for k, v in st.items() if k not in ("200", "503"))
print(f"  {who} threads={m} queue={q}: 200/s steady {r['rps_steady']} (ideal {m * 10}, {100 * r['rps_steady'] / (m * 10):.0f}%; "
      f"{r['rps']} over the whole run with ramp-up and drain), "
      f"200s {st.get('200', 0)}, 503s {st.get('503', 0)}, other {other}, "
      f"client errors {r['errors']}, over {r['seconds']} s; /health n={p['n']} p50 {p.get('p50_ms')} ms "
      f"p99 {p.get('p99_ms')} ms max {p.get('max_ms')} ms errors {p['errors']}")
row = {"round": rnd, "server": who, "pool": f"threads={m} queue={q}", "steady_share": r["rps_steady"] / (m * 10),
       "health_p99_ms": p.get("p99_ms")}
with open(sys.argv[6], "a") as f:
    f.write(json.dumps(row) + "\n")
PYEOF
kh_slow() { # m round
  start_khamsin "$1" 8
  res=$(taskset -c "$WRK_CORE" $PY spec/helpers/load.py 127.0.0.1 "$PORT" /slow "$CLIENTS" "$SLOW_SECONDS" /health 10)
  stop "$SPID"
  $PY "$TMP/slow.py" khamsin "$1" "$res" $((8 * $1)) "$2" "$TMP/slow.jsonl"
}
NGX_OK=0
[[ $NGINX == 1 ]] && [[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ]] && NGX_OK=1
bench_rounds_init "$TMP"
while bench_round_next; do
  r=$BENCH_ROUND
  for m in $POOLS; do
    if ((r % 2 || ! NGX_OK)); then kh_slow "$m" "$r"; ((NGX_OK)) && ngx_slow "$m" $((8 * m)) "$r"
    else ngx_slow "$m" $((8 * m)) "$r"; kh_slow "$m" "$r"; fi
  done
  bench_round_end || true
done
bench_summary "$TMP/slow.jsonl" --metric steady_share --metric health_p99_ms --lower health_p99_ms --group pool \
  --anchor nginx-lua --label "100 ms pool handler, $CLIENTS clients: steady 200/s share of ideal; /health p99"
if ((NGX_OK)); then
  echo "## 3b. nginx with an unbounded queue (max_queue=65536), once per pool size (no khamsin equivalent: khamsin's queue is bounded by design)"
  for m in $POOLS; do ngx_slow "$m" 65536 0; done
fi
echo
echo "# done: $OUT"
