#!/usr/bin/env bash
# bench/h2.sh - HTTP/2 benchmark, cleartext (prior knowledge: khamsin, nginx-lua) and over TLS 1.3
# (ALPN h2, same ECDSA P-256 certificate: khamsin-tls, nginx-lua-tls), all in ONE run (never
# compare figures from different runs). Same approach as bench/http1.sh: servers
# pinned to SERVER_CORE, the load generator (h2load) to CLIENT_CORE, a fresh server start per
# measured window, rounds interleaved, server CPU from /proc/<pid>/stat over its process tree.
#
#   bench/h2.sh                                       # full run, ~3 min
#   DURATION=3 WARMUP=1 ROUNDS=1 IDLE_CONNS=500 bench/h2.sh   # smoke run
#
# Env knobs (defaults): SERVERS="khamsin nginx-lua khamsin-tls nginx-lua-tls" CONNS=64 STREAMS=10 ROUNDS=5 (kept rounds; disturbed ones
#   are discarded and redone: bench/lib/common.sh) DURATION=10
#   WARMUP=2 IDLE_CONNS=2000 PARTS="load idle" BASE_PORT=25480 KHAMSIN_BIN=build-release/khamsin
#   SERVER_CORE=1 CLIENT_CORE=0 NICE=-20 (if root, else 0)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CMDLINE="$0${*:+ $*}"
PY=/usr/bin/python3
LIB=bench/lib/benchlib.py
. bench/lib/common.sh
H2=bench/lib/h2bench.py

SERVERS=${SERVERS:-"khamsin nginx-lua khamsin-tls nginx-lua-tls"}
CONNS=${CONNS:-64}
STREAMS=${STREAMS:-10}
ROUNDS=${ROUNDS:-${BENCH_ROUNDS:-5}}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
IDLE_CONNS=${IDLE_CONNS:-2000}
PARTS=${PARTS:-"load idle"}
BASE_PORT=${BASE_PORT:-25480}
KHAMSIN_BIN_DEFAULT="$ROOT/build-release/khamsin"
KHAMSIN_BIN=${KHAMSIN_BIN:-$KHAMSIN_BIN_DEFAULT}
SERVER_CORE=${SERVER_CORE:-1}
CLIENT_CORE=${CLIENT_CORE:-0}
if [[ $(id -u) == 0 ]]; then NICE=${NICE:--20}; else NICE=${NICE:-0}; fi
NGX_MODDIR=${NGX_MODDIR:-/usr/lib/nginx/modules}

STAMP=$(date +%Y%m%d-%H%M%S)
RESULT="bench/results/h2-$STAMP.txt"
mkdir -p bench/results
TMP=$(mktemp -d /tmp/khbench-h2.XXXXXX)
LIVE=()

fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
port_of() {
  case $1 in
    khamsin) echo $((BASE_PORT + 1)) ;;
    nginx-lua) echo $((BASE_PORT + 2)) ;;
    khamsin-tls) echo $((BASE_PORT + 3)) ;;
    nginx-lua-tls) echo $((BASE_PORT + 4)) ;;
    *) fail "unknown server '$1' (known: khamsin nginx-lua khamsin-tls nginx-lua-tls)" ;;
  esac
}


