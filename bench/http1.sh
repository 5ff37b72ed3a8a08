#!/usr/bin/env bash
# bench/http1.sh - HTTP/1.1 benchmark: khamsin vs nginx+lua vs nginx static, keep-alive and a
# new connection per request (`Connection: close`), all in ONE run (never compare figures from
# different runs). See bench/README.md. The keep-alive part also runs `floor` (bench/lib/hello_floor.c:
# epoll, one read and one fixed write a request, no parsing), alternated with the servers in each
# round: its req per server CPU-second over nginx + lua's is the ceiling any server has on this box.
#
#   bench/http1.sh                                  # full run, ~11 min
#   SERVERS="nginx-lua nginx-static" bench/http1.sh # anchors only
#   PARTS=close bench/http1.sh                      # only the Connection: close case, ~3.5 min
#   DURATION=3 ROUNDS=1 IDLE_CONNS=2000 STARTUP_RUNS=3 bench/http1.sh   # quick smoke run
#
# Env knobs (defaults): SERVERS="khamsin nginx-lua nginx-static" CONNS="64 256" ROUNDS=5 (kept rounds;
#   bench/lib/common.sh: disturbed rounds are discarded and redone, BENCH_MAX_LOAD/BENCH_MAX_STEAL)
#   DURATION=10 (s per measured window) WARMUP=2 (s of wrk before each window, per server start)
#   IDLE_CONNS=10000 IDLE_SERVERS=(SERVERS minus nginx-static) STARTUP_RUNS=10
#   STARTUP_SERVERS=(same as IDLE_SERVERS) PARTS="load close idle startup" BASE_PORT=23080
#   CLOSE_CONNS=256 (connections of the `Connection: close` part) CLOSE_SERVERS=(SERVERS minus floor)
#   FLOOR=1 (0: no floor anchor in the keep-alive part) FLOOR_DURATION=1 FLOOR_WARMUP=0 (its windows:
#   short, it has no JIT to warm and its ratio needs no more than a second of wrk)
#   KHAMSIN_BIN=build-release/khamsin SERVER_CORE=1 WRK_CORE=0 NICE=-20 (if root, else 0) KEEP_TMP=0
#   QUIET_WAIT=10 (max s to wait, before each window, until other tasks use <=5% of each core;
#   at most QUIET_BUDGET=45 s over the run) NOISY_RETRIES=1 (a window where server or wrk waited >5%
#   of it for a CPU is redone, this many times at most; at most NOISY_RETRY_BUDGET=5 redos per run)
set -euo pipefail

SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
ROOT=$(cd "$(dirname "$SCRIPT")/.." && pwd)
cd "$ROOT"
CMDLINE=${_KH_CMDLINE:-"$0${*:+ $*}"}
PY=/usr/bin/python3
LIB=bench/lib/benchlib.py
. bench/lib/common.sh

SERVERS=${SERVERS:-"khamsin nginx-lua nginx-static"}
CONNS=${CONNS:-"64 256"}
ROUNDS=${ROUNDS:-${BENCH_ROUNDS:-5}}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
IDLE_CONNS=${IDLE_CONNS:-10000}
_default_sub=$(for s in $SERVERS; do [[ $s == nginx-static || $s == floor ]] || printf '%s\n' "$s"; done | paste -sd' ')
IDLE_SERVERS=${IDLE_SERVERS:-$_default_sub}
STARTUP_SERVERS=${STARTUP_SERVERS:-$_default_sub}
STARTUP_RUNS=${STARTUP_RUNS:-10}
PARTS=${PARTS:-"load close idle startup"}
CLOSE_CONNS=${CLOSE_CONNS:-256}
CLOSE_SERVERS=${CLOSE_SERVERS:-$(for s in $SERVERS; do [[ $s == floor ]] || printf '%s\n' "$s"; done | paste -sd' ')}
FLOOR=${FLOOR:-1}
FLOOR_DURATION=${FLOOR_DURATION:-1}
FLOOR_WARMUP=${FLOOR_WARMUP:-0}
LOAD_SERVERS=$SERVERS
if ((FLOOR)) && [[ " $SERVERS " != *" floor "* ]]; then LOAD_SERVERS="$SERVERS floor"; fi
ALL_SERVERS="$LOAD_SERVERS $CLOSE_SERVERS $IDLE_SERVERS $STARTUP_SERVERS"
BASE_PORT=${BASE_PORT:-23080}
KHAMSIN_BIN_DEFAULT="$ROOT/build-release/khamsin"
KHAMSIN_BIN=${KHAMSIN_BIN:-$KHAMSIN_BIN_DEFAULT}
SERVER_CORE=${SERVER_CORE:-1}
WRK_CORE=${WRK_CORE:-0}
KEEP_TMP=${KEEP_TMP:-0}
QUIET_WAIT=${QUIET_WAIT:-10}
QUIET_BUDGET=${QUIET_BUDGET:-45}
NOISY_RETRIES=${NOISY_RETRIES:-1}
NOISY_RETRY_BUDGET=${NOISY_RETRY_BUDGET:-5}
if [[ $(id -u) == 0 ]]; then NICE=${NICE:--20}; else NICE=${NICE:-0}; fi
NGX_MODDIR=${NGX_MODDIR:-/usr/lib/nginx/modules}

