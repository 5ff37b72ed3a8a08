#!/usr/bin/env bash
# bench/all.sh - the whole comparison set in one go (< 20 min on the 2-core VM), every script on
# the noisy-box method of bench/lib/common.sh (servers alternated within each round, ROUNDS kept
# rounds, disturbed rounds discarded and redone, medians with their spread, per-round ratios to
# nginx + lua with a bootstrap interval), and one summary table that the README cites:
# bench/results/summary-<date>.md (each script's own result file is listed at its end).
#
#   bench/all.sh                                     # ~15 min
#   ROUNDS=2 DURATION=2 SMALL=1 bench/all.sh         # smoke run (~4 min): proves the chain, no figures
#
# Env: ROUNDS=5 DURATION=5 (s per load window) WARMUP=1 SETS="http1 tls h2 json startup"
#   BENCH_MAX_REDO=2 (extra rounds per script when rounds are discarded) BENCH_MAX_LOAD
#   BENCH_MAX_STEAL (see common.sh) SMALL=0 (1: fewer idle connections and start-up runs).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=/usr/bin/python3
. bench/lib/common.sh
export ROUNDS=${ROUNDS:-5} DURATION=${DURATION:-5} WARMUP=${WARMUP:-1}
export BENCH_MAX_REDO=${BENCH_MAX_REDO:-2}
SETS=${SETS:-"http1 tls h2 json startup"}
SMALL=${SMALL:-0}
if ((SMALL)); then IDLE=300 SRUNS=5 HS=2 JN=50000; else IDLE=2000 SRUNS=20 HS=3 JN=200000; fi
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
    *) echo "unknown set $s (known: http1 tls h2 json startup)" >&2; exit 2 ;;
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
