#!/usr/bin/env bash
# bench/all.sh - the whole comparison set in one go, every script on the noisy-box method of
# bench/lib/common.sh (servers alternated within each round, ROUNDS kept rounds, disturbed rounds
# discarded and redone, medians with their spread, per-round ratios to nginx + lua with a
# bootstrap interval), and one summary table that the README cites:
# bench/results/summary-<date>.md (each script's own result file is listed at its end).
#
#   bench/all.sh                                     # all 15 sets, < 20 min on a quiet 2-core box
#   DRY=1 bench/all.sh                               # the time budget only (per set and total)
#   ROUNDS=2 DURATION=2 SMALL=1 bench/all.sh         # smoke run: proves the chain, no figures
#
# all.sh runs each script with settings cut to fit 20 min (bench/README.md "bench/all.sh: the time
# budget" says what is cut and why); a script run alone keeps its own, longer defaults.
# Env: ROUNDS=5 DURATION=2 (s per load window of http1 h2) TLS_DURATION (tls's, default max(DURATION, 3))
#   XDURATION (the other sets' windows,
#   default min(DURATION, 2)) WARMUP=1 HS_SECONDS=2 (tls handshake windows) SETS (default: all of
#   http1 tls h2 json startup static compress websocket streams proxy redis reload wait h3 limits)
#   BENCH_MAX_REDO=2 (extra rounds per part when rounds are discarded) BENCH_MAX_FOREIGN
#   BENCH_MAX_STEAL (see common.sh) SMALL=0 (1: fewer idle connections and start-up runs)
#   BUDGET=1200 (s: warn when the estimate or the run is over it) DRY=0 (1: print the estimate, run
#   nothing) README (1 unless SMALL=1: bench/lib/readme.py puts the table into README.md).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=/usr/bin/python3
. bench/lib/common.sh
export ROUNDS=${ROUNDS:-5} DURATION=${DURATION:-2} WARMUP=${WARMUP:-1}
export BENCH_MAX_REDO=${BENCH_MAX_REDO:-2}
ALL_SETS="http1 tls h2 json startup static compress websocket streams proxy redis reload wait h3 limits"
SETS=${SETS:-$ALL_SETS}
SMALL=${SMALL:-0}
BUDGET=${BUDGET:-1200}
HS=${HS_SECONDS:-2}
# IDLE: idle connections of http1 and h2 (TIDLE: tls, its python TLS client is slow), WSN: idle
# WebSockets (half of it over TLS and h2) and broadcast fan-out, SN: idle SSE streams
if ((SMALL)); then IDLE=300 TIDLE=300 SRUNS=5 JN=20000 WSN=300 SN=300 H3N=2000
else IDLE=2000 TIDLE=1000 SRUNS=20 JN=50000 WSN=2000 SN=1000 H3N=40000; fi  # h3: 10,000 took 0.05 s of server CPU for h2 (5 ticks: ratios quantised by 20%)
XD=${XDURATION:-$(( DURATION > 2 ? 2 : DURATION ))} # the secondary sets' windows
# tls's keep-alive windows start with wrk's 256 full handshakes (~0.3 s on a quiet box): 3 s at least,
# so that they stay a small part of the window
TD=${TLS_DURATION:-$(( DURATION > 3 ? DURATION : 3 ))}