if [[ ${_KH_INNER:-0} == 1 ]]; then
  TMP=$_KH_TMP
else
  STAMP=$(date +%Y%m%d-%H%M%S)
  RESULT="bench/results/http1-$STAMP.txt"
  mkdir -p bench/results/tmp
  PARTIAL="bench/results/tmp/http1-$STAMP.txt"
  TMP=$(mktemp -d /tmp/khbench.XXXXXX)
fi

port_of() {
  case $1 in
    khamsin) echo $((BASE_PORT + 1)) ;;
    nginx-lua) echo $((BASE_PORT + 2)) ;;
    nginx-static) echo $((BASE_PORT + 3)) ;;
    floor) echo $((BASE_PORT + 4)) ;;
    *) echo "unknown server '$1' (known: khamsin nginx-lua nginx-static floor)" >&2; return 1 ;;
  esac
}

has() { [[ " $1 " == *" $2 "* ]]; }
pkgver() { dpkg-query -W -f='${Package} ${Version}' "$1" 2>/dev/null || echo "$1 ?"; }
libpkg() { # binary pattern -> "lib => debian package version" of the linked library
  local f pkg
  f=$(ldd "$1" 2>/dev/null | awk -v p="$2" '$1 ~ p {print $3; exit}')
  [[ -n $f ]] || { echo "$2: not linked"; return; }
  f=$(readlink -f "$f")
  pkg=$(dpkg -S "$f" 2>/dev/null | head -1 | cut -d: -f1)
  if [[ -n $pkg ]]; then echo "$(basename "$f") ($(pkgver "$pkg"))"; else echo "$f (not from a package)"; fi
}
log() { printf '%s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- servers ---
LIVE=()   # pids of servers we started (roots of their process trees)


cleanup() {
  trap '' PIPE INT TERM HUP
  local p
  for p in "${LIVE[@]}"; do kill_tree "$p" >/dev/null 2>&1; done
  LIVE=()
}

gen_nginx_conf() { # kind dir port
  local kind=$1 dir=$2 port=$3
  if [[ $kind == nginx-lua ]]; then
    nginx_conf "$dir" bench/http1.sh "$NOFILE" "$NGX_WORKER_CONNS" 1 \
      "    listen 127.0.0.1:$port;
    location / { $NGX_HELLO_LUA }"
  else
    nginx_conf "$dir" bench/http1.sh "$NOFILE" "$NGX_WORKER_CONNS" 0 \
      "    listen 127.0.0.1:$port;
    location / { default_type text/plain; return 200 \"Hello, World!\"; }"
  fi
}

server_cmd() { # name port -> prints the command (one word per line)
  local name=$1 port=$2
  case $name in
    khamsin) printf '%s\n' "$KHAMSIN_RUN" --workers 1 --listen "127.0.0.1:$port" --log-level warn bench/apps/hello.lua ;;
    nginx-lua | nginx-static) printf '%s\n' nginx -p "$TMP/$name/" -c "$TMP/$name/nginx.conf" -e "$TMP/$name/error.log" ;;
    floor) printf '%s\n' "$TMP/hello_floor" "$port" ;;
  esac
}

