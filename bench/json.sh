#!/usr/bin/env bash
# bench/json.sh - k.json (lua/kh_lua_json.c) vs Debian's lua-cjson: decode + encode of a 1 KB
# JSON document in a loop, in a worker's LuaJIT state, with the release build. Each round runs
# both codecs back to back in one process (cjson then k.json, pinned to SERVER_CORE); rounds
# follow the noisy-box method of bench/lib/common.sh (ROUNDS kept rounds, disturbed ones
# discarded and redone), the summary gives median [min..max] us per op and the per-round ratio.
#   bench/json.sh            # ROUNDS=5, N=200000 iterations per codec and round
# Env: KHAMSIN_BIN (default build-release/khamsin, else build/khamsin) ROUNDS N SERVER_CORE=1
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
. bench/lib/common.sh
BIN=${KHAMSIN_BIN:-build-release/khamsin}
[[ -x $BIN ]] || BIN=build/khamsin
[[ -x $BIN ]] || { echo "no $BIN: build first (cmake -DCMAKE_BUILD_TYPE=Release -B build-release)" >&2; exit 1; }
ROUNDS=${ROUNDS:-${BENCH_ROUNDS:-5}}
SERVER_CORE=${SERVER_CORE:-1}
export N=${N:-200000}
STAMP=$(date +%Y%m%d-%H%M%S)
RESULT=bench/results/json-$STAMP.txt
TMP=$(mktemp -d /tmp/khbench-json.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
{
  echo "# khamsin bench: k.json vs lua-cjson, decode+encode of a 1 KB document (bench/apps/json_codec.lua)"
  echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command:  ROUNDS=$ROUNDS N=$N SERVER_CORE=$SERVER_CORE $0 $*"
  echo "git:      $(git rev-parse --short HEAD); binary $BIN; $(dpkg-query -W -f='${Package} ${Version}' lua-cjson 2>/dev/null || true)"
  bench_method_line
  bench_rounds_init "$TMP"
  while bench_round_next; do
    r=$BENCH_ROUND
    taskset -c "$SERVER_CORE" "$BIN" --workers 1 --listen 127.0.0.1:0 bench/apps/json_codec.lua | tee "$TMP/out.txt" | sed "s/^/  round $r /"
    awk -v r="$r" '/us per decode\+encode/ { for (i = 1; i <= NF; i++) if ($i == "per") v = $(i - 2);
      printf "{\"round\": %d, \"server\": \"%s\", \"us_per_op\": %s}\n", r, $1, v }' "$TMP/out.txt" >>"$TMP/rows.jsonl"
    bench_round_end || true
  done
  bench_summary "$TMP/rows.jsonl" --metric us_per_op --lower us_per_op --subject k.json --anchor cjson \
    --label "JSON decode+encode 1 KB (k.json vs lua-cjson)"
  echo "## Appendix: rows"; cat "$TMP/rows.jsonl"
} 2>&1 | tee "$RESULT"
echo "results written to $RESULT"
