#!/usr/bin/env bash
# bench/h3.sh: HTTP/3 hello-world throughput with many connections x streams against khamsin's
# own HTTP/1.1 over TLS and HTTP/2 over TLS, in the same run, on the noisy-box method of
# bench/lib/common.sh: A B C then C B A, ROUNDS kept rounds (disturbed rounds discarded and
# redone), medians [min..max] and per-round ratios to h1 over TLS with a bootstrap CI95.
# Load:   h3  kh-h3load -c C -m M -n N                (core/tools/kh_h3load.c)
#         h1  h2load --h1 -c C -n N                   (TLS; one request at a time per connection,
#                                                      as wrk does: h1 browsers do not pipeline)
#         h1:p h2load --h1 -c C -m M -n N             (TLS, M requests pipelined: the same depth
#                                                      as h3/h2, for comparison; PROTOS="... h1:p")
#         h2  h2load -c C -m M -n N                   (TLS, ALPN h2)
# Figure: requests per second of *server* CPU (utime + stime from /proc/PID/stat over the load
#         run: the load tool's own speed does not enter it), wall req/s and p99 latency from the
#         tool; server pinned to core 1 (--workers 1), the load tool to core 0; a fresh server per
#         run, warmed up first. Every run must end with 0 failed requests, or the bench stops.
# CALLGRIND=1: instead, server instructions per request (valgrind callgrind, collection on
#         only around the load run of CG_N requests; independent of the box's load).
# Usage: bench/h3.sh   (N=30000 ROUNDS=5 C=32 M=10; KHAMSIN_BIN=build/khamsin, H3LOAD=...;
#                       SERVER_ARGS="--limit h3_gso=0" passes server options to all three;
#                       URLPATH=/64k asks for a 64 KiB body instead of "Hello, World!";
#                       PROTOS="h3 h3:gso0 h3:b1" alternates variants of one protocol: :gso0
#                       adds --limit h3_gso=0, :b1 --limit h3_recv_batch=1 to that server)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
. bench/lib/common.sh
N=${N:-30000}
ROUNDS=${ROUNDS:-5}
C=${C:-32}
M=${M:-10}
CG_N=${CG_N:-5000}
BIN=${KHAMSIN_BIN:-build/khamsin}
H3LOAD=${H3LOAD:-$(dirname "$BIN")/kh-h3load}
SERVER_ARGS=${SERVER_ARGS:-}
PROTOS=${PROTOS:-h3 h1 h2}
URLPATH=${URLPATH:-/}
[ -x "$BIN" ] && [ -x "$H3LOAD" ] || { echo "no $BIN or $H3LOAD: cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j2" >&2; exit 1; }
mkdir -p bench/results
OUT=bench/results/h3-$(date -u +%Y%m%d-%H%M%S)${CALLGRIND:+-callgrind}.txt
TMP=$(mktemp -d)
SRV=""
trap '[ -n "$SRV" ] && kill $SRV 2>/dev/null; rm -rf "$TMP"' EXIT
cat > "$TMP/app.lua" <<'LUA'
local k = require "khamsin"
k.get("/", function() return "Hello, World!" end)
local body = string.rep("x", 65536)
k.get("/64k", function() return body end)
LUA

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

variant_args() { # proto[:variant] -> extra server options
    case $1 in
    *:gso0) echo "--limit h3_gso=0" ;;
    *:b1) echo "--limit h3_recv_batch=1" ;;
    esac
}

start_server() { # proto [wrapper...] -> sets SRV, PORT
    local extra; extra=$(variant_args "$1"); shift
    # shellcheck disable=SC2086
    "$@" "$BIN" --listen tls://127.0.0.1:0 --tls-self-signed --http3 --workers 1 \
        --log-level info $SERVER_ARGS $extra "$TMP/app.lua" 2> "$TMP/srv.log" &
    SRV=$!
    PORT=""
    for _ in $(seq 1 300); do
        PORT=$(grep -o '127.0.0.1:[0-9]* (quic)' "$TMP/srv.log" 2>/dev/null | head -1 | sed 's/.*:\([0-9]*\) .*/\1/' || true)
        [ -n "$PORT" ] && break
        sleep 0.1
    done
    [ -n "$PORT" ] || { echo "the server did not start:" >&2; cat "$TMP/srv.log" >&2; exit 1; }
}

stop_server() { kill "$SRV" 2>/dev/null || true; wait "$SRV" 2>/dev/null || true; SRV=""; }