cleanup() {
  local p
  for p in "${LIVE[@]}"; do kill_tree "$p" >/dev/null 2>&1; done
  LIVE=()
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

gen_nginx_conf() { # dir port [tls]
  if [[ ${3:-} == tls ]]; then
    nginx_conf "$1" bench/h2.sh 65536 20000 1 "    listen 127.0.0.1:$2 ssl http2;
    ssl_certificate $TMP/cert.pem;
    ssl_certificate_key $TMP/key.pem;
    ssl_protocols TLSv1.3;
    location / { $NGX_HELLO_LUA }"
  else
    nginx_conf "$1" bench/h2.sh 65536 20000 1 "    listen 127.0.0.1:$2 http2;
    location / { $NGX_HELLO_LUA }"
  fi
}
tls_of() { [[ $1 == *-tls ]] && echo --tls || true; }

server_cmd() { # name port
  case $1 in
    khamsin) printf '%s\n' "$KHAMSIN_BIN" --workers 1 --listen "127.0.0.1:$2" --log-level warn bench/apps/hello.lua ;;
    nginx-lua) printf '%s\n' nginx -p "$TMP/nginx-lua/" -c "$TMP/nginx-lua/nginx.conf" -e "$TMP/nginx-lua/error.log" ;;
    khamsin-tls) printf '%s\n' "$KHAMSIN_BIN" --workers 1 --listen "tls://127.0.0.1:$2" --tls-cert "$TMP/cert.pem" --tls-key "$TMP/key.pem" --log-level warn bench/apps/hello.lua ;;
    nginx-lua-tls) printf '%s\n' nginx -p "$TMP/nginx-lua-tls/" -c "$TMP/nginx-lua-tls/nginx.conf" -e "$TMP/nginx-lua-tls/error.log" ;;
  esac
}

SPID=
start_server() { # name port
  local cmd
  mapfile -t cmd < <(server_cmd "$1" "$2")
  taskset -c "$SERVER_CORE" "${cmd[@]}" >>"$TMP/$1.out" 2>>"$TMP/$1.err" &
  SPID=$!
  LIVE+=("$SPID")
  $PY $H2 waitready "$2" "$SPID" 15 $(tls_of "$1") || { tail -n 20 "$TMP/$1.err" >&2; fail "$1 did not start"; }
  $PY $H2 check "$2" $(tls_of "$1")
}

stop_server() {
  local p=$1 keep=() x
  kill_tree "$p"
  for x in "${LIVE[@]}"; do [[ $x == "$p" ]] || keep+=("$x"); done
  LIVE=("${keep[@]}")
}

