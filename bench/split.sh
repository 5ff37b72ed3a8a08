#!/usr/bin/env bash
# bench/split.sh - keep-alive hello (issue 15 item 3): where each server's CPU per request goes.
# For khamsin and nginx + lua, with wrk -t1 -cN pinned to the other core, per request:
#   cpu       user and system CPU (utime / stime of /proc/<pid>/stat over the server's process
#             tree; tick-sampled at HZ, so a window needs thousands of ticks), TCP segments both
#             ways and pure ACKs (/proc/net/snmp, /proc/net/netstat), wrk's p99;
#   syscalls  every syscall the server makes (perf stat -e 'syscalls:sys_enter_*', tracepoint
#             counts, far lighter than strace) and the events per epoll_wait (the returns of
#             sys_exit_epoll_wait / epoll_pwait, perf record);
#   kernel    the top kernel symbols of the server core (perf record -e cpu-clock -C core);
#   tail      what could put a tail on the latency, per server: the time from each epoll_wait's
#             return to the next call (a batch of ready connections served), the events per batch,
#             and for khamsin each LuaJIT GC step (uprobes on lj_gc_step, lj_gc_step_jit);
#             intervals in which the server was switched out are left out (bench/lib/epolltail.py).
# The whole run is in a network namespace of its own (unshare -n, root), so the TCP counters
# are this run's traffic only. Under load the absolute figures drift; the user/system split and
# the ratio of one server's system time to the other's total per request are what it is for: if
# khamsin's system time per request S_k and nginx's total T_n give T_n / S_k < 1.3, then 1.3x nginx
# + lua per CPU-second cannot be reached even with no user time at all.
#
#   bench/split.sh                                # ~1.5 min: ROUNDS=3, 5 s windows, CONNS "64 256"
#   PARTS=cpu ROUNDS=5 bench/split.sh
#   APP=bench/apps/hello_headers.lua NGX_LUA="$(sed -n 's/^-- nginx: //p' bench/apps/hello_headers.lua)" bench/split.sh
# Knobs: SERVERS ("khamsin nginx-lua"; "floor" adds bench/lib/hello_floor.c, bench/http1.sh's
#   floor: what a server that does no HTTP work costs per request here), CONNS, ROUNDS (3;
#   servers alternate in each round), DURATION (5 s), WARMUP (1 s), PARTS ("cpu syscalls kernel tail"), KHAMSIN_BIN
#   (build-release/khamsin), APP (bench/apps/hello.lua), NGX_LUA (bench/lib/common.sh's hello),
#   PORT (23390), SERVER_CORE (1), WRK_CORE (0), TOP (15 kernel symbols).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=/usr/bin/python3
. bench/lib/common.sh
BIN=${KHAMSIN_BIN:-build-release/khamsin}
SERVERS=${SERVERS:-"khamsin nginx-lua"}
CONNS=${CONNS:-"64 256"}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-1}
PARTS=${PARTS:-"cpu syscalls kernel tail"}
APP=${APP:-bench/apps/hello.lua}
NGX_LUA=${NGX_LUA:-$NGX_HELLO_LUA}
NGX_MODDIR=${NGX_MODDIR:-/usr/lib/nginx/modules}
PORT=${PORT:-23390}
SERVER_CORE=${SERVER_CORE:-1}
WRK_CORE=${WRK_CORE:-0}
TOP=${TOP:-15}
for t in wrk nginx perf taskset unshare ip curl; do command -v $t >/dev/null || { echo "needs $t" >&2; exit 1; }; done
[[ $(id -u) == 0 ]] || { echo "bench/split.sh needs root (unshare -n, perf)" >&2; exit 1; }
if [[ -z ${_KH_NETNS:-} ]]; then
  exec unshare -n env _KH_NETNS=1 "$0" "$@"
fi
ip link set lo up
TMP=$(mktemp -d)
SPID=
PROBES=0
cleanup() {
  [[ -n $SPID ]] && kill_tree "$SPID"
  ((PROBES)) && perf probe -q -d 'probe_khamsin:*' >/dev/null 2>&1
  rm -rf "$TMP"
}
trap cleanup EXIT
HZ=$(getconf CLK_TCK)

