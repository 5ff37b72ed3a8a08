#!/usr/bin/env bash
# bench/static.sh - k.static against nginx's static serving (sendfile on, tcp_nopush on), a 4 KB
# and a 1 MB file, HTTP/1.1 keep-alive, in ONE run: servers alternate (the first one flips each
# round), each pinned to SERVER_CORE, wrk pinned to WRK_CORE. Figures: requests per second of
# server CPU (utime+stime of the server's process tree from /proc), median and min-max over the
# rounds, and khamsin/nginx ratios. The box may be loaded by other work: compare the ratios,
# measured in the same run, rather than absolute figures.
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

: >"$TMP/raw"
one() { # name pid port file
  local name=$1 pid=$2 port=$3 file=$4 c0 c1 out reqs
  taskset -c "$WRK_CORE" wrk -t1 --timeout 30s -c "$CONNS" -d 1 "http://127.0.0.1:$port/$file" >/dev/null
  c0=$(cpu "$pid")
  out=$(taskset -c "$WRK_CORE" wrk -t1 --timeout 30s -c "$CONNS" -d "$DURATION" "http://127.0.0.1:$port/$file")
  c1=$(cpu "$pid")
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  echo "$name $file $reqs $((c1 - c0)) $HZ $DURATION" >>"$TMP/raw"
  echo "  $name $file: $reqs requests, $((c1 - c0)) ticks of server CPU"
}
for r in $(seq "$ROUNDS"); do
  echo "round $r"
  for f in 4k.bin 1m.bin; do
    if ((r % 2)); then
      one khamsin "$KPID" "$KPORT" "$f"; one nginx "$NPID" "$NPORT" "$f"
    else
      one nginx "$NPID" "$NPORT" "$f"; one khamsin "$KPID" "$KPORT" "$f"
    fi
  done
done

{
  echo "# bench/static.sh, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "# command: $CMDLINE (ROUNDS=$ROUNDS DURATION=$DURATION CONNS=$CONNS STATIC_OPTS=$STATIC_OPTS KHAMSIN_BIN=$KHAMSIN_BIN)"
  echo "# servers pinned to core $SERVER_CORE, wrk to core $WRK_CORE, alternating; 1 worker each;"
  echo "# nginx: sendfile on, tcp_nopush on. khamsin: k.static('/', dir, $STATIC_OPTS): with the default"
  echo "# per-worker cache (realpath+stat revalidated each 1 s; files <= 64 KiB kept in memory) 4k.bin"
  echo "# is answered from memory; with {cache=false} each request does realpath, stat, open+read+close"
  echo "# on libuv's pool. 1m.bin is opened on the pool and sent with sendfile(2) from the loop (head"
  echo "# first with MSG_MORE); over TLS/h2 it would be 64 KiB preads on the pool instead."
  echo "# The box was shared with other helpers' builds and tests (load average at the end: $(cut -d" " -f1-3 /proc/loadavg)"
  echo "# on 2 cores): absolute figures are low and noisy; the ratios come from the same run."
  echo "# $(uname -srm); $(nginx -v 2>&1)"
  $PY - "$TMP/raw" <<'PYEOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
res = {}
for name, f, reqs, ticks, hz, dur in rows:
    cpu = int(ticks) / int(hz)
    res.setdefault((name, f), []).append((int(reqs) / cpu if cpu else float("nan"), int(reqs) / float(dur)))
print("%-8s %-7s %14s %24s %12s" % ("server", "file", "req/CPU-s med", "min-max", "req/s med"))
med = {}
for (name, f), v in sorted(res.items()):
    per = sorted(x[0] for x in v); rps = sorted(x[1] for x in v)
    med[(name, f)] = statistics.median(per)
    print("%-8s %-7s %14.0f %11.0f-%-12.0f %12.0f" % (name, f, med[(name, f)], per[0], per[-1], statistics.median(rps)))
for f in ("4k.bin", "1m.bin"):
    if ("khamsin", f) in med and ("nginx", f) in med:
        print("ratio khamsin/nginx %s (per server CPU-second, medians): %.2fx" % (f, med[("khamsin", f)] / med[("nginx", f)]))
PYEOF
} | tee "$RESULT"
echo "written: $RESULT"