# proto n -> runs the load tool pinned to core 0; its output in $TMP/tool.out, 0 when no failure
load() {
    local proto=${1%%:*} n=$2 url="https://127.0.0.1:$PORT$URLPATH"
    rm -f "$TMP/lat.log"
    case $proto in
    h3) taskset -c 0 "$H3LOAD" -c "$C" -m "$M" -n "$n" -t "${H3TIMEOUT:-10}" "$url" > "$TMP/tool.out" 2>&1 ;;
    h1) local depth=1; [ "$1" = h1:p ] && depth=$M
        taskset -c 0 h2load --h1 -c "$C" -m "$depth" -n "$n" --log-file="$TMP/lat.log" "$url" > "$TMP/tool.out" 2>&1 ;;
    h2) taskset -c 0 h2load -c "$C" -m "$M" -n "$n" --log-file="$TMP/lat.log" "$url" > "$TMP/tool.out" 2>&1 ;;
    esac
    case $proto in
    h3) grep -q " $n ok, 0 failed" "$TMP/tool.out" ;;
    *) grep -q "requests: $n total, $n started, $n done, $n succeeded, 0 failed, 0 errored" "$TMP/tool.out" &&
        grep -q "status codes: $n 2xx" "$TMP/tool.out" ;;
    esac
}

wall_rps() { # from the tool's output
    case ${1%%:*} in
    h3) awk '/^time:/ {print $4}' "$TMP/tool.out" ;;
    *) awk '/^finished in/ {gsub(",", "", $4); printf "%.0f\n", $4}' "$TMP/tool.out" ;;
    esac
}

p99_ms() {
    case ${1%%:*} in
    h3) awk '/^latency ms:/ {print $10}' "$TMP/tool.out" ;;
    *) cut -f3 "$TMP/lat.log" | sort -n | awk '{a[NR]=$1} END {i=int(NR*0.99); if (i<1) i=1; printf "%.3f\n", a[i]/1000}' ;;
    esac
}

run_one() { # proto -> "cpu_rps wall_rps p99_ms"
    local proto=$1
    start_server "$proto" taskset -c 1
    load "$proto" 2000 || { stop_server; echo "FAILED warm-up"; cat "$TMP/tool.out" >&2; return; }
    local t0 t1
    t0=$(cpu_ticks "$SRV")
    if ! load "$proto" "$N"; then
        stop_server
        cat "$TMP/tool.out" >&2
        echo FAILED
        return
    fi
    t1=$(cpu_ticks "$SRV")
    stop_server
    local hz; hz=$(getconf CLK_TCK)
    echo "$(awk -v n="$N" -v d="$((t1 - t0))" -v hz="$hz" 'BEGIN { if (d == 0) d = 1; printf "%.0f", n / (d / hz) }') $(wall_rps "$proto") $(p99_ms "$proto")"
}