start() { # server -> SPID; the server answers on PORT
  case $1 in
  khamsin)
    taskset -c "$SERVER_CORE" "$BIN" --workers 1 --listen "127.0.0.1:$PORT" --log-level warn "$APP" \
      >"$TMP/khamsin.log" 2>&1 &
    SPID=$! ;;
  nginx-lua)
    rm -rf "$TMP/ngx"
    nginx_conf "$TMP/ngx" bench/split.sh "$(ulimit -n)" 20000 1 "    listen 127.0.0.1:$PORT;
    location / { $NGX_LUA }"
    taskset -c "$SERVER_CORE" nginx -p "$TMP/ngx/" -c "$TMP/ngx/nginx.conf" -e "$TMP/ngx/error.log" &
    SPID=$! ;;
  floor) # bench/http1.sh's floor: epoll, one read and one fixed write a request, nothing else
    [[ -x $TMP/hello_floor ]] || cc -O2 -o "$TMP/hello_floor" bench/lib/hello_floor.c
    taskset -c "$SERVER_CORE" "$TMP/hello_floor" "$PORT" &
    SPID=$! ;;
  *) echo "unknown server $1" >&2; exit 1 ;;
  esac
  local i
  for ((i = 0; i < 200; i++)); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/" 2>/dev/null) == 200 ]] && return 0
    sleep 0.05
  done
  echo "$1 did not answer" >&2; exit 1
}
stop() { kill_tree "$SPID"; SPID=; }
tree() { $PY bench/lib/benchlib.py tree "$SPID"; }
# the busy process: khamsin's one process, nginx's worker (the master's child)
busy_pid() { if [[ $1 == nginx-lua ]]; then pgrep -P "$SPID" | head -1; else echo "$SPID"; fi; }
ticks() { # utime stime summed over the server's tree (all threads)
  local p u=0 s=0 a b
  for p in $(tree); do
    read -r a b < <(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12, $13}')
    u=$((u + a)); s=$((s + b))
  done
  echo "$u $s"
}
tcp() { # OutSegs PureAcks(received, TcpExt TCPPureAcks) DelayedACKs
  awk '/^Tcp: [0-9]/ {o = $12} END {print o}' /proc/net/snmp | tr '\n' ' '
  awk '/^TcpExt: [A-Za-z]/ {for (i = 2; i <= NF; i++) n[i] = $i; next}
       /^TcpExt: [0-9]/ {for (i = 2; i <= NF; i++) v[n[i]] = $i}
       END {print v["TCPPureAcks"] + 0, v["DelayedACKs"] + 0}' /proc/net/netstat
}
load() { # conns seconds -> wrk's output
  taskset -c "$WRK_CORE" wrk -t1 -c"$1" -d"$2s" --latency "http://127.0.0.1:$PORT/"
}
p99_of() { awk '$1 == "99%" {print $2}'; }
reqs_of() { awk '/requests in/ {print $1}'; }

