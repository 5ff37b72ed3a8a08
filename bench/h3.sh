#!/usr/bin/env bash
# bench/h3.sh: server CPU per request of HTTP/3 against khamsin's own HTTP/1.1-over-TLS and
# HTTP/2-over-TLS, in the same run, alternating, several rounds.
# What it measures: one client connection sending N hello-world requests one after another
# (h3: kh-h3get --repeat N; h1 and h2: curl with N URLs on one connection), the server pinned
# to core 1 and the client to core 0; the figure is requests per second of *server* CPU
# (utime + stime from /proc/PID/stat), so the client's own speed does not enter it. It is not a
# throughput test with many connections x streams (our h3 client sends one request at a time):
# see README "HTTP/3" for what is not measured.
# Usage: bench/h3.sh            (N=2000 ROUNDS=3; KHAMSIN_BIN=..., H3GET=...)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000}
ROUNDS=${ROUNDS:-3}
BIN=${KHAMSIN_BIN:-build-release/khamsin}
H3GET=${H3GET:-$(dirname "$BIN")/kh-h3get}
[ -x "$BIN" ] || { echo "no $BIN: cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release && cmake --build build-release --target khamsin kh-h3get" >&2; exit 1; }
mkdir -p bench/results
OUT=bench/results/h3-$(date -u +%Y%m%d-%H%M%S).txt
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat > "$TMP/app.lua" <<'LUA'
local k = require "khamsin"
k.get("/", function() return "Hello, World!" end)
LUA

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run_one() { # proto -> prints requests per server CPU second
    local proto=$1
    taskset -c 1 "$BIN" --listen tls://127.0.0.1:0 --tls-self-signed --http3 --workers 1 \
        "$TMP/app.lua" 2> "$TMP/srv.log" &
    local pid=$!
    local port=""
    for _ in $(seq 1 100); do
        port=$(grep -o '127.0.0.1:[0-9]* (tls)' "$TMP/srv.log" 2>/dev/null | head -1 | sed 's/.*:\([0-9]*\) .*/\1/' || true)
        [ -n "$port" ] && break
        # the log level hides the "listening" line: ask the kernel instead
        port=$(ss -ltnp 2>/dev/null | grep "pid=$pid," | grep -o '127.0.0.1:[0-9]*' | head -1 | cut -d: -f2 || true)
        [ -n "$port" ] && break
        sleep 0.1
    done
    local url="https://127.0.0.1:$port/"
    # warm-up
    taskset -c 0 "$H3GET" --repeat 50 -o /dev/null "$url" >/dev/null 2>&1
    local t0 t1 ok=1
    yes "url = \"$url\"" | head -n "$N" > "$TMP/urls"
    t0=$(cpu_ticks $pid)
    case $proto in
    h3) taskset -c 0 "$H3GET" --repeat "$N" -o /dev/null "$url" >/dev/null || ok=0 ;;
    h1) taskset -c 0 curl -sfk --http1.1 -K "$TMP/urls" -o /dev/null >/dev/null || ok=0 ;;
    h2) taskset -c 0 curl -sfk --http2 -K "$TMP/urls" -o /dev/null >/dev/null || ok=0 ;;
    esac
    t1=$(cpu_ticks $pid)
    if [ $ok = 0 ]; then
        kill $pid; wait $pid 2>/dev/null || true
        echo "FAILED: the $proto client did not complete $N requests" >&2
        echo FAILED
        return
    fi
    kill $pid; wait $pid 2>/dev/null || true
    local hz; hz=$(getconf CLK_TCK)
    awk -v n="$N" -v d="$((t1 - t0))" -v hz="$hz" 'BEGIN { if (d == 0) d = 1; printf "%.0f\n", n / (d / hz) }'
}

{
echo "# bench/h3.sh $(date -u +%FT%TZ)  N=$N ROUNDS=$ROUNDS BIN=$BIN"
echo "# command: N=$N ROUNDS=$ROUNDS bench/h3.sh"
echo "# commit $(git rev-parse --short HEAD) (+$(git status --porcelain core lua | wc -l) uncommitted), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# the box is shared with other helpers' builds and tests: compare ratios of this run only"
echo "# figure: requests per second of server CPU (one connection, sequential requests)"
declare -A R
for r in $(seq 1 "$ROUNDS"); do
    for p in h3 h1 h2; do
        v=$(run_one $p)
        if [ "$v" = FAILED ]; then echo "round $r $p FAILED: no figures from this run"; exit 1; fi
        R[$p]="${R[$p]:-} $v"
        echo "round $r $p $v"
    done
done
med() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)] " (min " a[1] ", max " a[NR] ")"}'; }
for p in h3 h1 h2; do echo "$p median req/CPU-s: $(echo ${R[$p]} | med)"; done
m() { echo ${R[$1]} | tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
awk -v a="$(m h3)" -v b="$(m h1)" -v c="$(m h2)" 'BEGIN { printf "ratio h3/h1-tls %.2f, h3/h2-tls %.2f\n", a / b, a / c }'
echo "# load at end $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
echo "saved $OUT"
