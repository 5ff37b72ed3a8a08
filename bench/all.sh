#!/usr/bin/env bash
# bench/all.sh - the whole comparison set in one go, every script on
# the noisy-box method of bench/lib/common.sh (servers alternated within each round, ROUNDS kept
# rounds, disturbed rounds discarded and redone, medians with their spread, per-round ratios to
# nginx + lua with a bootstrap interval), and one summary table that the README cites:
# bench/results/summary-<date>.md (each script's own result file is listed at its end).
#
#   bench/all.sh                                     # ~35 min: http1..websocket took 26 min on 2026-12-02 (compress 7 of them, now gzip only)
#   ROUNDS=2 DURATION=2 SMALL=1 bench/all.sh         # smoke run (~4 min): proves the chain, no figures
#
# Env: ROUNDS=5 DURATION=5 (s per load window of http1 tls h2) XDURATION (the other sets' windows,
#   default min(DURATION, 3)) WARMUP=1 SETS (default: all of http1 tls h2 json startup static
#   compress websocket streams proxy redis reload wait h3 limits)
#   BENCH_MAX_REDO=2 (extra rounds per script when rounds are discarded) BENCH_MAX_LOAD
#   BENCH_MAX_STEAL (see common.sh) SMALL=0 (1: fewer idle connections and start-up runs)
#   README (1 unless SMALL=1: bench/lib/readme.py puts the table into README.md's generated block).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=/usr/bin/python3
. bench/lib/common.sh
export ROUNDS=${ROUNDS:-5} DURATION=${DURATION:-5} WARMUP=${WARMUP:-1}
export BENCH_MAX_REDO=${BENCH_MAX_REDO:-2}
ALL_SETS="http1 tls h2 json startup static compress websocket streams proxy redis reload wait h3 limits"
SETS=${SETS:-$ALL_SETS}
SMALL=${SMALL:-0}
if ((SMALL)); then IDLE=300 SRUNS=5 HS=2 JN=50000 WSN=300 H3N=2000; else IDLE=2000 SRUNS=20 HS=3 JN=200000 WSN=2000 H3N=20000; fi
XD=${XDURATION:-$(( DURATION > 3 ? 3 : DURATION ))} # the secondary sets' windows: shorter, to keep the whole run < 20 min
# h3.sh needs kh-h3load, built beside the RelWithDebInfo binary (build/); the others use build-release/
H3BIN=${H3BIN:-build/khamsin}
if [[ " $SETS " == *" h3 "* && ! -x build/kh-h3load ]]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build build -j"$(nproc)" --target khamsin khamsin-tls khamsin-h3 kh-h3load >/dev/null
fi
if [[ ! -x build-release/khamsin || -n $(find core lua -newer build-release/khamsin \( -name '*.[ch]' -o -name '*.lua' \) | head -1) ]]; then
  cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build build-release -j"$(nproc)" --target khamsin khamsin-tls khamsin-h3 >/dev/null
fi
STAMP=$(date +%Y%m%d-%H%M)
export BENCH_SUMMARY=$ROOT/bench/results/summary-$STAMP.md
mkdir -p bench/results
T0=$(date +%s)
{
  echo "# khamsin bench summary ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo
  echo "- command: \`ROUNDS=$ROUNDS DURATION=$DURATION WARMUP=$WARMUP SETS=\"$SETS\" SMALL=$SMALL BENCH_MAX_REDO=$BENCH_MAX_REDO bench/all.sh\`"
  echo "- git: $(git rev-parse --short HEAD) ($(git status --porcelain -- core lua | wc -l) uncommitted change(s) under core/ lua/)"
  echo "- cpu: $($PY $METHOD cpu-model); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- method: bench/README.md \"Method\": figures are medians over the kept rounds [min..max, IQR from 4 rounds]; the ratio is khamsin / anchor per round (paired), median [min..max] and a bootstrap CI95; rounds kept / run (a round is discarded when the load average > ${BENCH_MAX_LOAD:-cores + 1} or steal > ${BENCH_MAX_STEAL:-0.05})"
  ((SMALL)) && echo "- **SMALL=1 smoke run: the figures prove the chain works, they are not results**"
  echo
  echo "| bench | case | metric | khamsin | anchor (nginx + lua unless named) | ratio khamsin/anchor | rounds kept |"
  echo "|---|---|---|---|---|---|---|"
} >"$BENCH_SUMMARY"

