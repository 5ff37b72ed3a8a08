#!/usr/bin/env bash
# bench/streams.sh: memory per idle long-lived stream (issue 10, items 8-9): N idle SSE streams
# (each has had its head and one event) on one worker, for each protocol case, khamsin and
# nginx + lua (lua-nginx-module: ngx.print + ngx.flush, then ngx.sleep) in the same run, on the
# noisy-box method of bench/lib/common.sh (servers alternate within each round, ROUNDS kept rounds,
# disturbed rounds discarded and redone, medians and per-round ratios with a CI95); prints bytes per stream (the server's VmRSS over its process tree,
# after minus before, divided by N; khamsin after a full Lua GC through /gc, printed beside the
# Lua heap's share), median and spread. The WebSocket helper extends it with ws cases.
# Before the baseline, WARM streams (3000) are opened and closed at the same concurrency, so that
# what a burst leaves behind whatever its size (the worker's buffer cache of up to 256 x 16 KiB,
# the allocators' high-water marks) is in the baseline, not counted per stream. khamsin also
# reports, after a full Lua GC, the C allocator's bytes in use (glibc mallinfo2) and the Lua
# heap per stream: what the idle streams themselves hold.
# Cases: h1 (cleartext HTTP/1.1), h1+tls, h2c (one stream per connection), h2c-100 (100 streams
# per connection), h2 (TLS + ALPN). Knobs (env): N (10000), ROUNDS (5), CASES, SERVERS, SETTLE (1 s
# after the warm-up's closes, half of it after the last stream's event; the runs before 2026-12-02 had 2)
# ("khamsin nginx-lua"), KHAMSIN_BIN (build-release/khamsin, built when missing), SERVER_CORE
# (1), CLIENT_CORE (0), BASE_PORT (23480). Output is saved in bench/results/streams-<date>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
N=${N:-10000}
WARM=${WARM:-3000}
ROUNDS=${ROUNDS:-5}
CASES=${CASES:-"h1 h1+tls h2c h2c-100 h2"}
SERVERS=${SERVERS:-"khamsin nginx-lua"}
SERVER_CORE=${SERVER_CORE:-1}
CLIENT_CORE=${CLIENT_CORE:-0}
BASE_PORT=${BASE_PORT:-23480}
NGX_MODDIR=${NGX_MODDIR:-/usr/lib/nginx/modules}
KHAMSIN_BIN=${KHAMSIN_BIN:-build-release/khamsin}
# shellcheck source=lib/common.sh
source bench/lib/common.sh

[[ -x $KHAMSIN_BIN ]] || bench_build_release khamsin
ulimit -n "$(ulimit -Hn)"
TMP=$(mktemp -d /tmp/khstreams.XXXXXX)
[[ ${KEEP_TMP:-0} == 1 ]] || trap 'rm -rf "$TMP"' EXIT
mkdir -p bench/results
OUT=bench/results/streams-$(date -u +%Y%m%d-%H%M%S).txt
exec > >(tee "$OUT") 2>&1

echo "# bench/streams.sh — memory per idle SSE stream"
echo "# command: N=$N ROUNDS=$ROUNDS CASES=\"$CASES\" SERVERS=\"$SERVERS\" SERVER_CORE=$SERVER_CORE CLIENT_CORE=$CLIENT_CORE bench/streams.sh"
echo "# date: $(date -u +%FT%TZ)  commit: $(git rev-parse --short HEAD) (+$(git status --porcelain core lua | wc -l) uncommitted)"
echo "# khamsin: $KHAMSIN_BIN sha256 $(sha256sum "$KHAMSIN_BIN" | cut -c1-16)  nginx: $(nginx -v 2>&1 | cut -d/ -f2)"
echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)  kernel: $(uname -r)"
echo "# load at start: $(cut -d' ' -f1-3 /proc/loadavg) (the box is shared with other helpers' builds and"
echo "#   tests: memory figures do not depend on load, but compare only figures of the same run)"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
  -keyout "$TMP/key.pem" -out "$TMP/cert.pem" >/dev/null 2>&1

rss_kib() { # VmRSS summed over the process tree
  local t=0 p
  for p in $($PY bench/lib/benchlib.py tree "$1"); do
    t=$((t + $(awk '/^VmRSS/ {print $2}' /proc/"$p"/status 2>/dev/null || echo 0)))
  done
  echo $t
}

gc_bytes() { curl -s --max-time 10 "http://127.0.0.1:$1/gc"; } # "<lua bytes> <malloc bytes>"

start_server() { # server case port -> pid in SPID
  local server=$1 case=$2 port=$3 tls=0
  [[ $case == h1+tls || $case == h2 ]] && tls=1
  if [[ $server == khamsin ]]; then
    local listen="tcp://127.0.0.1:$port"
    ((tls)) && listen="tls://127.0.0.1:$port"
    taskset -c "$SERVER_CORE" "$KHAMSIN_BIN" --workers 1 --listen "$listen" --listen "tcp://127.0.0.1:$((port + 1))" \
      --tls-cert "$TMP/cert.pem" --tls-key "$TMP/key.pem" --log-level warn --slice-warn-ms 0 \
      bench/apps/streams.lua >"$TMP/khamsin.log" 2>&1 &
  else
    local l="listen 127.0.0.1:$port;"
    ((tls)) && l="listen 127.0.0.1:$port ssl; ssl_certificate $TMP/cert.pem; ssl_certificate_key $TMP/key.pem;"
    [[ $case == h2c || $case == h2c-100 ]] && l="listen 127.0.0.1:$port http2;"
    [[ $case == h2 ]] && l="listen 127.0.0.1:$port ssl http2; ssl_certificate $TMP/cert.pem; ssl_certificate_key $TMP/key.pem;"
    nginx_conf "$TMP/ngx" bench/streams.sh 65536 65536 1 "$l
    http2_max_concurrent_streams 128;
    location /sse { content_by_lua_block {
      ngx.header['Content-Type'] = 'text/event-stream'
      ngx.header['Cache-Control'] = 'no-cache'
      ngx.print('data: hello\n\n'); ngx.flush(true); ngx.sleep(3600) } }"
    taskset -c "$SERVER_CORE" nginx -p "$TMP/ngx/" -c "$TMP/ngx/nginx.conf" -e "$TMP/ngx/error.log" &
  fi
  SPID=$!
  # listening (waitready wants the hello app's answer: this app has none at /, so that was a fixed 1 s)
  local i
  for ((i = 0; i < 500; i++)); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.02; done
}

