#!/usr/bin/env bash
# bench/static.sh - k.static against nginx's static serving (sendfile on, tcp_nopush on), a 4 KB
# and a 1 MB file, HTTP/1.1 keep-alive, in ONE run: servers alternate (the first one flips each
# round), each pinned to SERVER_CORE, wrk pinned to WRK_CORE. Figures: requests per second of
# server CPU (utime+stime of the server's process tree from /proc), req/s and p99, on the
# noisy-box method of bench/lib/common.sh (ROUNDS kept rounds, disturbed rounds discarded and
# redone, medians [min..max], per-round ratios khamsin/nginx-static with a bootstrap CI95).
#
#   bench/static.sh                        # ROUNDS=5 DURATION=5 CONNS=32
#   ROUNDS=1 DURATION=2 bench/static.sh    # quick smoke run
#   STATIC_OPTS='{cache=false}' bench/static.sh   # k.static's third argument (default nil)
#
# Env knobs: KHAMSIN_BIN=build-release/khamsin SERVER_CORE=1 WRK_CORE=0 BASE_PORT=23180
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=/usr/bin/python3
NGX_MODDIR=${NGX_MODDIR:-/usr/lib/nginx/modules}
. bench/lib/common.sh
CMDLINE="$0${*:+ $*}"
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
CONNS=${CONNS:-32}
KHAMSIN_BIN=${KHAMSIN_BIN:-$ROOT/build-release/khamsin}
SERVER_CORE=${SERVER_CORE:-1}
WRK_CORE=${WRK_CORE:-0}
BASE_PORT=${BASE_PORT:-23180}
KPORT=$BASE_PORT
NPORT=$((BASE_PORT + 1))
STAMP=$(date +%Y%m%d-%H%M%S)
RESULT=bench/results/static-$STAMP.txt
TMP=$(mktemp -d /tmp/khstatic.XXXXXX)
KPID=
NPID=
cleanup() {
  [[ -n $KPID ]] && kill_tree "$KPID"
  [[ -n $NPID ]] && kill_tree "$NPID"
  rm -rf "$TMP"
}
trap cleanup EXIT

mkdir -p "$TMP/www"
head -c 4096 /dev/urandom >"$TMP/www/4k.bin"
head -c 1048576 /dev/urandom >"$TMP/www/1m.bin"
STATIC_OPTS=${STATIC_OPTS:-nil} # e.g. STATIC_OPTS='{cache=false}': k.static without its cache
printf 'local k = require "khamsin"\nk.static("/", "%s", %s)\n' "$TMP/www" "$STATIC_OPTS" >"$TMP/app.lua"
nginx_conf "$TMP/ngx" bench/static.sh 4096 4096 0 "    listen 127.0.0.1:$NPORT;
    location / { root $TMP/www; sendfile on; tcp_nopush on; }"

taskset -c "$SERVER_CORE" "$KHAMSIN_BIN" --workers 1 --log-level warn --listen "127.0.0.1:$KPORT" "$TMP/app.lua" 2>"$TMP/k.err" &
KPID=$!
taskset -c "$SERVER_CORE" nginx -p "$TMP/ngx" -c "$TMP/ngx/nginx.conf" -e "$TMP/ngx/error.log" 2>"$TMP/n.err" &
NPID=$!
for port in $KPORT $NPORT; do
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/4k.bin" && break; sleep 0.1; done
done
for f in 4k.bin 1m.bin; do # both serve the same bytes
  curl -s -o "$TMP/got" "http://127.0.0.1:$KPORT/$f" && cmp "$TMP/got" "$TMP/www/$f"
  curl -s -o "$TMP/got" "http://127.0.0.1:$NPORT/$f" && cmp "$TMP/got" "$TMP/www/$f"
done

# cpu PID: clock ticks (utime+stime) of PID and its children
cpu() {
  local t=0 p
  for p in $($PY bench/lib/benchlib.py tree "$1" 2>/dev/null || echo "$1"); do
    [[ -r /proc/$p/stat ]] && t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat)))
  done
  echo $t
}
HZ=$(getconf CLK_TCK)

