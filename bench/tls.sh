#!/usr/bin/env bash
# bench/tls.sh - TLS 1.3 benchmark: khamsin vs nginx+lua, same certificate (ECDSA P-256), both
# TLS 1.3 only, all in ONE run (figures from different runs are never compared; the approach of
# bench/http1.sh: server pinned to core 1, load on core 0, server CPU from /proc).
#
#   bench/tls.sh                                         # full run, ~4 min
#   DURATION=3 ROUNDS=1 HS_SECONDS=3 IDLE_CONNS=2000 bench/tls.sh   # smoke run
#
# Parts:
#   load   wrk -t1 -cCONNS over https, keep-alive GET / ("Hello, World!"), DURATION s windows
#          after WARMUP s, fresh server per window; req/s and requests per server CPU-second
#   hs     full TLS 1.3 handshakes per second (HS_CLIENTS parallel `openssl s_time -new -www /`)
#          and resumed ones (`-reuse`: session tickets), HS_SECONDS each; per second and per
#          server CPU-second. -www makes s_time read the answer, and with it the TLS 1.3 ticket
#          (without it no connection resumes, on any server). The clients share one core and
#          are the bottleneck: per server CPU-second is the figure to compare
#   syscalls (not in the default PARTS) every syscall of the server per connection accepted,
#          strace -f -c while one `openssl s_time -new` / `-reuse` runs SC_SECONDS (3): counts
#   idle   PSS delta of the server over IDLE_CONNS idle TLS connections (one GET each, then
#          idle), bytes per connection; khamsin cleartext too, for the cost of TLS itself
#
# Env knobs (defaults): SERVERS="khamsin nginx-lua" CONNS=256 ROUNDS=5 (kept rounds, load and hs each;
#   disturbed rounds are discarded and redone: bench/lib/common.sh) DURATION=10 WARMUP=2
#   HS_SECONDS=10 HS_CLIENTS=4 IDLE_CONNS=5000 PARTS="load hs idle" BASE_PORT=24080
#   (SERVERS may add khamsin-ossl: khamsin with --tls-own-records 0, OpenSSL's record layer;
#   and nginx-lua-aes128: nginx + lua with khamsin's TLS 1.3 suite order, AES-128-GCM first with
#   server preference, where plain nginx-lua's clients get OpenSSL's first, AES-256-GCM-SHA384)
#   KHAMSIN_BIN=build-release/khamsin SERVER_CORE=1 WRK_CORE=0 KEEP_TMP=0 QUIET_WAIT=20
#   QUIET_BUDGET=120 (s to wait for a quiet box before a window / per run)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CMDLINE="$0${*:+ $*}"
PY=/usr/bin/python3
LIB=bench/lib/tlsbench.py
. bench/lib/common.sh

SERVERS=${SERVERS:-"khamsin nginx-lua"}
CONNS=${CONNS:-256}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
HS_SECONDS=${HS_SECONDS:-10}
HS_CLIENTS=${HS_CLIENTS:-4}
IDLE_CONNS=${IDLE_CONNS:-5000}
PARTS=${PARTS:-"load hs idle"}
BASE_PORT=${BASE_PORT:-24080}
bench_knobs
bench_paths tls
LIVE=()

log() { printf '%s\n' "$*" | tee -a "$PARTIAL"; }
fail() { log "FAIL: $*"; exit 1; }
has() { [[ " $1 " == *" $2 "* ]]; }

cleanup() {
  local p
  for p in "${LIVE[@]}"; do stop_server "$p"; done
  if [[ -f $PARTIAL ]]; then
    if [[ ${OK:-0} == 1 ]]; then mv "$PARTIAL" "$RESULT"; echo "results written to $RESULT"
    else echo "FAILED; partial output in $PARTIAL, temp dir $TMP" >&2; KEEP_TMP=1; fi
  fi
  ((KEEP_TMP)) || rm -rf "$TMP"
}
trap cleanup EXIT

port_of() { case $1 in khamsin) echo $((BASE_PORT + 1)) ;; khamsin-tcp) echo $((BASE_PORT + 2)) ;;
  nginx-lua) echo $((BASE_PORT + 3)) ;; khamsin-ossl) echo $((BASE_PORT + 4)) ;;
  nginx-lua-aes128) echo $((BASE_PORT + 5)) ;; *) fail "unknown server $1" ;; esac; }