echo "# bench/split.sh: $(date -u +%FT%TZ), git $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), kernel $(uname -r), HZ $HZ"
echo "# SERVERS='$SERVERS' CONNS='$CONNS' ROUNDS=$ROUNDS DURATION=$DURATION WARMUP=$WARMUP APP=$APP PARTS='$PARTS' load at start: $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ " $PARTS " == *" cpu "* ]]; then
  echo
  echo "## CPU per request (us), user / system / total, TCP segments (both ways) and pure ACKs per request, p99"
  printf '%-10s %5s %5s %9s %8s %8s %8s %7s %7s %9s %7s\n' server conns round requests user sys total sys% segs pureack p99
  rows=$TMP/rows
  : >"$rows"
  for ((r = 1; r <= ROUNDS; r++)); do
    for c in $CONNS; do
      for s in $SERVERS; do
        start "$s"
        load "$c" "$WARMUP" >/dev/null
        read -r u0 s0 < <(ticks)
        read -r o0 pa0 da0 < <(tcp)
        out=$(load "$c" "$DURATION")
        read -r u1 s1 < <(ticks)
        read -r o1 pa1 da1 < <(tcp)
        stop
        n=$(reqs_of <<<"$out"); p99=$(p99_of <<<"$out")
        awk -v s="$s" -v c="$c" -v r="$r" -v n="$n" -v du=$((u1 - u0)) -v ds=$((s1 - s0)) -v hz="$HZ" \
          -v o=$((o1 - o0)) -v pa=$((pa1 - pa0)) -v p99="$p99" 'BEGIN {
            us = du / hz * 1e6 / n; ss = ds / hz * 1e6 / n
            printf "%-10s %5d %5d %9d %8.3f %8.3f %8.3f %6.1f%% %7.3f %9.4f %7s\n", s, c, r, n, us, ss, us + ss, 100 * ss / (us + ss), o / n, pa / n, p99
          }' | tee -a "$rows"
      done
    done
  done
  echo
  echo "## medians over rounds (us per request) and the bound"
  for c in $CONNS; do
    for s in $SERVERS; do
      awk -v s="$s" -v c="$c" '$1 == s && $2 == c {print $5, $6, $7, $9}' "$rows" |
        $PY -c 'import sys, statistics as st
rows = [list(map(float, l.split())) for l in sys.stdin]
m = [st.median(r[i] for r in rows) for i in range(4)]
print("'"$s"' '"$c"' %.3f %.3f %.3f %.3f" % tuple(m))'
    done
  done | tee "$TMP/med" | awk '{printf "%-10s c%-4s user %.3f sys %.3f total %.3f segs %.3f\n", $1, $2, $3, $4, $5, $6}'
  for c in $CONNS; do
    awk -v c="$c" '$2 == c {u[$1] = $3; s[$1] = $4; t[$1] = $5}
      END {if (("khamsin" in t) && ("nginx-lua" in t))
        printf "c%s: nginx+lua total / khamsin total = x%.2f (per CPU-s); nginx+lua total / khamsin sys = x%.2f (the ceiling at zero user time); nginx sys / khamsin sys = %.2f\n",
          c, t["nginx-lua"] / t["khamsin"], t["nginx-lua"] / s["khamsin"], s["nginx-lua"] / s["khamsin"]
        if (("floor" in t) && ("nginx-lua" in t))
          printf "c%s: nginx+lua total / floor total = x%.2f; 1.3x nginx+lua is %.3f us a request in all\n", c, t["nginx-lua"] / t["floor"], t["nginx-lua"] / 1.3}' "$TMP/med"
  done
fi