SPID=
start_server() { # name port ; sets SPID
  local name=$1 port=$2 cmd
  mapfile -t cmd < <(server_cmd "$name" "$port")
  taskset -c "$SERVER_CORE" "${cmd[@]}" >>"$TMP/$name.out" 2>>"$TMP/$name.err" &
  SPID=$!
  LIVE+=("$SPID")
  if ! $PY $LIB waitready "$port" "$SPID" 15; then
    echo "--- $name stderr (tail):" >&2; tail -n 20 "$TMP/$name.err" >&2 || true
    [[ -f $TMP/$name/error.log ]] && { echo "--- $name error.log (tail):" >&2; tail -n 20 "$TMP/$name/error.log" >&2; }
    exit 1
  fi
}

stop_server() { # pid
  local p=$1 keep=() x st=0
  if [[ ! -e /proc/$p || $(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) == Z ]]; then
    wait "$p" || st=$?
    fail "server pid $p exited by itself before we stopped it (wait status $st); logs in $TMP"
  fi
  kill_tree "$p"
  for x in "${LIVE[@]}"; do [[ $x == "$p" ]] || keep+=("$x"); done
  LIVE=("${keep[@]}")
}

# check_servers NAME...: start each, check its answer with our own client, stop it.
check_servers() {
  local s port
  for s in "$@"; do
    port=$(port_of "$s")
    start_server "$s" "$port"
    log "  $s: $(tr '\n' ' ' < <(server_cmd "$s" "$port"))"
    $PY $LIB check "$port"
    stop_server "$SPID"
  done
}

# run_windows ROUNDDIR PART CONNS SERVERS [window args...]: the rounds of one part, each server
# in each round at each connection count (a fresh server per window); rows go to $TMP/PART.jsonl,
# discarded noisy windows to $TMP/PART.rejected.jsonl, disturbed rounds to ROUNDDIR/discarded.jsonl.
REDONE=0
run_windows() {
  local rdir=$1 part=$2 conns=$3 servers=$4 r c s port
  shift 4
  mkdir -p "$rdir"
  [[ -f $TMP/waited ]] || : >"$TMP/waited"
  bench_rounds_init "$rdir"
  while bench_round_next; do
    r=$BENCH_ROUND
    for c in $conns; do
      for s in $servers; do
        port=$(port_of "$s")
        local attempt=0 wrc qw retry dur=$DURATION wu=$WARMUP
        if [[ $s == floor ]]; then dur=$FLOOR_DURATION wu=$FLOOR_WARMUP; fi
        while :; do
          attempt=$((attempt + 1))
          qw=$(awk -v b="$QUIET_BUDGET" -v w="$QUIET_WAIT" '{t += $1} END {r = b - t; if (r < 0) r = 0; print (r < w ? r : w)}' "$TMP/waited" 2>/dev/null || echo "$QUIET_WAIT")
          retry=$((attempt <= NOISY_RETRIES && REDONE < NOISY_RETRY_BUDGET ? 1 : 0))
          start_server "$s" "$port"
          wrc=0
          $PY $LIB window --name "$s" --port "$port" --root "$SPID" --conns "$c" --round "$r" \
            --duration "$dur" --warmup "$wu" --wrk-core "$WRK_CORE" \
            --server-core "$SERVER_CORE" --quiet-wait "$qw" --waited-log "$TMP/waited" \
            --tsv "$TMP/$part.jsonl" --retry-noisy "$retry" --rejected "$TMP/$part.rejected.jsonl" \
            --rawlog "$TMP/wrk-raw.txt" "$@" || wrc=$?
          stop_server "$SPID"
          if ((wrc == 3)); then REDONE=$((REDONE + 1)); continue; fi
          ((wrc == 0)) || exit "$wrc"
          break
        done
      done
    done
    bench_round_end || true
  done
}

