#!/usr/bin/env bash
# bench/startup.sh - start-up: exec of the server -> its first answered request, cleartext and
# with a TLS listener (issue 15 item 5), against three floors: /bin/true spawned the same way (its
# exit polled), and a C server polled exactly as khamsin is (bench/lib/startup_floor.c: listen,
# accept, answer the same 13 bytes; built here with cc), and the Lua floor (floor-lua: that server
# with a lua_State, the standard libraries and a one-line hello handler that makes the answer,
# bench/lib/startup_floor.c built with -DKH_FLOOR_LUA, linked against the static LuaJIT khamsin links: what any LuaJIT
# engine pays), plus the load-independent parts: callgrind instruction counts from exec to the first
# request reaching Lua (bench/apps/first_answer.lua exits there) and where they go, and the page
# faults on that way, by phase and by mapping (cleartext; bench/lib/startupfaults.py).
#
#   bench/startup.sh                 # RUNS=20 (each run alternates floor, then every case)
#   RUNS=5 PARTS=wall bench/startup.sh
#   PARTS=faults bench/startup.sh    # page faults only (needs perf and tracefs: root)
#   PARTS=counts bench/startup.sh    # faults, syscalls, threads, shared objects per case, beside
#                                    # both floors (needs perf and strace)
#   PARTS=timeline RT=1 bench/startup.sh  # where the wall clock goes, phase by phase (ftrace
#                                    # tracepoints: root; bench/lib/startuptimeline.py)
#   PARTS=steps RT=1 bench/startup.sh     # worker 0's Lua state load step by step, wall clock
#                                    # (builds build-steps/ with -DKH_STARTUP_STEPS=ON; not in
#                                    # the default PARTS; bench/lib/startupsteps.py)
#   RT=1: the measurers run under chrt -f 10 (SCHED_FIFO, inherited by the servers): on a busy
#   box other processes then do not preempt a run (the box's own slowness still shows)
#
# The instruction counts end with the first request in Lua, which _exits (atexit handlers such
# as OPENSSL_cleanup are not counted; before 2026-12-02 they were, ~1.4 M with TLS).
# Cases: khamsin (cleartext, polled with GET /), khamsin-tls (--tls-cert/--tls-key, ECDSA P-256,
# polled over TLS 1.3: a full handshake, then GET /), khamsin-ss-tls (--tls-self-signed, over TLS).
# Env: KHAMSIN_BIN (default build-release/khamsin, built if missing) RUNS=20
#   PARTS="wall counts ir faults timeline" RT (unset) SERVER_CORE=1 CLIENT_CORE=0 PORT=23290 COUNT_RUNS=20 (perf stat
#   runs per case, PARTS=counts). Needs /usr/bin/python3, cc, valgrind (PARTS=ir), curl.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=/usr/bin/python3
. bench/lib/common.sh
BIN=${KHAMSIN_BIN:-build-release/khamsin}
RUNS=${RUNS:-20}
PARTS=${PARTS:-"wall counts ir faults timeline"}
RTPREFIX=()
[[ -n ${RT:-} ]] && RTPREFIX=(chrt -f 10)
SERVER_CORE=${SERVER_CORE:-1}
CLIENT_CORE=${CLIENT_CORE:-0}
PORT=${PORT:-23290}
if [[ ! -x $BIN ]]; then
  cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build build-release -j2 --target khamsin khamsin-tls >/dev/null