main() {
  trap cleanup EXIT # main runs in a pipeline's subshell: the traps must be set there
  trap 'exit 130' INT TERM HUP
  for tool in h2load nginx taskset; do command -v $tool >/dev/null || fail "missing tool: $tool"; done
  # the default binary is always brought up to date (a no-op when it is): no figure from a stale build
  [[ -x $KHAMSIN_BIN && $KHAMSIN_BIN != "$KHAMSIN_BIN_DEFAULT" ]] || {
    echo "building khamsin (Release) into build-release/ ..."
    cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >"$TMP/build.log" 2>&1 &&
      cmake --build build-release -j2 >>"$TMP/build.log" 2>&1 || { tail -n 40 "$TMP/build.log"; fail "build failed"; }
  }
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
  if ((NICE != 0)); then renice -n "$NICE" -p $$ >/dev/null || fail "renice failed (set NICE=0)"; fi
  taskset -p -c "$CLIENT_CORE" $$ >/dev/null
  local s ports=()
  for s in $SERVERS; do ports+=("$(port_of "$s")"); done
  $PY $LIB portfree "${ports[@]}" || fail "a port is busy (set BASE_PORT)"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$TMP/key.pem" \
    -out "$TMP/cert.pem" -days 2 -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null
  gen_nginx_conf "$TMP/nginx-lua" "$(port_of nginx-lua)"
  gen_nginx_conf "$TMP/nginx-lua-tls" "$(port_of nginx-lua-tls)" tls

  echo "# khamsin bench: HTTP/2 GET /, 13-byte body: h2c (prior knowledge) and h2 over TLS 1.3 (ALPN)"
  echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command:  SERVERS=\"$SERVERS\" CONNS=$CONNS STREAMS=$STREAMS ROUNDS=$ROUNDS DURATION=$DURATION WARMUP=$WARMUP IDLE_CONNS=$IDLE_CONNS PARTS=\"$PARTS\" $CMDLINE"
  echo "git:      $(git rev-parse --short HEAD) ($(git status --porcelain -- core lua CMakeLists.txt | wc -l) uncommitted change(s) under core/ lua/ CMakeLists.txt)"
  echo "khamsin:  $KHAMSIN_BIN (sha256 $(sha256sum "$KHAMSIN_BIN" | cut -c1-16)), $(dpkg-query -W -f='${Package} ${Version}' libnghttp2-14 2>/dev/null)"
  echo "h2load:   $(h2load --version 2>&1 | head -1)"
  echo "nginx:    $(nginx -v 2>&1 | sed 's/^nginx version: //'), lua module $(dpkg-query -W -f='${Version}' libnginx-mod-http-lua 2>/dev/null)"
  bench_method_line
  echo "pinning:  servers on core $SERVER_CORE, h2load (-t 1) on core $CLIENT_CORE, nice $NICE"
  echo "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg) (at start)"
  echo

  if [[ " $PARTS " == *" load "* ]]; then
    echo "## Load: h2load -c $CONNS -m $STREAMS -t 1, ${WARMUP}s warm-up run then a ${DURATION}s measured run (-D), fresh server per window"
    echo "   server CPU = delta of utime+stime over the server's process tree during the measured run"
    local r port
    bench_rounds_init "$TMP"
    while bench_round_next; do
      r=$BENCH_ROUND
      for s in $SERVERS; do
        port=$(port_of "$s")
        start_server "$s" "$port"
        $PY $H2 window --name "$s" --port "$port" --root "$SPID" --conns "$CONNS" --streams "$STREAMS" \
          --duration "$DURATION" --warmup "$WARMUP" --client-core "$CLIENT_CORE" --round "$r" \
          --jsonl "$TMP/load.jsonl" --rawlog "$TMP/raw.txt" $(tls_of "$s")
        stop_server "$SPID"
      done
      bench_round_end || true
    done
    echo
    $PY $H2 report "$TMP/load.jsonl"
    echo
    bench_summary "$TMP/load.jsonl" --metric req_per_cpu_s --metric rps --label "h2c hello (h2load -c $CONNS -m $STREAMS)"
    bench_summary "$TMP/load.jsonl" --metric req_per_cpu_s --metric rps --subject khamsin-tls --anchor nginx-lua-tls \
      --label "h2 over TLS hello (h2load -c $CONNS -m $STREAMS)"
    echo
  fi

  if [[ " $PARTS " == *" idle "* ]]; then
    echo "## Memory per idle h2 connection: $IDLE_CONNS connections, (TLS handshake +) preface + SETTINGS + one GET each (response read), then idle 1 s"
    echo "   PSS = sum of Pss in /proc/<pid>/smaps_rollup over the server's processes, before and after (kernel socket buffers not counted)"
    for s in $SERVERS; do
      port=$(port_of "$s")
      start_server "$s" "$port"
      taskset -c "$CLIENT_CORE" h2load -c 16 -m 10 -n 20000 "$([[ $s == *-tls ]] && echo https || echo http)://127.0.0.1:$port/" >/dev/null
      $PY $H2 idle --name "$s" --port "$port" --root "$SPID" --n "$IDLE_CONNS" --jsonl "$TMP/idle.jsonl" $(tls_of "$s")
      stop_server "$SPID"
    done
    echo
  fi
  echo "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg) (at end)"
  for f in load.jsonl discarded.jsonl idle.jsonl; do
    [[ -f $TMP/$f ]] && { echo "## Appendix: $f"; cat "$TMP/$f"; }
  done
  if [[ -f $TMP/raw.txt ]]; then echo "## Appendix: raw h2load output"; cat "$TMP/raw.txt"; fi
}

set +e
main 2>&1 | tee "$RESULT.partial"
rc=${PIPESTATUS[0]}
set -e
if ((rc == 0)); then mv "$RESULT.partial" "$RESULT"; echo "results written to $RESULT"; else
  mkdir -p bench/results/tmp; mv "$RESULT.partial" "bench/results/tmp/h2-$STAMP.FAILED.txt"; exit "$rc"; fi