if [[ " $PARTS " == *" syscalls "* ]]; then
  echo
  echo "## syscalls per request (perf stat -e 'syscalls:sys_enter_*' on the busy process, ${DURATION} s of wrk) and events per epoll_wait"
  for c in $CONNS; do
    for s in $SERVERS; do
      start "$s"
      load "$c" "$WARMUP" >/dev/null
      bp=$(busy_pid "$s")
      # perf's windows enclose wrk's (started 0.2 s after, ended before): every request counted
      perf stat -x, -e 'syscalls:sys_enter_*' -p "$bp" -o "$TMP/pstat" -- sleep "$((DURATION + 1))" &
      ppid=$!
      sleep 0.2
      out=$(load "$c" "$DURATION")
      wait "$ppid" || true
      n=$(reqs_of <<<"$out")
      perf record -q -e syscalls:sys_exit_epoll_wait -e syscalls:sys_exit_epoll_pwait -p "$bp" -o "$TMP/perf.ep" -- sleep 2 >/dev/null 2>&1 &
      ppid=$!
      sleep 0.2
      load "$c" 1 >/dev/null
      wait "$ppid" || true
      stop
      # per thread: the busy one is the loop under load (khamsin's main thread only supervises)
      batch=$(perf script -F tid,trace -i "$TMP/perf.ep" 2>/dev/null | $PY -c 'import sys, collections
per = collections.defaultdict(list)
for l in sys.stdin:
    f = l.split()
    if len(f) >= 2:
        v = int(f[-1], 16)
        if v < 1 << 63: per[f[0]].append(v)  # not an error return
if per:
    tid, v = max(per.items(), key=lambda kv: len(kv[1]))
    print("%.1f events per epoll_wait over %d calls (thread %s); %.0f%% of them returned one event" % (sum(v) / len(v), len(v), tid, 100.0 * sum(1 for x in v if x == 1) / len(v)))
else:
    print("no epoll_wait seen")')
      echo "### $s -c$c: $n requests; $batch"
      awk -F, -v n="$n" '$1 ~ /^[0-9]+$/ && $1 > 0 {sub("syscalls:sys_enter_", "", $3); printf "  %-18s %10d  %.4f per request\n", $3, $1, $1 / n}' "$TMP/pstat" | sort -k3 -nr
    done
  done
fi

if [[ " $PARTS " == *" kernel "* ]]; then
  echo
  echo "## the server core under load (perf record -e cpu-clock -C $SERVER_CORE, -c${CONNS##* }, ${DURATION} s): user/kernel share of the busy process and its top kernel symbols"
  c=${CONNS##* }
  for s in $SERVERS; do
    start "$s"
    load "$c" "$WARMUP" >/dev/null
    bp=$(busy_pid "$s")
    perf record -q -e cpu-clock -C "$SERVER_CORE" -o "$TMP/perf.k" -- sleep "$DURATION" >/dev/null 2>&1 &
    ppid=$!
    load "$c" "$DURATION" >/dev/null
    wait "$ppid" || true
    stop
    echo "### $s: user / kernel share of its samples, then its top kernel symbols (% of its samples)"
    perf report -i "$TMP/perf.k" --stdio --pid "$bp" --percentage relative --sort sym 2>/dev/null |
      grep -E '^ +[0-9.]+%' >"$TMP/syms" || true
    awk '{gsub("%", "", $1); if ($2 == "[k]") k += $1; else u += $1}
      END {printf "  user %.1f%%, kernel %.1f%%\n", u, k}' "$TMP/syms"
    grep '\[k\]' "$TMP/syms" | head -"$TOP" || true
  done
fi

if [[ " $PARTS " == *" tail "* ]]; then
  echo
  echo "## tail: per batch of ready connections (epoll_wait return -> next call) and per GC step, us (perf record, ${DURATION} s of wrk)"
  # uprobes on the GC entry points (the binary has its symbols), made here and removed at exit
  gcprobes=0
  if [[ " $SERVERS " == *" khamsin "* ]]; then
    if perf probe -l 2>/dev/null | grep -q 'probe_khamsin:lj_gc_step_jit__return'; then
      gcprobes=1 # already there (not ours: left in place)
    elif perf probe -q -x "$(readlink -f "$BIN")" -a lj_gc_step -a lj_gc_step%return \
        -a lj_gc_step_jit -a lj_gc_step_jit%return >/dev/null 2>&1; then
      gcprobes=1 PROBES=1
    else
      echo "(no uprobes on $BIN: GC steps not timed)"
    fi
  fi
  for c in $CONNS; do
    for s in $SERVERS; do
      start "$s"
      load "$c" "$WARMUP" >/dev/null
      bp=$(busy_pid "$s")
      ev=(-e syscalls:sys_exit_epoll_wait -e syscalls:sys_enter_epoll_wait -e sched:sched_switch)
      if [[ $s == khamsin ]] && ((gcprobes)); then
        ev+=(-e probe_khamsin:lj_gc_step -e probe_khamsin:lj_gc_step__return -e probe_khamsin:lj_gc_step_jit -e probe_khamsin:lj_gc_step_jit__return)
      fi
      perf record -q "${ev[@]}" -p "$bp" -o "$TMP/perf.tail" -- sleep "$((DURATION + 1))" >/dev/null 2>&1 &
      ppid=$!
      sleep 0.2
      out=$(load "$c" "$DURATION")
      wait "$ppid" || true
      stop
      echo "### $s -c$c: $(reqs_of <<<"$out") requests, wrk p99 $(p99_of <<<"$out") (wrk's, with the tracing on)"
      perf script -F tid,time,event,trace -i "$TMP/perf.tail" 2>/dev/null | $PY bench/lib/epolltail.py
    done
  done
fi