fi
STAMP=$(date +%Y%m%d-%H%M%S)
RESULT=bench/results/startup-$STAMP.txt
TMP=$(mktemp -d /tmp/khbench-startup.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
FLOOR=$TMP/startup_floor # the second floor (see the header)
cc -O2 -o "$FLOOR" bench/lib/startup_floor.c
# the Lua floor (see the header): the LuaJIT archive the build links (KH_LUAJIT_A), else pkg-config's
LUAJIT_A=$(sed -n 's/^KH_LUAJIT_A:FILEPATH=//p' "$(dirname "$BIN")/CMakeCache.txt" 2>/dev/null || true)
[[ -f $LUAJIT_A ]] || LUAJIT_A=$(pkg-config --variable=libdir luajit)/libluajit-5.1.a
FLOOR_LUA=$TMP/startup_floor_lua
cc -O2 -static-libgcc $(pkg-config --cflags luajit) -DKH_FLOOR_LUA -o "$FLOOR_LUA" bench/lib/startup_floor.c "$LUAJIT_A" -lm -ldl
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$TMP/key.pem" \
  -out "$TMP/cert.pem" -days 2 -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null
COMMON="--workers 1 --log-level warn"
CLEAR="$BIN $COMMON --listen 127.0.0.1:PORT"
TLS="$BIN $COMMON --listen tls://127.0.0.1:PORT --tls-cert $TMP/cert.pem --tls-key $TMP/key.pem"
SS="$BIN $COMMON --listen tls://127.0.0.1:PORT --tls-self-signed"

# cmd... under callgrind (the profile to $1, its output to $3), polled with GET / over $2 until it
# exits; prints its instruction total. The client's timeout is long: under valgrind on a loaded box
# a handshake can take seconds, and a retry would count a second handshake (and the twins built
# after the first connection closed).
callgrind_answered() { # profile scheme log cmd...
  local out=$1 scheme=$2 log=$3 pid i
  shift 3
  valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >"$log" 2>&1 &
  pid=$!
  for ((i = 0; i < 600; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    curl -sk --max-time 120 -o /dev/null "$scheme://127.0.0.1:$PORT/" || true
    sleep 0.1
  done
  wait "$pid" || true
  awk '/^summary:|^totals:/ {print $2; exit}' "$out"
}
ir_case() { # name listen-args... -> Ir of exec -> first request in Lua ($SCHEME); keeps the profile
  local name=$1
  shift
  # shellcheck disable=SC2086 # COMMON: options split on spaces
  callgrind_answered "$TMP/cg-$name.out" "$SCHEME" "$TMP/$name.log" "$BIN" $COMMON "$@" bench/apps/first_answer.lua
}
floor_ir() { # floor binary -> Ir of exec -> exit after its first answer (--once); keeps the profile
  callgrind_answered "$TMP/cg-$(basename "$1").out" http /dev/null "$1" "$PORT" --once
}
breakdown() { # profile -> the inclusive counts of the start-up's parts (first match of each name)
  callgrind_annotate --inclusive=yes "$1" 2>/dev/null | $PY -c '
import re, sys
parts = [  # (label, function): inclusive, so a part includes the lines indented under it
    ("dlopen (khamsin-tls.so, OpenSSL: relocations)", "dlopen"),
    ("OPENSSL_init_ssl (no openssl.cnf, no error strings)", "OPENSSL_init_ssl"),
    ("kh_tls_ctx_new: first random bytes (ticket key)", "RAND_get0_primary"),
    ("  of it: first fetch: the name map of all algorithms", "OBJ_NAME_do_all"),
    ("  of it: DRBG instantiation (first cipher fetch)", "EVP_RAND_instantiate"),
    ("kh_tls_ctx_new: record layer algorithms", "kh_tls13_algs_new"),
    ("kh_tls_ctx_new: SSL_CTX_new", "SSL_CTX_new"),
    ("kh_tls_ctx_new: certificate chain + key", "load_pair"),
    ("  of it: certificate (public key through a decoder)", "PEM_read_bio_X509_AUX"),
    ("kh_tls_ctx_new: self-signed P-256 key + certificate", "self_signed"),
    ("ld.so before main: mapping, relocations", "_dl_start"),
    ("lazy binding: first call of each libc function", "_dl_fixup"),
    ("main, all of it (worker 0 load included)", "main"),
    ("worker 0: Lua state + app load", "kh_worker_load_here"),
    ("  of it: the Lua standard libraries", "luaL_openlibs"),
    ("  of it: the state itself (luaL_newstate)", "luaL_newstate"),
    ("  of it: the khamsin.core table of C functions", "open_core"),
    ("  of it: the khamsin modules (bytecode, main chunks; the core table in it)", "load_module"),
    ("  of it: the FFI, first use (ctype state)", "luaopen_ffi"),
    ("  of it: ffi.cdef (khamsin and the app)", "lj_cf_ffi_cdef"),
    ("  of it: collector steps", "lj_gc_step"),
    ("first TLS handshake (SSL_do_handshake)", "SSL_do_handshake"),
    ("exit handlers (not counted: first_answer.lua _exits)", "OPENSSL_cleanup"),
]
seen = {}
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) .*?:([A-Za-z_][\w.]*?)(?:@@\S+)? \[", line)
    if m and m.group(2) not in seen:
        seen[m.group(2)] = int(m.group(1).replace(",", ""))
for label, fn in parts:
    if fn in seen:
        print("    %-52s %10d" % (label, seen[fn]))
'
}

{
  echo "# khamsin bench: start-up, exec -> first answered request"
  echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command:  RUNS=$RUNS PARTS=\"$PARTS\" $0 $*"
  echo "git:      $(git rev-parse --short HEAD) ($(git status --porcelain -- core lua | wc -l) uncommitted change(s) under core/ lua/); binary $BIN"
  bench_method_line
  echo "openssl:  $(openssl version)"
  if [[ " $PARTS " == *" wall "* ]]; then
    echo
    echo "## Wall clock: exec (pinned to core $SERVER_CORE) -> first 200 'Hello, World!', polled every 0.2 ms from core $CLIENT_CORE; $RUNS runs, each alternating floor, khamsin, khamsin-tls, khamsin-ss-tls"
    echo "   floor: /bin/true spawned the same way, its exit polled at the same cadence; floor-server: a C server (bench/lib/startup_floor.c) polled exactly as khamsin is; floor-lua: that server answering through a LuaJIT state and a one-line handler (bench/lib/startup_floor.c, -DKH_FLOOR_LUA); -tls cases poll over TLS 1.3 (python ssl: a full handshake, then GET /)"
    "${RTPREFIX[@]}" $PY bench/lib/startupbench.py --runs "$RUNS" --port "$PORT" --server-core "$SERVER_CORE" \
      --client-core "$CLIENT_CORE" --json "$TMP/wall.jsonl" --log "$TMP/wall.log" \
      "floor-server=$FLOOR PORT" "floor-lua=$FLOOR_LUA PORT" "khamsin=$CLEAR bench/apps/hello.lua" "khamsin-tls=$TLS bench/apps/hello.lua" "khamsin-ss-tls=$SS bench/apps/hello.lua"
    echo "   (load average now $(cut -d' ' -f1-3 /proc/loadavg): on a busy box every figure, the floor too, grows; compare the '- floor' column and the instruction counts below)"
    echo "   the client's own share of those figures: one poll (new connection; -tls: a full TLS 1.3 handshake; then GET /) of a server already running"
    $PY bench/lib/startupbench.py --warm-gets "${WARM_GETS:-300}" --port "$PORT" --server-core "$SERVER_CORE" \
      --client-core "$CLIENT_CORE" --log "$TMP/wall.log" \
      "khamsin=$CLEAR bench/apps/hello.lua" "khamsin-tls=$TLS bench/apps/hello.lua"
  fi
  if [[ " $PARTS " == *" counts "* ]]; then
    echo
    echo "## Counts (load-independent): exec -> the first request (khamsin: bench/apps/first_answer.lua exits there; floor-server and floor-lua --once exit after their answer)"
    if command -v perf >/dev/null && command -v strace >/dev/null; then
      $PY bench/lib/startupcounts.py --port "$PORT" --runs "${COUNT_RUNS:-20}" "true=/bin/true" \
        "floor-server=$FLOOR PORT --once" "floor-lua=$FLOOR_LUA PORT --once" \
        "khamsin=$CLEAR bench/apps/first_answer.lua"
      if command -v valgrind >/dev/null; then
        # the floors' instructions, to set beside khamsin's in the next part
        printf '  floor-server: %s Ir (callgrind, exec -> exit after its first answer)\n' "$(floor_ir "$FLOOR")"
        printf '  floor-lua:    %s Ir (callgrind, exec -> exit after its first answer)\n' "$(floor_ir "$FLOOR_LUA")"
      fi
    else
      echo "  (skipped: needs perf and strace)"
    fi
  fi
  if [[ " $PARTS " == *" ir "* ]]; then
    command -v valgrind >/dev/null || { echo "PARTS=ir needs valgrind"; exit 1; }
    echo
    echo "## Instructions (callgrind Ir, user space, load-independent): exec -> the first request reaching Lua (bench/apps/first_answer.lua)"
    SCHEME=http; ir_clear=$(ir_case clear --listen "127.0.0.1:$PORT")
    SCHEME=https; ir_tls=$(ir_case tls --listen "tls://127.0.0.1:$PORT" --tls-cert "$TMP/cert.pem" --tls-key "$TMP/key.pem")
    SCHEME=https; ir_ss=$(ir_case ss --listen "tls://127.0.0.1:$PORT" --tls-self-signed)
    ir_flua=$(floor_ir "$FLOOR_LUA")
    printf '  %-16s %12s Ir\n' floor-lua "$ir_flua" khamsin "$ir_clear" khamsin-tls "$ir_tls" khamsin-ss-tls "$ir_ss"
    echo "   (floor-lua: exec -> exit after its first answer, the handler called; khamsin: exec -> the first request in Lua)"
    echo "  where floor-lua's go (inclusive):"
    breakdown "$TMP/cg-startup_floor_lua.out"
    for c in clear tls ss; do
      echo "  where khamsin-$c's go (inclusive):"
      breakdown "$TMP/cg-$c.out"
    done
    if [[ -n ${BENCH_SUMMARY:-} ]]; then
      printf '| start-up | exec -> first request in Lua | instructions (lower better) | cleartext %s, TLS %s, self-signed %s | - | - | - |\n' \
        "$ir_clear" "$ir_tls" "$ir_ss" >>"$BENCH_SUMMARY"
    fi
  fi
  if [[ " $PARTS " == *" faults "* ]]; then
    echo
    echo "## Page faults (load-independent; each costs 10-35 us on the VMs measured): exec -> the first request reaching Lua"
    if command -v perf >/dev/null && [[ $(id -u) == 0 ]]; then
      echo "  cleartext:"
      $PY bench/lib/startupfaults.py --bin "$BIN" --port "$PORT" --app bench/apps/first_answer.lua --runs 5 -- $COMMON --listen "127.0.0.1:$PORT"
      echo "  TLS listener (--tls-cert/--tls-key), polled over TLS:"
      $PY bench/lib/startupfaults.py --bin "$BIN" --port "$PORT" --app bench/apps/first_answer.lua --runs 5 --tls -- $COMMON --listen "tls://127.0.0.1:$PORT" --tls-cert "$TMP/cert.pem" --tls-key "$TMP/key.pem"
    else
      echo "  (skipped: needs perf and root for the syscall tracepoints)"
    fi
  fi
  if [[ " $PARTS " == *" timeline "* ]]; then
    echo
    echo "## Timeline (ftrace tracepoints${RT:+, under chrt -f 10}): ms after the execve, medians of $RUNS runs; per phase the main thread's faults, syscalls, time off cpu, and the other threads' time"
    if [[ $(id -u) == 0 && -d /sys/kernel/tracing/instances ]]; then
      cc -O2 -o "$TMP/gate" bench/lib/startup_gate.c
      "${RTPREFIX[@]}" $PY bench/lib/startuptimeline.py --gate "$TMP/gate" --runs "$RUNS" --port "$PORT" \
        --server-core "$SERVER_CORE" --client-core "$CLIENT_CORE" "true=/bin/true" "floor-server=$FLOOR PORT" \
        "floor-lua=$FLOOR_LUA PORT" "khamsin=$CLEAR bench/apps/hello.lua" "khamsin-w$(nproc)=${CLEAR/--workers 1/--workers $(nproc)} bench/apps/hello.lua"
    else
      echo "  (skipped: needs root and tracefs instances)"
    fi
  fi
  if [[ " $PARTS " == *" steps "* ]]; then
    echo
    echo "## Steps of worker 0's Lua state load (lua/kh_lua_state.c worker_init; wall clock${RT:+, under chrt -f 10}, build-steps/ = -DKH_STARTUP_STEPS=ON): cleartext, bench/apps/hello.lua"
    cmake -S . -B build-steps -DCMAKE_BUILD_TYPE=Release -DKH_STARTUP_STEPS=ON >/dev/null &&
      cmake --build build-steps -j2 --target khamsin >/dev/null
    # shellcheck disable=SC2086 # COMMON: options split on spaces
    "${RTPREFIX[@]}" $PY bench/lib/startupsteps.py --runs "$RUNS" --port "$PORT" --server-core "$SERVER_CORE" \
      --client-core "$CLIENT_CORE" -- build-steps/khamsin $COMMON --listen 127.0.0.1:PORT bench/apps/hello.lua
  fi
  if [[ -n ${BENCH_SUMMARY:-} && -f $TMP/wall.jsonl ]]; then
    $PY - "$TMP/wall.jsonl" >>"$BENCH_SUMMARY" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = {s: statistics.median(r["ms"] for r in rows if r["server"] == s) for s in dict.fromkeys(r["server"] for r in rows)}
f = med["floor"]
print("| start-up | exec -> first answer (ms, median of %d) | wall clock (lower better) | %s | floor %.2f | - | - |" % (
    sum(1 for r in rows if r["server"] == "floor"),
    ", ".join("%s %.2f (+%.2f)" % (s, m, m - f) for s, m in med.items() if s != "floor"), f))
EOF
  fi
} 2>&1 | tee "$RESULT"
echo "results written to $RESULT"