# ------------------------------------------------------------ the budget ---
# est_set NAME -> estimated seconds on a quiet box: fixed + ROUNDS x (windows per round x (window
# + per-window overhead)). The overheads (server start and stop, warm-up, client start-up, the
# method's snapshots) were measured per set on 2026-12-02 (bench/README.md "bench/all.sh: the time
# budget"); redone rounds come on top (at most BENCH_MAX_REDO per part).
est_set() {
  local R=$ROUNDS D=$DURATION W=$WARMUP X=$XD
  case $1 in # fixed + R x (windows x (window + overhead)), tenths of a second where it matters
    http1) echo $(( 20 + R * (8 * (D + W) + 8 * 6 / 10 + 2 * (10 + 6) / 10) )) ;; # 6 keep-alive + 2 close windows + 2 floor windows of 1 s; idle 2 x IDLE
    tls) echo $(( 10 + 3 * TIDLE / 100 + R * (2 * (TD + W + 1) + 4 * (HS + 1)) )) ;; # 2 load + 4 handshake windows; idle 3 x TIDLE
    h2) echo $(( 7 + 6 * IDLE / 500 + R * 6 * (D + W + 1) )) ;;           # 6 servers; idle 6 x IDLE
    json) echo $(( 2 + R * (JN * 9 / 100000 + 1) )) ;;                    # 2 codecs x (N/10 + 2 N) ops of ~20 us
    startup) echo $(( 5 + SRUNS * 3 / 4 )) ;;                             # 3 servers x RUNS, + callgrind counts
    static) echo $(( 8 + R * 4 * (10 * X + 6) / 10 )) ;;                  # 2 servers x 2 files
    compress) echo $(( 5 + R * 4 * (10 * X + 19) / 10 )) ;;               # (khamsin, nginx) x (identity, gzip-5), json
    websocket) echo $(( 10 + 3 * WSN / 200 + R * 2 * (10 * X + 25) / 10 )) ;; # idle 3 cases, broadcast; echo 2 servers
    streams) echo $(( 2 + R * 4 * (25 + 15 * SN / 1000) / 10 )) ;;        # 2 cases x 2 servers, SN streams + SN/2 warm-up
    proxy) echo $(( 12 + R * 2 * (10 * X + 4) / 10 )) ;;                  # 2 proxies, + strace windows
    redis) echo $(( 12 + R * 3 * (10 * X + 4) / 10 )) ;;                  # 3 runs, + strace windows
    reload) echo $(( 15 + R * 2 * (10 * X + 4) / 10 )) ;;                 # saves, steady/reloading windows, idle instances
    wait) echo $(( 16 + R * (4 * (10 * X + 4) + 2 * 42) / 10 )) ;;        # 4 paths; 2 x (3 s of slow clients)
    h3) echo $(( 3 + R * (H3N / 8000 + 1) )) ;;                            # h3 h1 h2, N requests each (10,000: 11 s)
    limits) echo $(( 2 * (3 + 1) + 2 + 2 * (3 + 1) + 2 * 4 + 2 + 2 * 6 + 2 * (6 + 3) )) ;; # 7 parts x 2 servers, no rounds
  esac
}
budget() {
  local s t tot=0
  printf '%-10s %6s\n' set "est. s"
  for s in $SETS; do t=$(est_set "$s"); tot=$((tot + t)); printf '%-10s %6d\n' "$s" "$t"; done
  printf '%-10s %6d  (%d min %02d s; budget %d s%s)\n' total "$tot" $((tot / 60)) $((tot % 60)) "$BUDGET" \
    "$( ((tot > BUDGET)) && echo ': OVER BUDGET' || true)"
  EST_TOTAL=$tot
}
echo "# bench/all.sh: ROUNDS=$ROUNDS DURATION=$DURATION TLS_DURATION=$TD XDURATION=$XD WARMUP=$WARMUP HS_SECONDS=$HS SMALL=$SMALL; dry budget on a quiet box:"
budget
if [[ ${DRY:-0} == 1 ]]; then exit 0; fi

# h3.sh needs kh-h3load, built beside the RelWithDebInfo binary (build/); the others use build-release/
H3BIN=${H3BIN:-build/khamsin}
if [[ " $SETS " == *" h3 "* && ( ! -x build/kh-h3load || ! -x $H3BIN ) ]]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build build -j"$(nproc)" --target khamsin khamsin-tls khamsin-h3 kh-h3load >/dev/null ||
    { echo "all.sh: the build of build/ failed" >&2; exit 1; }