cg_one() { # proto -> instructions per request (user space, whole server process)
    # Two load runs under one server, each with new connections: Ir(CG_N) - Ir(CG_N / 4) over
    # the difference in requests is the cost of a request without the handshakes.
    local proto=$1 n1=$((CG_N / 4))
    # (a server under callgrind is ~50x slower: 32 handshakes in a row outlast the usual limits)
    SERVER_ARGS="$SERVER_ARGS --limit tls_handshake_timeout_ms=120000 --limit header_timeout_ms=120000 --limit stall_shed_ms=3600000" \
        start_server "$proto" taskset -c 1 valgrind --tool=callgrind --instr-atstart=no \
        --callgrind-out-file="$TMP/cg.$proto.out"
    load "$proto" 500 || { stop_server; echo FAILED; cat "$TMP/tool.out" >&2; return; }
    callgrind_control -i on "$SRV" > /dev/null
    load "$proto" "$n1" || { stop_server; echo FAILED; cat "$TMP/tool.out" >&2; return; }
    callgrind_control -d "$SRV" > /dev/null
    load "$proto" "$CG_N" || { stop_server; echo FAILED; cat "$TMP/tool.out" >&2; return; }
    callgrind_control -d "$SRV" > /dev/null
    callgrind_control -i off "$SRV" > /dev/null
    kill -TERM "$SRV"; wait "$SRV" 2>/dev/null || true; SRV=""
    local f1 f2 ir1 ir2
    f1=$(ls "$TMP"/cg.$proto.out.* | sort -t. -k3 -n | sed -n 1p)
    f2=$(ls "$TMP"/cg.$proto.out.* | sort -t. -k3 -n | sed -n 2p)
    ir1=$(callgrind_annotate "$f1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    ir2=$(callgrind_annotate "$f2" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    echo "$(( (ir2 - ir1) / (CG_N - n1) )) $(( ir2 / CG_N ))"
    if [ -n "${CG_TOP:-}" ]; then
        echo "--- $proto: top functions over $CG_N requests (handshakes included)" >&2
        callgrind_annotate "$f2" 2>/dev/null | sed -n '/file:function/,$p' | sed -n 2,25p >&2
    fi
}

{
echo "# bench/h3.sh $(date -u +%FT%TZ)  N=$N ROUNDS=$ROUNDS C=$C M=$M SERVER_ARGS='$SERVER_ARGS' BIN=$BIN"
echo "# command: N=$N ROUNDS=$ROUNDS C=$C M=$M PROTOS='$PROTOS' URLPATH=$URLPATH ${SERVER_ARGS:+SERVER_ARGS='$SERVER_ARGS' }${CALLGRIND:+CALLGRIND=1 CG_N=$CG_N }bench/h3.sh"
echo "# commit $(git rev-parse --short HEAD) (+$(git status --porcelain core lua | wc -l) uncommitted), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# h3: kh-h3load -c $C -m $M; h1: h2load --h1 -c $C (TLS); h1:p: h2load --h1 -c $C -m $M (TLS, pipelined); h2: h2load -c $C -m $M (TLS); path $URLPATH; runs: $PROTOS"
if [ -n "${CALLGRIND:-}" ]; then
    H3TIMEOUT=120
    echo "# figure: server instructions per request (callgrind, user space): marginal, from a run of"
    echo "# $CG_N requests minus one of $((CG_N / 4)) (each on $C new connections: no handshake in it);"
    echo "# and all in, the run of $CG_N requests with its $C handshakes"
    declare -A I
    for p in $PROTOS; do
        v=$(cg_one "$p")
        case $v in FAILED*) echo "$p FAILED"; exit 1 ;; esac
        set -- $v
        I[$p]=$1
        echo "$p instructions/request: $1 marginal, $2 with handshakes"
    done
    for p in $PROTOS; do [ "$p" = h1 ] || [ -z "${I[h1]:-}" ] || awk -v a="${I[$p]}" -v b="${I[h1]}" -v p="$p" 'BEGIN { printf "ratio %s/h1-tls %.2f (instructions per request)\n", p, a / b }'; done
else
    echo "# the box is shared with other helpers' builds and tests: compare ratios of this run only"
    echo "# per run: requests per server CPU-second, wall req/s, p99 ms"
    declare -A R W L
    bench_method_line
    bench_rounds_init "$TMP"
    while bench_round_next; do # the order of the protocols flips each round (A B C, C B A)
        r=$BENCH_ROUND
        order=$PROTOS; [ $((r % 2)) = 1 ] || order=$(echo $PROTOS | tr ' ' '\n' | tac | tr '\n' ' ')
        declare -A TR=() TW=() TL=()
        for p in $order; do
            v=$(run_one "$p")
            case $v in FAILED*) echo "round $r $p FAILED: no figures from this run"; exit 1 ;; esac
            set -- $v
            TR[$p]=$1; TW[$p]=$2; TL[$p]=$3
            echo "{\"round\": $r, \"server\": \"$p\", \"req_per_cpu\": $1, \"rps\": $2, \"p99_ms\": $3}" >>"$TMP/rows.jsonl"
            echo "round $r $p cpu-rps $1 wall-rps $2 p99-ms $3"
        done
        if bench_round_end; then
            for p in $PROTOS; do R[$p]="${R[$p]:-} ${TR[$p]}"; W[$p]="${W[$p]:-} ${TW[$p]}"; L[$p]="${L[$p]:-} ${TL[$p]}"; done
        fi
    done
    # every round disturbed: use them all (the summary flags it ALL-DISTURBED)
    if [ -z "${R[${PROTOS%% *}]:-}" ]; then
        while read -r p a b c; do R[$p]="${R[$p]:-} $a"; W[$p]="${W[$p]:-} $b"; L[$p]="${L[$p]:-} $c"; done < <(
            $PY -c 'import json,sys; [print(r["server"], r["req_per_cpu"], r["rps"], r["p99_ms"]) for r in map(json.loads, open(sys.argv[1]))]' "$TMP/rows.jsonl")
    fi
    med() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)] " (min " a[1] ", max " a[NR] ")"}'; }
    m() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
    for p in $PROTOS; do
        echo "$p median req/server-CPU-s: $(echo ${R[$p]} | med); wall req/s: $(echo ${W[$p]} | med); p99 ms: $(echo ${L[$p]} | med)"
    done
    base=h1; [ -n "${R[h1]:-}" ] || base=${PROTOS%% *}
    for p in $PROTOS; do
        [ "$p" = "$base" ] && continue
        awk -v a="$(echo ${R[$p]} | m)" -v b="$(echo ${R[$base]} | m)" -v p="$p" -v q="$base" 'BEGIN { printf "ratio %s/%s %.2f (per server CPU-second, medians)\n", p, q, a / b }'
    done
    for p in $PROTOS; do
        [ "$p" = "$base" ] && continue
        bench_summary "$TMP/rows.jsonl" --metric req_per_cpu --metric rps --metric p99_ms --lower p99_ms \
            --subject "$p" --anchor "$base" --label "HTTP/3 hello: $p vs our own $base over TLS (-c $C -m $M)"
    done
fi
echo "# load at end $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
echo "saved $OUT"