RESULTS=()
run_set() { # name command...
  local name=$1 before after
  shift
  echo "=== $name: $* ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
  before=$(ls bench/results/ 2>/dev/null | sort)
  if ! "$@"; then
    echo "| $name | FAILED | see its output | - | - | - | - |" >>"$BENCH_SUMMARY"
  fi
  after=$(ls bench/results/ 2>/dev/null | sort)
  # (a bench run by someone else meanwhile would be listed too: run all.sh alone)
  RESULTS+=($(comm -13 <(echo "$before") <(echo "$after") | grep -v -e '^summary-' -e '^tmp$' -e '\.partial$' || true))
}

for s in $SETS; do
  case $s in
    http1) run_set http1 env PARTS="load close idle" IDLE_CONNS=$IDLE QUIET_WAIT=2 QUIET_BUDGET=20 NOISY_RETRIES=0 bench/http1.sh ;;
    tls) run_set tls env HS_SECONDS=$HS IDLE_CONNS=$IDLE QUIET_WAIT=2 QUIET_BUDGET=20 bench/tls.sh ;;
    h2) run_set h2 env IDLE_CONNS=$IDLE bench/h2.sh ;;
    json) run_set json env N=$JN bench/json.sh ;;
    startup) run_set startup env RUNS=$SRUNS bench/startup.sh ;;
    static) run_set static env DURATION=$XD bench/static.sh ;;
    compress) run_set compress env DURATION=$XD CODINGS=gzip GZIP_LEVELS=5 bench/compress.sh ;; # every coding: ~7 min
    websocket) run_set websocket env KHAMSIN_BIN=build-release/khamsin IDLE_N=$WSN IDLE_N_TLS=$((WSN / 2)) IDLE_N_H2=$((WSN / 2)) ECHO_SECONDS=$XD \
                 BCAST_N=$WSN bench/websocket.sh ;;
    streams) run_set streams env N=$WSN WARM=$((WSN / 2)) CASES="h1 h2" bench/streams.sh ;;
    proxy) run_set proxy env DURATION=$XD bench/proxy.sh ;;
    redis) run_set redis env DURATION=$XD bench/redis.sh ;;
    reload) run_set reload env DURATION=$XD ROUNDS_SAVE=5 N_IDLE=10 bench/reload.sh ;;
    wait) run_set wait env DURATION=$XD POOLS=4 CLIENTS=300 SLOW_SECONDS=4 bench/wait.sh ;;
    h3) run_set h3 env N=$H3N KHAMSIN_BIN=$H3BIN bench/h3.sh ;;
    limits) run_set limits env FD_SECS=4 SL_SECS=10 SL_CONNS=500 PARTS="fd pipeline slowread stopread idlekeep stopslow slowloris" \
              bench/limits.sh
            echo "| limits | behaviour at the limits (counts and bounds, not rates: no rounds) | see its result file | - | - | - | - |" >>"$BENCH_SUMMARY" ;;
    *) echo "unknown set $s (known: $ALL_SETS)" >&2; exit 2 ;;
  esac
done

{
  echo
  echo "Result files (full output, per-round rows, raw tool output): ${RESULTS[*]/#/bench/results/}"
  echo
  echo "Took $(( ($(date +%s) - T0) / 60 )) min; load average at end: $(cut -d' ' -f1-3 /proc/loadavg)."
} >>"$BENCH_SUMMARY"
echo "summary written to $BENCH_SUMMARY"
cat "$BENCH_SUMMARY"
# README=1 (the default for a full run) regenerates the README's performance table from it
if [[ ${README:-$((SMALL ? 0 : 1))} == 1 ]]; then
  $PY bench/lib/readme.py "bench/results/$(basename "$BENCH_SUMMARY")" README.md
fi