fi
if [[ ! -x build-release/khamsin || -n $(find core lua CMakeLists.txt -newer build-release/khamsin \( -name '*.[ch]' -o -name '*.lua' -o -name CMakeLists.txt \) | head -1) ]]; then
  cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build build-release -j"$(nproc)" --target khamsin khamsin-tls khamsin-h3 >/dev/null ||
    { echo "all.sh: the build of build-release/ failed" >&2; exit 1; }
fi
export BENCH_BUILT=1 # the scripts skip their own (no-op) cmake runs
STAMP=$(date +%Y%m%d-%H%M)
export BENCH_SUMMARY=$ROOT/bench/results/summary-$STAMP.md
mkdir -p bench/results/tmp
T0=$(date +%s)
{
  echo "# khamsin bench summary ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo
  echo "- command: \`ROUNDS=$ROUNDS DURATION=$DURATION TLS_DURATION=$TD XDURATION=$XD WARMUP=$WARMUP HS_SECONDS=$HS SETS=\"$SETS\" SMALL=$SMALL BENCH_MAX_REDO=$BENCH_MAX_REDO bench/all.sh\`"
  echo "- git: $(git rev-parse --short HEAD) ($(git status --porcelain -- core lua | wc -l) uncommitted change(s) under core/ lua/)"
  echo "- cpu: $($PY $METHOD cpu-model); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- method: bench/README.md \"Method\": figures are medians over the kept rounds [min..max, IQR from 4 rounds]; the ratio is khamsin / anchor per round (paired), median [min..max] and a bootstrap CI95; rounds kept / run (a round is discarded when $($PY $METHOD rule))"
  ((SMALL)) && echo "- **SMALL=1 smoke run: the figures prove the chain works, they are not results**"
  echo
  echo "| bench | case | metric | khamsin | anchor (nginx + lua unless named) | ratio khamsin/anchor | rounds kept |"
  echo "|---|---|---|---|---|---|---|"
} >"$BENCH_SUMMARY"

RESULTS=()
TIMES=()
run_set() { # name command...
  local name=$1 before after t0 took st=0
  shift
  t0=$(date +%s)
  echo "=== $name: $* ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg); estimate $(est_set "$name") s)"
  before=$(ls bench/results/ 2>/dev/null | sort)
  "$@" || st=$?
  if ((st)); then
    echo "| $name | FAILED (exit $st) | see its output | - | - | - | - |" >>"$BENCH_SUMMARY"
  fi
  after=$(ls bench/results/ 2>/dev/null | sort)
  # (a bench run by someone else meanwhile would be listed too: run all.sh alone)
  RESULTS+=($(comm -13 <(echo "$before") <(echo "$after") | grep -v -e '^summary-' -e '^tmp$' -e '\.partial$' || true))
  took=$(( $(date +%s) - t0 ))
  TIMES+=("$name $took $(est_set "$name")")
  echo "=== $name took $took s (estimate $(est_set "$name") s; $(( $(date +%s) - T0 )) s since the start)"
}