# part_report PART SERVERS LABEL: after a part's rounds: the noisy-window note, the per-window
# table, and the method's summary (vs nginx + lua, and vs nginx static when it ran)
part_report() {
  local part=$1 servers=$2 label=$3
  log ""
  if [[ -s $TMP/$part.rejected.jsonl ]]; then
    log "($(wc -l <"$TMP/$part.rejected.jsonl") noisy window(s) were discarded and redone; their data is in the appendix)"
  fi
  $PY $LIB report "$TMP/$part.jsonl"
  log ""
  bench_summary "$TMP/$part.jsonl" --metric req_per_cpu --metric rps --metric p99_ms --lower p99_ms \
    --group conns --label "$label"
  if has "$servers" nginx-static; then
    bench_summary "$TMP/$part.jsonl" --metric req_per_cpu --group conns --anchor nginx-static \
      --label "$label vs nginx static"
  fi
  if has "$servers" floor; then # the ceiling: the floor responder over nginx + lua (its column is the floor's)
    bench_summary "$TMP/$part.jsonl" --metric req_per_cpu --group conns \
      --subject floor --label "$label: floor (C responder, bench/lib/hello_floor.c) in the khamsin column"
  fi
  log ""
}

# ------------------------------------------------------------------- main ---
main() {
  echo $$ >"$TMP/inner.pid"
  trap cleanup EXIT
  trap 'exit 130' INT TERM HUP

  local s c r port
  for s in $ALL_SERVERS; do port_of "$s" >/dev/null; done
  for tool in wrk nginx taskset curl lscpu; do command -v $tool >/dev/null || fail "missing tool: $tool (apt-get install -y ...)"; done
  [[ -x $PY ]] || fail "missing $PY"
  (($(nproc) >= 2)) || fail "need >= 2 cores (server on core $SERVER_CORE, wrk on core $WRK_CORE)"
  if has "$ALL_SERVERS" nginx-lua; then
    [[ -f $NGX_MODDIR/ngx_http_lua_module.so && -f $NGX_MODDIR/ndk_http_module.so ]] ||
      fail "nginx lua modules not in $NGX_MODDIR (apt-get install -y libnginx-mod-http-lua, or set NGX_MODDIR)"
  fi

  # fds: 10k idle connections need > 10k fds in the servers and in the client
  local hard
  hard=$(ulimit -Hn)
  [[ $hard == unlimited ]] && hard=1048576
  NOFILE=$((hard < 65536 ? hard : 65536))
  ulimit -n "$NOFILE" || fail "cannot raise RLIMIT_NOFILE to $NOFILE"
  NGX_WORKER_CONNS=$((NOFILE - 100 < 20000 ? NOFILE - 100 : 20000))
  if has "$PARTS" idle && [[ -n ${IDLE_SERVERS// /} ]] && ((NOFILE < IDLE_CONNS + 200)); then
    fail "RLIMIT_NOFILE hard limit $hard is too low for IDLE_CONNS=$IDLE_CONNS"
  fi

  # khamsin binary
  # the default binary is always brought up to date (a no-op when it is): no figure from a stale build
  if has "$ALL_SERVERS" khamsin && [[ $KHAMSIN_BIN == "$KHAMSIN_BIN_DEFAULT" || ! -x $KHAMSIN_BIN ]]; then
    [[ $KHAMSIN_BIN == "$KHAMSIN_BIN_DEFAULT" ]] || fail "KHAMSIN_BIN=$KHAMSIN_BIN not found"
    [[ ${BENCH_BUILT:-0} == 1 ]] || log "building khamsin (Release) into build-release/ ..."
    BENCH_BUILD_LOG=$TMP/build.log bench_build_release || { tail -n 40 "$TMP/build.log" >&2; fail "khamsin build failed"; }
    [[ -x $KHAMSIN_BIN ]] || fail "build finished but $KHAMSIN_BIN does not exist"
  fi
  # run a private copy: a rebuild of build-release/ during the run must not change what we measure
  # (khamsin finds its Lua modules by the compiled-in source path, so the copy behaves the same;
  # the TLS module khamsin-tls.so, looked for next to the binary, is copied along)
  KHAMSIN_RUN="$TMP/khamsin"
  if has "$ALL_SERVERS" floor; then
    command -v cc >/dev/null || fail "missing tool: cc (the floor responder is built with it; FLOOR=0 leaves it out)"
    cc -O2 -o "$TMP/hello_floor" bench/lib/hello_floor.c || fail "cannot build bench/lib/hello_floor.c"
  fi
  if [[ -x $KHAMSIN_BIN ]]; then cp "$KHAMSIN_BIN" "$KHAMSIN_RUN"; fi
  if [[ -f ${KHAMSIN_BIN%/*}/khamsin-tls.so ]]; then cp "${KHAMSIN_BIN%/*}/khamsin-tls.so" "$TMP/"; fi

  # From here on everything (servers, wrk, python helpers) inherits the priority, and the
  # orchestration runs on the client core; servers re-pin themselves to SERVER_CORE.
  # We run in our own session (see run_all), so with sched_autogroup our session's autogroup
  # contains only this benchmark: its nice is what counts against other sessions' tasks.
  if ((NICE != 0)); then
    renice -n "$NICE" -p $$ >/dev/null || fail "renice $NICE failed (set NICE=0)"
    if [[ $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null) == 1 && -w /proc/$$/autogroup ]]; then
      echo "$NICE" >"/proc/$$/autogroup" || fail "cannot set autogroup nice (set NICE=0)"
    fi
  fi
  taskset -p -c "$WRK_CORE" $$ >/dev/null

  # ports
  local ports=()
  for s in $(printf '%s\n' $ALL_SERVERS | sort -u); do ports+=("$(port_of "$s")"); done
  $PY $LIB portfree "${ports[@]}" || fail "refusing to run: a port is busy (set BASE_PORT)"

  for s in nginx-lua nginx-static; do gen_nginx_conf "$s" "$TMP/$s" "$(port_of $s)"; done

  # ---- header
  local nwin=0 est
  for s in $SERVERS; do nwin=$((nwin + 1)); done
  nwin=$((nwin * ROUNDS * $(wc -w <<<"$CONNS")))
  est=$((nwin * (DURATION + WARMUP + 1)))
  [[ $LOAD_SERVERS == "$SERVERS" ]] || est=$((est + ROUNDS * $(wc -w <<<"$CONNS") * (FLOOR_DURATION + FLOOR_WARMUP + 1)))
  log "# khamsin bench: HTTP/1.1 keep-alive GET /, 13-byte body"
  log "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  log "command:  SERVERS=\"$SERVERS\" CONNS=\"$CONNS\" ROUNDS=$ROUNDS DURATION=$DURATION WARMUP=$WARMUP IDLE_CONNS=$IDLE_CONNS IDLE_SERVERS=\"$IDLE_SERVERS\" STARTUP_RUNS=$STARTUP_RUNS STARTUP_SERVERS=\"$STARTUP_SERVERS\" CLOSE_CONNS=$CLOSE_CONNS CLOSE_SERVERS=\"$CLOSE_SERVERS\" FLOOR=$FLOOR FLOOR_DURATION=$FLOOR_DURATION FLOOR_WARMUP=$FLOOR_WARMUP PARTS=\"$PARTS\" BASE_PORT=$BASE_PORT $CMDLINE"
  local dirty
  dirty=$(git status --porcelain -- core lua CMakeLists.txt cmake 2>/dev/null | wc -l)
  log "git:      $(git rev-parse --short HEAD) ($dirty uncommitted change(s) under core/ lua/ cmake/ CMakeLists.txt)"
  if has "$ALL_SERVERS" khamsin; then
    log "khamsin:  $KHAMSIN_BIN (mtime $(date -u -r "$KHAMSIN_BIN" +%Y-%m-%dT%H:%M:%SZ), sha256 $(sha256sum "$KHAMSIN_RUN" | cut -c1-16)), run from a copy in the temp dir; $("$KHAMSIN_RUN" --version 2>&1 | head -1)"
  fi
  bench_method_line
  log "kernel:   $(uname -srm), $(zcat /proc/config.gz 2>/dev/null | grep -E '^CONFIG_(HZ|TICK_CPU_ACCOUNTING|IRQ_TIME_ACCOUNTING|VIRT_CPU_ACCOUNTING_GEN)=' | paste -sd' ' || echo 'config n/a'), autogroup $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo n/a)"
  log "wrk:      $(wrk -v 2>&1 | head -1 | sed 's/ Copyright.*//')"
  log "nginx:    $(nginx -v 2>&1 | sed 's/^nginx version: //'), lua module $(pkgver libnginx-mod-http-lua), $(libpkg "$NGX_MODDIR/ngx_http_lua_module.so" luajit)"
  if has "$ALL_SERVERS" khamsin; then
    # KH_STATIC_DEPS (the default) links LuaJIT and libuv into the binary: name the -dev package
    local kl
    kl=$(libpkg "$KHAMSIN_BIN" luajit); [[ $kl == *"not linked"* ]] && kl="luajit: static, $(pkgver libluajit2-5.1-dev)"
    log "khamsin libs: $kl, $(l=$(libpkg "$KHAMSIN_BIN" libuv); [[ $l == *"not linked"* ]] && l="libuv: static, $(pkgver libuv1-dev)"; echo "$l")"
  fi
  log "python:   $($PY --version 2>&1)"
  log "pinning:  servers taskset -c $SERVER_CORE, wrk / clients / this script on core $WRK_CORE; all at nice $NICE (also the nice of this run's own session autogroup); RLIMIT_NOFILE $NOFILE; nginx worker_connections $NGX_WORKER_CONNS"
  log "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg) (at start); before each window waits up to ${QUIET_WAIT}s (${QUIET_BUDGET}s per run) for other tasks <= 5% per core; a window where server or wrk waited >5% of it for a CPU (run delay, /proc/*/schedstat) is redone up to $NOISY_RETRIES time(s) ($NOISY_RETRY_BUDGET per run), then kept and flagged NOISY"
  log ""

  # ---- 0. start-up, first: after the idle part's 10,000 connections (TIME_WAIT sockets, memory
  # reclaim) every exec on this VM is slower for a while (/bin/true 2.2 -> 3.1 ms, measured), which
  # would charge the host's recovery to the server under test
  if has "$PARTS" startup && [[ -n ${STARTUP_SERVERS// /} ]]; then
    log "## Start-up: exec of the server (pinned to core $SERVER_CORE) -> first 200 'Hello, World!', polled every 0.2 ms from core $WRK_CORE; $STARTUP_RUNS runs"
    log "   floor: exec -> exit of /bin/true, spawned and polled the same way (what any exec costs on this machine)"
    $PY $LIB startup-floor --name "floor" --runs "$STARTUP_RUNS" --server-core "$SERVER_CORE" \
      --client-core "$WRK_CORE" --json "$TMP/startup.jsonl" -- /bin/true
    for s in $STARTUP_SERVERS; do
      port=$(port_of "$s")
      local cmd
      mapfile -t cmd < <(server_cmd "$s" "$port")
      $PY $LIB startup --name "$s" --port "$port" --runs "$STARTUP_RUNS" --server-core "$SERVER_CORE" \
        --client-core "$WRK_CORE" --log "$TMP/startup-$s.log" --json "$TMP/startup.jsonl" -- "${cmd[@]}"
    done
    log ""
  fi

  # ---- 1. load (keep-alive)
  if has "$PARTS" load; then
    log "## Load: wrk -t1 keep-alive GET /, ${DURATION}s windows after ${WARMUP}s warm-up, fresh server start per window, order per round: $(echo $LOAD_SERVERS)"
    if [[ $LOAD_SERVERS != "$SERVERS" ]]; then
      log "   floor: bench/lib/hello_floor.c (epoll, one read + one write of a fixed 200 'Hello, World!' a request, no parsing, no Date), ${FLOOR_DURATION}s windows after ${FLOOR_WARMUP}s warm-up: the ceiling of req per server CPU-s on this box"
    fi
    log "   server CPU = delta of utime+stime (/proc/<pid>/stat) over the server's process tree during the measured window; req/CPU-s = wrk's request count / that"
    log "   (about $est s)"
    check_servers $LOAD_SERVERS
    run_windows "$TMP" load "$CONNS" "$LOAD_SERVERS"
    part_report load "$LOAD_SERVERS" "http1 hello keep-alive"
  fi

  # ---- 2. a new connection per request
  if has "$PARTS" close && [[ -n ${CLOSE_SERVERS// /} ]]; then
    log "## New connection per request: wrk -t1 -c$CLOSE_CONNS -H 'Connection: close' GET / (wrk reads each response, closes, connects again), ${DURATION}s windows after ${WARMUP}s warm-up, fresh server start per window, order per round: $(echo $CLOSE_SERVERS)"
    log "   each request pays for accept, the close and the TCP handshakes; server CPU and req/CPU-s as in the load part (1 request = 1 connection)"
    has "$PARTS" load || check_servers $CLOSE_SERVERS
    run_windows "$TMP/close" close "$CLOSE_CONNS" "$CLOSE_SERVERS" --header "Connection: close"
    part_report close "$CLOSE_SERVERS" "http1 hello Connection: close"
  fi

  # ---- 3. memory per idle keep-alive connection
  if has "$PARTS" idle && [[ -n ${IDLE_SERVERS// /} ]]; then
    log "## Memory per idle keep-alive connection: $IDLE_CONNS connections, one GET each (full response read), then idle"
    log "   PSS = sum of Pss in /proc/<pid>/smaps_rollup over the server's processes, before (after a 1 s wrk -c64 warm-up) and 1 s after the last response"
    log "   (kernel socket buffers are not process memory and are not counted; the loopback client runs on the same machine, on core $WRK_CORE)"
    for s in $IDLE_SERVERS; do
      port=$(port_of "$s")
      start_server "$s" "$port"
      local wout
      wout=$(taskset -c "$WRK_CORE" wrk -t1 -c64 -d1s "http://127.0.0.1:$port/")
      if grep -qE 'Socket errors|Non-2xx' <<<"$wout"; then printf '%s\n' "$wout"; fail "$s: errors during the idle test's warm-up"; fi
      sleep 0.5
      $PY $LIB idle --name "$s" --port "$port" --root "$SPID" --n "$IDLE_CONNS" --client-core "$WRK_CORE" --json "$TMP/idle.jsonl"
      stop_server "$SPID"
    done
    log ""
  fi

  log "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg) (at end; other work on the box shows here)"
  local e
  for s in nginx-lua nginx-static; do
    e="$TMP/$s/error.log"
    if [[ -s $e ]] && grep -qv '\[notice\]' "$e"; then log "note: $s error.log is not empty:"; grep -v '\[notice\]' "$e" | tail -n 5; fi
  done
}

# ------------------------------------------------- run, tee, save results ---
run_all() {
  # main runs in a new session (setsid): its own process group and sched autogroup. Ctrl-C
  # reaches only this outer shell, which sends TERM to that group; main's traps stop servers.
  export _KH_INNER=1 _KH_TMP=$TMP _KH_CMDLINE=$CMDLINE
  { st=0; setsid "$BASH" "$SCRIPT" "$@" 2>&1 || st=$?; echo "$st" >"$TMP/rc"; } | tee "$PARTIAL" &
  local pipe=$! st
  trap 'echo "interrupted" >&2; [[ -s $TMP/inner.pid ]] && kill -TERM -- "-$(cat "$TMP/inner.pid")" 2>/dev/null' INT TERM HUP
  set +e
  while :; do
    wait "$pipe"; st=$?
    ((st > 128)) && kill -0 "$pipe" 2>/dev/null && continue # a trapped signal interrupted wait
    break
  done
  rc=$(cat "$TMP/rc" 2>/dev/null || echo 1)
  set -e
  {
    echo
    echo "## Appendix: raw wrk output of every measured window"
    if [[ -f $TMP/wrk-raw.txt ]]; then cat "$TMP/wrk-raw.txt"; fi
    for f in "$TMP"/load.jsonl "$TMP"/discarded.jsonl "$TMP"/load.rejected.jsonl "$TMP"/close.jsonl \
      "$TMP"/close/discarded.jsonl "$TMP"/close.rejected.jsonl "$TMP"/idle.jsonl "$TMP"/startup.jsonl; do
      if [[ -f $f ]]; then echo "## Appendix: ${f#"$TMP"/}"; cat "$f"; fi
    done
  } >>"$PARTIAL"
  if ((rc == 0)); then
    mv "$PARTIAL" "$RESULT"
    echo "results written to $RESULT"
  else
    mv "$PARTIAL" "bench/results/tmp/http1-$STAMP.FAILED.txt"
    echo "FAILED (exit $rc); output kept in bench/results/tmp/http1-$STAMP.FAILED.txt, temp dir $TMP" >&2
    KEEP_TMP=1
  fi
  if ((KEEP_TMP == 0)); then rm -rf "$TMP"; fi
  return "$rc"
}
# (the whole file is parsed before anything runs: editing the script during a run is safe)
if [[ ${_KH_INNER:-0} == 1 ]]; then main; exit $?; else run_all "$@"; exit $?; fi
