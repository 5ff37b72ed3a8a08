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
#   CALLGRIND=1 bench/static.sh            # PARTS="ir sys": load-independent counts per MiB sent
#
# Parts (PARTS, default "load"; CALLGRIND=1 means PARTS="ir sys"):
#   load  the rounds above (wrk windows, one 1 s warm-up per server and file before the rounds)
#   ir    user-space instructions per MiB sent (valgrind callgrind, each server alone, nginx with
#         master_process off): a run that starts, answers one GET and stops, and one that also
#         serves IR_SECONDS of wrk -c4 on IR_FILES; (Ir of the second - Ir of the first) / MiB sent
#   sys   syscalls per MiB sent (strace -c -f on the server's processes over a SYS_SECONDS wrk
#         -c$CONNS window on SYS_FILES), and which ones (sendfile, writev, read, epoll_wait ...)
# Env knobs: KHAMSIN_BIN=build-release/khamsin SERVER_CORE=1 WRK_CORE=0 BASE_PORT=23180
#   IR_FILES="1m.bin 4k.bin" IR_SECONDS=4 SYS_FILES="1m.bin 4k.bin" SYS_SECONDS=2
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=/usr/bin/python3
NGX_MODDIR=${NGX_MODDIR:-/usr/lib/nginx/modules}
. bench/lib/common.sh
CMDLINE="$0${*:+ $*}"
ROUNDS=${ROUNDS:-5}
PARTS=${PARTS:-load}
[[ ${CALLGRIND:-0} == 1 ]] && PARTS="ir sys"
IR_FILES=${IR_FILES:-"1m.bin 4k.bin"}
IR_SECONDS=${IR_SECONDS:-4}
SYS_FILES=${SYS_FILES:-"1m.bin 4k.bin"}
SYS_SECONDS=${SYS_SECONDS:-2}
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

# the callgrind runs: one process (the worker), no daemon
sed 's/^master_process on;/master_process off;/' "$TMP/ngx/nginx.conf" >"$TMP/ngx/nginx-single.conf"