: >"$TMP/rows.jsonl"
one() { # name pid port file
  local name=$1 pid=$2 port=$3 file=$4 c0 c1 out reqs p99
  taskset -c "$WRK_CORE" wrk -t1 --timeout 30s -c "$CONNS" -d 1 "http://127.0.0.1:$port/$file" >/dev/null
  c0=$(cpu "$pid")
  out=$(taskset -c "$WRK_CORE" wrk -t1 --latency --timeout 30s -c "$CONNS" -d "$DURATION" "http://127.0.0.1:$port/$file")
  c1=$(cpu "$pid")
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  p99=$(echo "$out" | awk '$1 == "99%" {v = $2; if (v ~ /us$/) {sub(/us$/, "", v); v /= 1000} else if (v ~ /ms$/) sub(/ms$/, "", v); else if (v ~ /s$/) {sub(/s$/, "", v); v *= 1000}; print v}')
  $PY - "$BENCH_ROUND" "$name" "$file" "$reqs" "$((c1 - c0))" "$HZ" "$DURATION" "${p99:-null}" >>"$TMP/rows.jsonl" <<'PYEOF'
import json, sys
r, name, f, reqs, ticks, hz, dur, p99 = sys.argv[1:]
cpu = int(ticks) / int(hz)
print(json.dumps({"round": int(r), "server": name, "file": f, "req_per_cpu": int(reqs) / cpu if cpu else None,
                  "rps": int(reqs) / float(dur), "p99_ms": None if p99 == "null" or int(reqs) == 0 else float(p99)}))
PYEOF
  echo "  $name $file: $reqs requests, $((c1 - c0)) ticks of server CPU, p99 ${p99:-?} ms"
}

{
  echo "# bench/static.sh, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "command:  $CMDLINE (ROUNDS=$ROUNDS DURATION=$DURATION CONNS=$CONNS STATIC_OPTS=$STATIC_OPTS KHAMSIN_BIN=$KHAMSIN_BIN)"
  echo "git:      $(git rev-parse --short HEAD) ($(git status --porcelain -- core lua | wc -l) uncommitted change(s) under core/ lua/)"
  bench_method_line
  echo "# servers pinned to core $SERVER_CORE, wrk to core $WRK_CORE, alternating (A B, then B A); 1 worker each;"
  echo "# nginx: sendfile on, tcp_nopush on. khamsin: k.static('/', dir, $STATIC_OPTS): with the default"
  echo "# per-worker cache (realpath+stat revalidated each 1 s; files <= 64 KiB kept in memory) 4k.bin"
  echo "# is answered from memory; with {cache=false} each request does realpath, stat, open+read+close"
  echo "# on libuv's pool. 1m.bin is opened on the pool and sent with sendfile(2) from the loop (head"
  echo "# first with MSG_MORE); over TLS/h2 it would be 64 KiB preads on the pool instead."
  echo "# $(uname -srm); $(nginx -v 2>&1)"
  bench_rounds_init "$TMP"
  while bench_round_next; do
    r=$BENCH_ROUND
    echo "round $r"
    for f in 4k.bin 1m.bin; do
      if ((r % 2)); then
        one khamsin "$KPID" "$KPORT" "$f"; one nginx-static "$NPID" "$NPORT" "$f"
      else
        one nginx-static "$NPID" "$NPORT" "$f"; one khamsin "$KPID" "$KPORT" "$f"
      fi
    done
    bench_round_end || true
  done
  bench_summary "$TMP/rows.jsonl" --metric req_per_cpu --metric rps --metric p99_ms --lower p99_ms --group file \
    --anchor nginx-static --label "static files, keep-alive (wrk -c$CONNS), vs nginx sendfile"
  echo "## Appendix: rows"; cat "$TMP/rows.jsonl"
} 2>&1 | tee "$RESULT"
echo "written: $RESULT"
