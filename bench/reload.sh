#!/usr/bin/env bash
# bench/reload.sh - hot reload (issue 11), on the release build:
#   1. save-to-first-new-answer: khamsin --dev serves a copy of examples/hello.lua; a prober
#      GETs / on a keep-alive connection while the file is saved (renamed over, as editors do)
#      with a new greeting, ROUNDS_SAVE times; ms from the save to the first new answer.
#   2. the cost of reloading under load: wrk -c$CONNS on / for DURATION s, alternating windows
#      without reloads and with a SIGHUP (a full reload of the app) every HUP_MS ms, on the
#      noisy-box method of bench/lib/common.sh (ROUNDS kept rounds, disturbed ones discarded and
#      redone); req/s, server CPU per request (/proc/PID/stat) and the per-round ratio.
#   3. the memory of an idle old instance: N reloads, each leaving the old instance alive,
#      held by one deferred reply nobody answers; RSS before, while held, after they close.
# Server pinned to SERVER_CORE, wrk to WRK_CORE. The box is shared with other runs: the ratios
# measured in the same run are the figures to read, not the absolute req/s.
#
#   bench/reload.sh                 # ~2 min; result in bench/results/reload-<stamp>.txt
# Env: DURATION=4 ROUNDS=5 CONNS=64 HUP_MS=100 ROUNDS_SAVE=10 N_IDLE=20 SERVER_CORE=1
#      WRK_CORE=0 PORT=24180 KHAMSIN_BIN=build-release/khamsin
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=/usr/bin/python3
. bench/lib/common.sh
LIB=bench/lib/reloadbench.py
DURATION=${DURATION:-4}
CONNS=${CONNS:-64}
HUP_MS=${HUP_MS:-100}
ROUNDS_SAVE=${ROUNDS_SAVE:-10}
N_IDLE=${N_IDLE:-20}
PORT=${PORT:-24180}
bench_knobs
bench_paths reload
OUT=$RESULT
bench_pids_trap

if [[ $KHAMSIN_BIN == "$KHAMSIN_BIN_DEFAULT" || ! -x $KHAMSIN_BIN ]]; then bench_build_release khamsin; fi