one() { # server case port -> prints bytes per stream, lua bytes per stream
  local server=$1 case=$2 port=$3 proto=$2 per=1
  [[ $case == h2c-100 ]] && proto=h2c && per=100
  start_server "$server" "$case" "$port"
  # warm-up: WARM streams opened and closed (see the header)
  mkfifo "$TMP/warm"
  taskset -c "$CLIENT_CORE" $PY bench/lib/streamsbench.py "$proto" "$port" /sse "$WARM" "$per" <"$TMP/warm" >"$TMP/wready" 2>/dev/null &
  local wpid=$! i
  exec 8>"$TMP/warm"
  for ((i = 0; i < 2400; i++)); do grep -q ready "$TMP/wready" 2>/dev/null && break; kill -0 $wpid 2>/dev/null || break; sleep 0.05; done
  exec 8>&-
  wait $wpid 2>/dev/null || true
  rm -f "$TMP/warm" "$TMP/wready"
  sleep "${SETTLE:-1}" # the warm-up's closes are processed (was 2 s: SETTLE=2 for the old runs)
  local g0="0 0" g1="0 0"
  [[ $server == khamsin ]] && g0=$(gc_bytes $((port + 1)))
  local before; before=$(rss_kib "$SPID")
  mkfifo "$TMP/hold"
  taskset -c "$CLIENT_CORE" $PY bench/lib/streamsbench.py "$proto" "$port" /sse "$N" "$per" <"$TMP/hold" >"$TMP/ready" 2>"$TMP/client.err" &
  local cpid=$!
  exec 7>"$TMP/hold"
  for ((i = 0; i < 2400; i++)); do grep -q ready "$TMP/ready" 2>/dev/null && break; kill -0 $cpid 2>/dev/null || break; sleep 0.05; done
  sleep "$(awk -v s="${SETTLE:-1}" 'BEGIN { print s / 2 }')" # every stream has had its event (the client said so); was 1 s
  [[ $server == khamsin ]] && g1=$(gc_bytes $((port + 1)))
  local after; after=$(rss_kib "$SPID")
  local ok=1; grep -q "ready $N" "$TMP/ready" || ok=0
  exec 7>&-
  wait $cpid 2>/dev/null || true
  rm -f "$TMP/hold" "$TMP/ready"
  kill_tree "$SPID"
  if ((ok == 0)); then echo "FAILED $(head -c 300 "$TMP/client.err")"; return; fi
  local l0 m0 l1 m1
  read -r l0 m0 <<<"$g0"
  read -r l1 m1 <<<"$g1"
  echo "$(( (after - before) * 1024 / N )) $(( (m1 - m0) / N )) $(( (l1 - l0) / N ))"
}

declare -A RES
bench_method_line
bench_rounds_init "$TMP"
while bench_round_next; do
  r=$BENCH_ROUND
  order=$SERVERS; ((r % 2)) || order=$(echo "$SERVERS" | tr ' ' '\n' | tac | tr '\n' ' ')
  for case in $CASES; do
    for server in $order; do
      port=$((BASE_PORT + 10 * (r % 20)))
      v=$(one "$server" "$case" "$port")
      echo "round $r  $case  $server: $v (bytes per stream: VmRSS, C malloc in use, Lua heap)"
      RES[$case,$server]+="$v;"
      [[ $v == FAILED* ]] || echo "{\"round\": $r, \"server\": \"$server\", \"case\": \"$case\", \"bytes_per_stream\": ${v%% *}}" >>"$TMP/rows.jsonl"
    done
  done
  bench_round_end || true
done
[[ -s $TMP/rows.jsonl ]] && bench_summary "$TMP/rows.jsonl" --metric bytes_per_stream --lower bytes_per_stream --group case \
  --label "memory per idle SSE stream (VmRSS growth / N=$N)"

echo
echo "## bytes per idle SSE stream, N=$N, median [min-max] of every round run (kept or not)"
printf '%-8s' case; for server in $SERVERS; do printf '  %-26s' "$server VmRSS"; done; echo "  khamsin C malloc + Lua heap"
for case in $CASES; do
  printf '%-8s' "$case"
  for server in $SERVERS; do
    printf '  %-26s' "$($PY - "${RES[$case,$server]}" <<'PYEOF'
import sys, statistics
vals = [int(x.split()[0]) for x in sys.argv[1].split(";") if x and not x.startswith("FAILED")]
print(f"{int(statistics.median(vals))} [{min(vals)}-{max(vals)}]" if vals else "failed")
PYEOF
)"
  done
  printf '  %s\n' "$($PY - "${RES[$case,khamsin]:-}" <<'PYEOF'
import sys, statistics
rows = [x.split() for x in sys.argv[1].split(";") if x and not x.startswith("FAILED")]
print(f"{int(statistics.median(int(r[1]) for r in rows))} + {int(statistics.median(int(r[2]) for r in rows))}" if rows else "-")
PYEOF
)"
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