# start_k / start_n [WRAPPER...]: the server pinned to SERVER_CORE (under WRAPPER, e.g. valgrind),
# pid in KPID / NPID, once it answers GET /4k.bin (up to 60 s: valgrind starts slowly)
wait_get() { for _ in $(seq 600); do curl -s -o /dev/null "http://127.0.0.1:$1/4k.bin" && return 0; sleep 0.1; done; return 1; }
start_k() {
  taskset -c "$SERVER_CORE" "$@" "$KHAMSIN_BIN" --workers 1 --log-level warn --listen "127.0.0.1:$KPORT" "$TMP/app.lua" 2>>"$TMP/k.err" &
  KPID=$!
  wait_get "$KPORT" || { tail -5 "$TMP/k.err"; exit 1; }
}
start_n() {
  local conf=nginx.conf
  (($#)) && conf=nginx-single.conf
  taskset -c "$SERVER_CORE" "$@" nginx -p "$TMP/ngx" -c "$TMP/ngx/$conf" -e "$TMP/ngx/error.log" 2>>"$TMP/n.err" &
  NPID=$!
  wait_get "$NPORT" || { tail -5 "$TMP/n.err" "$TMP/ngx/error.log"; exit 1; }
}
has() { [[ " $PARTS " == *" $1 "* ]]; }

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

# ir_part: user-space instructions per MiB sent, per server and file (see the header)
cg_total() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'; }
cg_run() { # server(k|n) out seconds file -> requests answered (the readiness GETs included)
  local srv=$1 out=$2 secs=$3 file=$4 n=0 port pid
  "start_$srv" valgrind --tool=callgrind --callgrind-out-file="$out" >/dev/null
  if [[ $srv == k ]]; then port=$KPORT pid=$KPID; else port=$NPORT pid=$NPID; fi
  if ((secs > 0)); then
    n=$(taskset -c "$WRK_CORE" wrk -t1 -c4 --timeout 30s -d"${secs}s" "http://127.0.0.1:$port/$file" | awk '/requests in/ {print $1}')
  fi
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  KPID= NPID=
  echo "$n"
}
ir_part() {
  command -v valgrind >/dev/null || { echo "PARTS=ir needs valgrind"; exit 1; }
  echo "## user-space instructions per MiB sent (callgrind; one worker, nginx with master_process off;"
  echo "## (Ir of a run with ${IR_SECONDS}s of wrk -c4 - Ir of a run that only starts and answers GET /4k.bin) / MiB)"
  local f srv name base load n size
  for f in $IR_FILES; do
    size=$(stat -c %s "$TMP/www/$f")
    for srv in k n; do
      name=khamsin; [[ $srv == n ]] && name=nginx-static
      cg_run "$srv" "$TMP/cg.$srv.base" 0 "$f" >/dev/null
      n=$(cg_run "$srv" "$TMP/cg.$srv.load" "$IR_SECONDS" "$f")
      base=$(cg_total "$TMP/cg.$srv.base"); load=$(cg_total "$TMP/cg.$srv.load")
      awk -v name="$name" -v f="$f" -v n="$n" -v d="$((load - base))" -v sz="$size" 'BEGIN {
        if (n == 0) { printf "  %-13s %-7s no request served under callgrind\n", name, f; exit }
        mib = n * sz / 1048576
        printf "  %-13s %-7s %9.0f instructions per MiB sent, %8.0f per request (%d requests, %.1f MiB)\n", name, f, d / mib, d / n, n, mib }'
    done
  done
}
# sys_part: syscalls per MiB sent, per server and file (strace -c over the server's processes)
sys_part() {
  command -v strace >/dev/null || { echo "PARTS=sys needs strace"; exit 1; }
  echo "## syscalls per MiB sent (strace -c -f on the server's processes over a ${SYS_SECONDS}s wrk -c$CONNS window;"
  echo "## strace slows the server: the counts per MiB are the figure, not the rate)"
  local f srv name pid port n size sp pids
  start_k; start_n
  for f in $SYS_FILES; do
    size=$(stat -c %s "$TMP/www/$f")
    for srv in k n; do
      if [[ $srv == k ]]; then name=khamsin pid=$KPID port=$KPORT; else name=nginx-static pid=$NPID port=$NPORT; fi
      pids=()
      for p in $($PY bench/lib/benchlib.py tree "$pid"); do pids+=(-p "$p"); done
      strace -c -f "${pids[@]}" -o "$TMP/strace.$srv.$f" >/dev/null 2>&1 &
      sp=$!
      sleep 0.5 # attached
      n=$(taskset -c "$WRK_CORE" wrk -t1 -c"$CONNS" --timeout 30s -d"${SYS_SECONDS}s" "http://127.0.0.1:$port/$f" | awk '/requests in/ {print $1}')
      kill -INT "$sp" 2>/dev/null; wait "$sp" 2>/dev/null || true
      $PY - "$TMP/strace.$srv.$f" "$n" "$size" "$name" "$f" <<'PYEOF'
import sys
path, n, size, name, f = sys.argv[1], int(sys.argv[2] or 0), int(sys.argv[3]), sys.argv[4], sys.argv[5]
calls = {}
for line in open(path):
    w = line.split()
    if len(w) >= 5 and w[3].isdigit() and w[-1] != "total" and w[-1].replace("_", "").isalnum():
        calls[w[-1]] = int(w[3])
mib = n * size / 1048576
if not mib:
    print(f"  {name:<13} {f:<7} no request"); sys.exit()
tot = sum(calls.values())
top = " ".join(f"{k} {v / mib:.1f}" for k, v in sorted(calls.items(), key=lambda x: -x[1]))
print(f"  {name:<13} {f:<7} {tot / mib:8.1f} syscalls per MiB sent ({tot / n:.2f} per request; {n} requests): {top}")
PYEOF
    done
  done
  kill_tree "$KPID"; kill_tree "$NPID"; KPID= NPID=
}

{
  trap cleanup EXIT # the servers are started in this subshell (the pipe into tee)
  echo "# bench/static.sh, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "command:  $CMDLINE (PARTS=\"$PARTS\" ROUNDS=$ROUNDS DURATION=$DURATION CONNS=$CONNS STATIC_OPTS=$STATIC_OPTS KHAMSIN_BIN=$KHAMSIN_BIN)"
  echo "git:      $(git rev-parse --short HEAD) ($(git status --porcelain -- core lua | wc -l) uncommitted change(s) under core/ lua/)"
  bench_method_line
  echo "# servers pinned to core $SERVER_CORE, wrk to core $WRK_CORE, alternating (A B, then B A); 1 worker each;"
  echo "# nginx: sendfile on, tcp_nopush on. khamsin: k.static('/', dir, $STATIC_OPTS): with the default"
  echo "# per-worker cache (realpath+stat revalidated each 1 s; files <= 64 KiB kept in memory) 4k.bin"
  echo "# is answered from memory; with {cache=false} each request does realpath, stat, open+read+close"
  echo "# on libuv's pool. 1m.bin is opened on the pool and sent with sendfile(2) from the loop (head"
  echo "# first with MSG_MORE); over TLS/h2 it would be 64 KiB preads on the pool instead."
  echo "# $(uname -srm); $(nginx -v 2>&1)"
  if has load; then
  start_k
  start_n
  for f in 4k.bin 1m.bin; do # both serve the same bytes
    curl -s -o "$TMP/got" "http://127.0.0.1:$KPORT/$f" && cmp "$TMP/got" "$TMP/www/$f"
    curl -s -o "$TMP/got" "http://127.0.0.1:$NPORT/$f" && cmp "$TMP/got" "$TMP/www/$f"
    for port in $KPORT $NPORT; do # warm-up (JIT, caches), once per server and file: the servers stay up
      taskset -c "$WRK_CORE" wrk -t1 --timeout 30s -c "$CONNS" -d 1 "http://127.0.0.1:$port/$f" >/dev/null
    done
  done
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
  kill_tree "$KPID"; kill_tree "$NPID"; KPID= NPID=
  fi
  if has ir; then ir_part; fi
  if has sys; then sys_part; fi
  if has load; then echo "## Appendix: rows"; cat "$TMP/rows.jsonl"; fi
} 2>&1 | tee "$RESULT"
echo "written: $RESULT"