exec > >(tee "$OUT") 2>&1
echo "# bench/reload.sh $STAMP"
echo "# command: ${BASH_SOURCE[0]} (DURATION=$DURATION ROUNDS=$ROUNDS CONNS=$CONNS HUP_MS=$HUP_MS ROUNDS_SAVE=$ROUNDS_SAVE N_IDLE=$N_IDLE SERVER_CORE=$SERVER_CORE WRK_CORE=$WRK_CORE)"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (the machine is shared with other helpers' builds and tests: absolute figures are noisy, read the same-run ratios)"
bench_method_line
echo "# machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -r)"
echo "# khamsin: $KHAMSIN_BIN ($(git rev-parse --short HEAD 2>/dev/null)), $(wrk --version 2>&1 | head -1 | cut -c1-40)"

start() { # app args... -> SPID
  local app=$1; shift
  taskset -c "$SERVER_CORE" "$KHAMSIN_BIN" --workers 1 --listen "127.0.0.1:$PORT" \
    --slice-warn-ms 0 "$@" "$app" >>"$TMP/khamsin.log" 2>&1 &
  SPID=$!
  PIDS+=("$SPID")
  $PY $LIB ready "$PORT" 10 || { cat "$TMP/khamsin.log"; exit 1; }
}
stop() { kill -TERM "$1"; wait "$1" 2>/dev/null || true; }

echo
echo "## 1. save -> first new answer (--dev, examples/hello.lua, $ROUNDS_SAVE saves)"
cp examples/hello.lua "$TMP/hello.lua"
start "$TMP/hello.lua" --dev --log-level warn
$PY $LIB savetime "$PORT" "$TMP/hello.lua" "$ROUNDS_SAVE" | tee "$TMP/save.txt"
stop "$SPID"
read -r _ s_med s_min s_max _ s_failed < <(grep '^savetime' "$TMP/save.txt")

echo
echo "## 2. req/s under load, without reloads and with a SIGHUP every $HUP_MS ms (wrk -c$CONNS, ${DURATION}s windows, alternating)"
cp examples/hello.lua "$TMP/hello2.lua"
start "$TMP/hello2.lua" --log-level info
$PY $LIB window "$SPID" "$PORT" 1 "$WRK_CORE" "$CONNS" 0 >/dev/null # warm-up (JIT)
printf '%-10s %6s %10s %12s %14s %8s %7s %8s\n' mode round req/s cpu_us/req req/cpu_s non2xx errors reloads
A=""; B=""; AC=""; BC=""
bench_rounds_init "$TMP"
while bench_round_next; do # steady and reloading windows alternate, the first one flips each round
  r=$BENCH_ROUND
  modes="steady reloading"; ((r % 2)) || modes="reloading steady"
  for mode in $modes; do
    hup=0; [[ $mode == reloading ]] && hup=$HUP_MS
    read -r rps cpu rpc non2xx errs rl < <($PY $LIB window "$SPID" "$PORT" "$DURATION" "$WRK_CORE" "$CONNS" "$hup")
    printf '%-10s %6s %10s %12s %14s %8s %7s %8s\n' "$mode" "$r" "$rps" "$cpu" "$rpc" "$non2xx" "$errs" "$rl"
    echo "{\"round\": $r, \"server\": \"$mode\", \"rps\": $rps, \"req_per_cpu\": $rpc}" >>"$TMP/rows.jsonl"
    if [[ $mode == steady ]]; then A="$A $rps"; AC="$AC $rpc"; else B="$B $rps"; BC="$BC $rpc"; fi
  done
  bench_round_end || true
done
grep -c "reload: generation [0-9]* on" "$TMP/khamsin.log" | sed "s/^/# reloads logged as done: /" || true
grep -c "reload failed" "$TMP/khamsin.log" | sed 's/^/# reloads failed: /' || true
stop "$SPID"
stats() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {printf "%s %s %s\n", a[int((NR + 1) / 2)], a[1], a[NR]}'; }
read -r a_med a_min a_max < <(echo "$A" | stats)
read -r b_med b_min b_max < <(echo "$B" | stats)
read -r ac_med ac_min ac_max < <(echo "$AC" | stats)
read -r bc_med bc_min bc_max < <(echo "$BC" | stats)

echo
echo "## 3. memory of an idle old instance ($N_IDLE reloads, each old instance held by one deferred reply)"
cp examples/hello.lua "$TMP/hello3.lua"
cat bench/apps/reload_hold.lua >>"$TMP/hello3.lua"
start "$TMP/hello3.lua" --log-level warn --defer-timeout-ms 600000
read -r m_before m_held m_after m_per < <($PY $LIB idlemem "$SPID" "$PORT" "$TMP/hello3.lua" "$N_IDLE")
echo "RSS before: $m_before kB; with $N_IDLE old instances held: $m_held kB; after they closed: $m_after kB"
stop "$SPID"

echo
echo "## summary"
echo "save -> first new answer (examples/hello.lua, --dev): median $s_med ms (min $s_min, max $s_max), failed requests during the saves: $s_failed"
echo "req/s steady: median $a_med ($a_min..$a_max); while reloading every $HUP_MS ms: median $b_med ($b_min..$b_max); ratio $(awk -v a="$a_med" -v b="$b_med" 'BEGIN {printf "%.2f", b / a}')"
echo "req per server CPU-second steady: median $ac_med ($ac_min..$ac_max); reloading: median $bc_med ($bc_min..$bc_max); ratio $(awk -v a="$ac_med" -v b="$bc_med" 'BEGIN {printf "%.2f", b / a}')"
echo "idle old instance (Lua state + router + one held request): $m_per kB RSS each"
echo
bench_summary "$TMP/rows.jsonl" --metric req_per_cpu --metric rps --subject reloading --anchor steady \
  --label "hello under a SIGHUP every $HUP_MS ms vs no reload (wrk -c$CONNS; ratio = reloading / steady)"