for s in $SETS; do
  case $s in
    # the close part without nginx-static (its own keep-alive row is in the load part); no per-window
    # quiet wait (the round's foreign-CPU check covers it)
    http1) run_set http1 env PARTS="load close idle" IDLE_CONNS=$IDLE CLOSE_SERVERS="khamsin nginx-lua" QUIET_WAIT=0 \
             NOISY_RETRIES=0 bench/http1.sh ;;
    tls) run_set tls env DURATION=$TD HS_SECONDS=$HS IDLE_CONNS=$TIDLE QUIET_WAIT=0 QUIET_BUDGET=0 bench/tls.sh ;;
    # khamsin-allid: the same server with an X-Request-Id on every reply (--request-id-header 2,
    # the default before 2026-12-02), reported beside the default
    h2) run_set h2 env IDLE_CONNS=$IDLE SERVERS="khamsin khamsin-allid nginx-lua lighttpd khamsin-tls nginx-lua-tls" bench/h2.sh ;;
    json) run_set json env N=$JN bench/json.sh ;;
    startup) run_set startup env RUNS=$SRUNS bench/startup.sh ;;
    static) run_set static env DURATION=$XD bench/static.sh ;;
    compress) run_set compress env DURATION=$XD CODINGS=gzip GZIP_LEVELS=5 PAYLOADS=json bench/compress.sh ;; # every coding and payload: ~7 min
    websocket) run_set websocket env KHAMSIN_BIN=build-release/khamsin IDLE_N=$WSN IDLE_N_TLS=$((WSN / 2)) IDLE_N_H2=$((WSN / 2)) \
                 ECHO_SECONDS=$XD BCAST_N=$WSN bench/websocket.sh ;;
    # h2c-100 (100 streams per connection) rather than h2 over TLS with one stream per connection:
    # the latter is an idle h2 TLS connection, which h2.sh's idle part measures already
    streams) run_set streams env N=$SN WARM=$((SN / 2)) CASES="h1 h2c-100" bench/streams.sh ;;
    proxy) run_set proxy env DURATION=$XD bench/proxy.sh ;;
    redis) run_set redis env DURATION=$XD BLOCKING=0 bench/redis.sh ;; # without the k.blocking run: no summary row uses it
    reload) run_set reload env DURATION=$XD ROUNDS_SAVE=5 N_IDLE=10 bench/reload.sh ;;
    # /sleep0?n=1 left out: no summary row uses it
    wait) run_set wait env DURATION=$XD POOLS=4 CLIENTS=300 SLOW_SECONDS=3 WAIT_PATHS="/ /sleep0?n=100 /pool /defer" bench/wait.sh ;;
    h3) run_set h3 env N=$H3N KHAMSIN_BIN=$H3BIN bench/h3.sh ;;
    # readers at 4 MB/s instead of 1-2 (an 8 MiB body in ~2 s, still far below what loopback takes)
    limits) run_set limits env FD_SECS=3 SL_SECS=6 SL_CONNS=500 SLOW_RATE=4000000 STOP_RATE=4000000 \
              PARTS="fd pipeline slowread stopread idlekeep stopslow slowloris" bench/limits.sh
            echo "| limits | behaviour at the limits (counts and bounds, not rates: no rounds) | see its result file | - | - | - | - |" >>"$BENCH_SUMMARY" ;;
    *) echo "unknown set $s (known: $ALL_SETS)" >&2; exit 2 ;;
  esac
done

TOTAL=$(( $(date +%s) - T0 ))
{
  echo
  echo "Result files (full output, per-round rows, raw tool output): ${RESULTS[*]/#/bench/results/}"
  echo
  echo "Time per set (s, estimate from the dry budget in brackets): $(for t in "${TIMES[@]}"; do set -- $t; printf '%s %s [%s]; ' "$1" "$2" "$3"; done)"
  echo
  echo "Took $((TOTAL / 60)) min $((TOTAL % 60)) s (budget $((BUDGET / 60)) min, estimate $((EST_TOTAL / 60)) min $((EST_TOTAL % 60)) s)$( ((TOTAL > BUDGET)) && echo ": **OVER BUDGET**" || true); load average at end: $(cut -d' ' -f1-3 /proc/loadavg)."
} >>"$BENCH_SUMMARY"
echo "summary written to $BENCH_SUMMARY"
cat "$BENCH_SUMMARY"
if ((TOTAL > BUDGET)); then
  echo "WARNING: all.sh took $TOTAL s, over the $BUDGET s budget (see the time per set above)" >&2
fi
# README=1 (the default for a full run) regenerates the README's performance table from it
if [[ ${README:-$((SMALL ? 0 : 1))} == 1 ]]; then
  $PY bench/lib/readme.py "bench/results/$(basename "$BENCH_SUMMARY")" README.md
fi