gen_nginx_conf() { # dir port [extra directives]
  nginx_conf "$1" bench/tls.sh 20000 19000 1 "    listen 127.0.0.1:$2 ssl;
    ssl_certificate $TMP/cert.pem;
    ssl_certificate_key $TMP/key.pem;
    ssl_protocols TLSv1.3;${3:-}
    ssl_session_tickets on;
    location / { $NGX_HELLO_LUA }"
}

server_cmd() { # name port
  case $1 in
    khamsin) echo "$KHAMSIN_BIN --workers 1 --listen tls://127.0.0.1:$2 --tls-cert $TMP/cert.pem --tls-key $TMP/key.pem --log-level warn examples/hello.lua" ;;
    # khamsin-ossl: OpenSSL keeps the record layer after the handshake (what kh_tls13 replaces)
    khamsin-ossl) echo "$KHAMSIN_BIN --workers 1 --listen tls://127.0.0.1:$2 --tls-cert $TMP/cert.pem --tls-key $TMP/key.pem --tls-own-records 0 --log-level warn examples/hello.lua" ;;
    khamsin-tcp) echo "$KHAMSIN_BIN --workers 1 --listen tcp://127.0.0.1:$2 --log-level warn examples/hello.lua" ;;
    nginx-lua) echo "nginx -p $TMP/nginx-lua/ -c $TMP/nginx-lua/nginx.conf -e $TMP/nginx-lua/error.log" ;;
    nginx-lua-aes128) echo "nginx -p $TMP/nginx-lua-aes128/ -c $TMP/nginx-lua-aes128/nginx.conf -e $TMP/nginx-lua-aes128/error.log" ;;
  esac
}

SPID=
start_server() { # name
  local port
  port=$(port_of "$1")
  # shellcheck disable=SC2046
  taskset -c "$SERVER_CORE" $(server_cmd "$1" "$port") >>"$TMP/$1.log" 2>&1 &
  SPID=$!
  LIVE+=("$SPID")
  if [[ $1 == khamsin-tcp ]]; then
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && return; sleep 0.05; done
    fail "khamsin-tcp did not answer"
  fi
  $PY $LIB waitready "$port" "$SPID" 15 || { tail -20 "$TMP/$1.log"; fail "$1 did not answer over TLS"; }
}

stop_server() { # pid: TERM the tree, then KILL what is left
  local p=$1 kids keep=() x
  kids=$(pgrep -P "$p" 2>/dev/null || true)
  kill -TERM "$p" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  for x in $p $kids; do kill -KILL "$x" 2>/dev/null || true; done
  wait "$p" 2>/dev/null || true
  for x in "${LIVE[@]}"; do [[ $x == "$p" ]] || keep+=("$x"); done
  LIVE=("${keep[@]}")
}

# waits (at most QUIET_WAIT s per window, QUIET_BUDGET s per run) until the box is quiet: other
# engineers' jobs on the same machine would otherwise land in a window
QUIET_WAIT=${QUIET_WAIT:-20}
QUIET_BUDGET=${QUIET_BUDGET:-120}
WAITED=0
quiet() {
  local left=$((QUIET_BUDGET - WAITED)) w
  ((left > 0)) || return 0
  w=$($PY $LIB quiet "$((left < QUIET_WAIT ? left : QUIET_WAIT))")
  WAITED=$((WAITED + ${w%.*}))
}
# "  [server core outside the server: N%]": busy time of the server core not charged to the
# server (other tasks, and kernel softirq work for loopback packets, which is not all charged to
# the server); informative, since the per-CPU-second figures count only the server's own time
noise() {
  local o
  o=$(jget "$1" other)
  awk -v o="$o" 'BEGIN { printf "  [server core outside the server: %.0f%%]", o * 100 }'
}

jget() { $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(d[sys.argv[2]])" "$@"; }

# ------------------------------------------------------------------- setup ---
for tool in wrk nginx taskset openssl curl; do command -v $tool >/dev/null || fail "missing tool: $tool"; done
(($(nproc --all) >= 2)) || fail "need >= 2 cores"
ulimit -n "$(ulimit -Hn)"
# the default binary is always brought up to date (a no-op when it is): no figure from a stale build
if has "$SERVERS" khamsin && [[ $KHAMSIN_BIN == "$KHAMSIN_BIN_DEFAULT" || ! -x $KHAMSIN_BIN ]]; then
  [[ $KHAMSIN_BIN == "$KHAMSIN_BIN_DEFAULT" ]] || fail "KHAMSIN_BIN=$KHAMSIN_BIN not found"
  BENCH_BUILD_LOG=$TMP/build.log bench_build_release || fail "khamsin build failed (see $TMP/build.log)"
fi
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$TMP/key.pem" \
  -out "$TMP/cert.pem" -days 2 -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null
gen_nginx_conf "$TMP/nginx-lua" "$(port_of nginx-lua)"
! has "$SERVERS" nginx-lua-aes128 || gen_nginx_conf "$TMP/nginx-lua-aes128" "$(port_of nginx-lua-aes128)" "
    ssl_prefer_server_ciphers on;
    ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256;"
taskset -p -c "$WRK_CORE" $$ >/dev/null

: >"$PARTIAL"
log "# khamsin bench: TLS 1.3 (same ECDSA P-256 certificate for every server)"
log "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
log "command:  SERVERS=\"$SERVERS\" CONNS=$CONNS ROUNDS=$ROUNDS DURATION=$DURATION WARMUP=$WARMUP HS_SECONDS=$HS_SECONDS HS_CLIENTS=$HS_CLIENTS IDLE_CONNS=$IDLE_CONNS PARTS=\"$PARTS\" $CMDLINE"
log "git:      $(git rev-parse --short HEAD) ($(git status --porcelain -- core lua CMakeLists.txt | wc -l) uncommitted change(s) under core/ lua/)"
has "$SERVERS" khamsin && log "khamsin:  $KHAMSIN_BIN (sha256 $(sha256sum "$KHAMSIN_BIN" | cut -c1-16)): $(server_cmd khamsin PORT)"
log "nginx:    $(nginx -v 2>&1 | sed 's/^nginx version: //'), $(nginx -V 2>&1 | grep -o 'built with OpenSSL [^ ]*' || true), lua module $(dpkg-query -W -f='${Version}' libnginx-mod-http-lua 2>/dev/null): listen ssl, ssl_protocols TLSv1.3, tickets on, worker_processes 1"
log "openssl:  $(openssl version)   wrk: $(wrk -v 2>&1 | head -1 | sed 's/ Copyright.*//')"
log "$(bench_method_line)"
log "pinning:  servers on core $SERVER_CORE, clients on core $WRK_CORE"
log "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg) (at start); before each window waits up to ${QUIET_WAIT}s (${QUIET_BUDGET}s per run) for both cores >= 90% idle"
log ""

# -------------------------------------------------------------------- load ---
round_end() { bench_round_end >"$TMP/re.txt" 2>&1 || true; log "$(cat "$TMP/re.txt")"; }
if has "$PARTS" load; then
  log "## Load: wrk -t1 -c$CONNS https keep-alive GET /, ${DURATION}s windows after ${WARMUP}s warm-up, $ROUNDS kept round(s), fresh server per window, servers alternated in each round"
  log "   server CPU = utime+stime delta (/proc) of the server's process tree over the window"
  bench_rounds_init "$TMP"
  while bench_round_next; do
    r=$BENCH_ROUND
    for s in $SERVERS; do
      port=$(port_of "$s")
      quiet
      start_server "$s"
      taskset -c "$WRK_CORE" wrk -t1 -c"$CONNS" -d"${WARMUP}s" "https://127.0.0.1:$port/" >/dev/null
      $PY $LIB window "$SPID" "$WRK_CORE" "$SERVER_CORE" -- wrk -t1 -c"$CONNS" -d"${DURATION}s" "https://127.0.0.1:$port/" >"$TMP/w.json"
      stop_server "$SPID"
      out=$(jget "$TMP/w.json" out)
      cpu=$(jget "$TMP/w.json" cpu_s)
      rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
      reqs=$(awk '/requests in/ {print $1}' <<<"$out")
      errs=$(grep -E 'Socket errors|Non-2xx' <<<"$out" || true)
      [[ -n $rps ]] || fail "$s: no wrk result: $out"
      printf '{"round": %d, "server": "%s", "rps": %s, "requests": %s, "cpu_s": %s, "req_per_cpu": %s}\n' "$r" "$s" "$rps" "$reqs" "$cpu" \
        "$(awk -v a="$reqs" -v b="$cpu" 'BEGIN{printf "%.1f", a/b}')" >>"$TMP/load.jsonl"
      log "  round $r $s: $rps req/s, $reqs requests, server CPU ${cpu}s => $(awk -v a="$reqs" -v b="$cpu" 'BEGIN{printf "%.0f", a/b}') req/CPU-s$(noise "$TMP/w.json")${errs:+  !! $errs}"
    done
    round_end
  done
  bench_summary "$TMP/load.jsonl" --metric req_per_cpu --metric rps --label "TLS 1.3 keep-alive hello (wrk -c$CONNS)" >"$TMP/sum.txt"
  log "$(cat "$TMP/sum.txt")"
  for a in khamsin-ossl nginx-lua-aes128; do
    has "$SERVERS" $a || continue
    bench_summary "$TMP/load.jsonl" --metric req_per_cpu --anchor $a --summary /dev/null >"$TMP/sum.txt"
    log "$(cat "$TMP/sum.txt")"
  done
  log ""
fi

# -------------------------------------------------------------- handshakes ---
if has "$PARTS" hs; then
  log "## Handshakes: $HS_CLIENTS parallel 'openssl s_time -connect 127.0.0.1:PORT -new|-reuse -www / -time $HS_SECONDS' on core $WRK_CORE (one HTTP/1.0 GET / per connection), $ROUNDS kept round(s), servers alternated in each round"
  log "   -new: a full TLS 1.3 handshake (ECDHE X25519 + ECDSA P-256 signature) per connection; -reuse: resumed from a session ticket"
  log "   the $HS_CLIENTS clients share core $WRK_CORE and are the bottleneck (the server core is not saturated): compare per server CPU-second"
  bench_rounds_init "$TMP"
  while bench_round_next; do
    r=$BENCH_ROUND
    for mode in new reuse; do
      for s in $SERVERS; do
        port=$(port_of "$s")
        quiet
        start_server "$s"
        cmd="for i in \$(seq $HS_CLIENTS); do openssl s_time -connect 127.0.0.1:$port -$mode -www / -time $HS_SECONDS >$TMP/st.\$i 2>&1 & done; wait; cat $TMP/st.*"
        $PY $LIB window "$SPID" "$WRK_CORE" "$SERVER_CORE" -- sh -c "$cmd" >"$TMP/w.json"
        stop_server "$SPID"
        out=$(jget "$TMP/w.json" out)
        cpu=$(jget "$TMP/w.json" cpu_s)
        wall=$(jget "$TMP/w.json" wall_s)
        n=$(awk '/connections in .* real seconds/ {n += $1} END {print n+0}' <<<"$out")
        # s_time prints one mark per connection: 'r' resumed, '*' a full TLS 1.2+ handshake
        reused=$(grep -v 'connections' <<<"$out" | tr -cd 'r' | wc -c)
        fresh=$(grep -v 'connections' <<<"$out" | tr -cd '*' | wc -c)
        ((n > 0)) || fail "$s $mode: no s_time result: $out"
        log "  round $r $(printf '%-10s -%-5s %7d handshakes in %5.1f s = %6.0f /s, server CPU %5.2f s => %6.0f /CPU-s  (s_time marks: %d reused, %d new)%s' \
          "$s" "$mode" "$n" "$wall" "$(awk -v n="$n" -v w="$wall" 'BEGIN{print n/w}')" "$cpu" "$(awk -v n="$n" -v c="$cpu" 'BEGIN{print n/c}')" "$reused" "$fresh" "$(noise "$TMP/w.json")")"
        printf '{"round": %d, "server": "%s", "mode": "%s", "hs_per_s": %s, "hs_per_cpu": %s}\n' "$r" "$s" "$mode" \
          "$(awk -v n="$n" -v w="$wall" 'BEGIN{printf "%.1f", n/w}')" "$(awk -v n="$n" -v c="$cpu" 'BEGIN{printf "%.1f", n/c}')" >>"$TMP/hs.jsonl"
      done
    done
    round_end
  done
  bench_summary "$TMP/hs.jsonl" --metric hs_per_cpu --metric hs_per_s --group mode --label "TLS 1.3 handshakes (s_time x$HS_CLIENTS)" >"$TMP/sum.txt"
  log "$(cat "$TMP/sum.txt")"
  for a in khamsin-ossl nginx-lua-aes128; do
    has "$SERVERS" $a || continue
    bench_summary "$TMP/hs.jsonl" --metric hs_per_cpu --group mode --anchor $a --summary /dev/null >"$TMP/sum.txt"
    log "$(cat "$TMP/sum.txt")"
  done
  log ""
fi

# ---------------------------------------------------------------- syscalls ---
# Counts, not rates: every call of every process of the server (strace -f -c), divided by the
# connections it accepted, while one s_time client makes connections for SC_SECONDS.
if has "$PARTS" syscalls; then
  SC_SECONDS=${SC_SECONDS:-3}
  log "## Syscalls per connection: strace -f -c on every process of the server while one 'openssl s_time -new|-reuse -www / -time $SC_SECONDS' runs; all calls (epoll_wait, OpenSSL's getpid included) / successful accept4 calls"
  for mode in new reuse; do
    for s in $SERVERS; do
      port=$(port_of "$s")
      start_server "$s"
      sargs=(-p "$SPID")
      for k in $(pgrep -P "$SPID" 2>/dev/null || true); do sargs+=(-p "$k"); done
      strace -f -c -o "$TMP/sc.txt" "${sargs[@]}" 2>/dev/null &
      stp=$!
      sleep 0.5
      taskset -c "$WRK_CORE" openssl s_time -connect "127.0.0.1:$port" -"$mode" -www / -time "$SC_SECONDS" >/dev/null 2>&1 || true
      sleep 0.2
      kill -INT "$stp" 2>/dev/null || true
      wait "$stp" 2>/dev/null || true
      stop_server "$SPID"
      # strace -c rows: % time, seconds, usecs/call, calls, [errors], syscall
      log "  $(awk -v s="$s" -v m="$mode" '
        $NF ~ /^[a-z_0-9]+$/ && $4 ~ /^[0-9]+$/ && $NF != "total" {
          calls[$NF] = $4; err = (NF == 6) ? $5 : 0; errs[$NF] = err; tot += $4 }
        END {
          c = calls["accept4"] - errs["accept4"]
          if (c <= 0) { printf "%-16s -%-5s no connection accepted", s, m; exit }
          printf "%-16s -%-5s %6d connections: %5.2f syscalls per connection (", s, m, c, tot / c
          n = 0
          for (k in calls) order[++n] = k
          for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (calls[order[j]] > calls[order[i]]) { t = order[i]; order[i] = order[j]; order[j] = t }
          for (i = 1; i <= n && i <= 8; i++) printf "%s%s %.2f", (i > 1 ? ", " : ""), order[i], calls[order[i]] / c
          printf ")"
        }' "$TMP/sc.txt")"
    done
  done
  log ""
fi

# -------------------------------------------------------------------- idle ---
if has "$PARTS" idle; then
  log "## Memory per idle connection: $IDLE_CONNS connections, one GET each (TLS 1.3, ALPN http/1.1, Python ssl client), then idle"
  log "   PSS = Pss of /proc/<pid>/smaps_rollup summed over the server's processes, after 64 warm-up connections and 1 s after the last response"
  idle_servers=""
  for s in $SERVERS; do idle_servers+=" $s"; done
  has "$SERVERS" khamsin && idle_servers+=" khamsin-tcp"
  for s in $idle_servers; do
    port=$(port_of "$s")
    start_server "$s"
    tls=--tls
    [[ $s == khamsin-tcp ]] && tls=
    $PY $LIB idle "$port" "$SPID" "$IDLE_CONNS" "$WRK_CORE" $tls >"$TMP/idle.json" || { cat "$TMP/idle.json"; fail "$s: idle test failed"; }
    stop_server "$SPID"
    log "  $(printf '%-12s PSS %8.1f -> %8.1f MiB over %d idle connections => %6.0f bytes/conn  (%s)' "$s" \
      "$(jget "$TMP/idle.json" pss_before_kib | awk '{print $1/1024}')" "$(jget "$TMP/idle.json" pss_after_kib | awk '{print $1/1024}')" \
      "$IDLE_CONNS" "$(jget "$TMP/idle.json" bytes_per_conn)" "$([[ -n $tls ]] && echo TLS || echo cleartext)")"
  done
  log ""
fi

log "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg) (at end)"
for f in load.jsonl hs.jsonl; do [[ -f $TMP/$f ]] && { log "## Appendix: $f"; log "$(cat "$TMP/$f")"; }; done
OK=1
