#!/usr/bin/env bash
# bench/perconn.sh - the cost of a connection, load-independently: user-space instructions
# (valgrind callgrind) and syscalls (strace -c) per connection that carries one
# `Connection: close` request, for khamsin and the nginx + lua anchor (and nginx static).
#
#   bench/perconn.sh                          # ~2 min; N=2000 connections, 8 in flight
#   SERVERS=khamsin TOOLS=strace bench/perconn.sh
#   KHAMSIN_BIN=build/khamsin N=5000 bench/perconn.sh
#
# Each server runs twice under each tool: started, probed once (curl), stopped; and started,
# probed, served N connections (bench/lib/connclient.py: GET / with `Connection: close`, the
# response read, then the client closes, as wrk -H 'Connection: close' does), stopped. The
# difference of the two runs divided by N is the per-connection figure: accept, read, parse,
# the handler, the write, the close, with the whole process counted (libuv, LuaJIT, libc) but
# not the kernel's time. One worker each: khamsin --workers 1; nginx with
# `master_process off; worker_processes 1` (same hello content as bench/http1.sh).
# TOOLS=segments (root only): TCP segments per connection, both directions (/proc/net/snmp
# Tcp OutSegs; on loopback each segment is sent once and received once), and resets sent
# (OutRsts), the server running natively in a network namespace of its own (unshare -n), so
# that nothing else on the box is counted: what the kernel sends and receives per connection.
# nginx-lua-deferred is nginx + lua with `listen ... deferred` (TCP_DEFER_ACCEPT, which khamsin
# sets by default: limit defer_accept_s): the anchor with the same kernel help.
# Knobs: SERVERS="khamsin nginx-lua" (nginx-static, nginx-lua-deferred too if named),
#   TOOLS="callgrind strace segments", N=2000, CONC=8, PORT=23290, KHAMSIN_BIN=build-release/khamsin,
#   KHAMSIN_ARGS="" (more khamsin flags, e.g. "--limit defer_accept_s=0"), TOP=12 (functions shown).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=/usr/bin/python3
. bench/lib/common.sh
BIN=${KHAMSIN_BIN:-build-release/khamsin}
SERVERS=${SERVERS:-"khamsin nginx-lua"}
TOOLS=${TOOLS:-"callgrind strace segments"}
N=${N:-2000}
CONC=${CONC:-8}
PORT=${PORT:-23290}
TOP=${TOP:-12}
KHAMSIN_ARGS=${KHAMSIN_ARGS:-}
NGX_MODDIR=${NGX_MODDIR:-/usr/lib/nginx/modules}
for t in valgrind strace curl nginx; do command -v $t >/dev/null || { echo "needs $t" >&2; exit 1; }; done
if [[ " $SERVERS " == *" khamsin "* && ! -x $BIN ]]; then
  cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build-release -j2 --target khamsin >/dev/null
fi
TMP=$(mktemp -d /tmp/khperconn.XXXXXX)
PID=
trap '[[ -n $PID ]] && kill -KILL $PID 2>/dev/null; rm -rf "$TMP"' EXIT

for kind in nginx-lua nginx-static nginx-lua-deferred; do
  lua=0; body="location / { default_type text/plain; return 200 \"Hello, World!\"; }"
  [[ $kind == nginx-lua* ]] && { lua=1; body="location / { $NGX_HELLO_LUA }"; }
  deferred=; [[ $kind == *-deferred ]] && deferred=" deferred"
  nginx_conf "$TMP/$kind" bench/perconn.sh 4096 1024 "$lua" "    listen 127.0.0.1:$PORT$deferred;
    $body"
  sed -i 's/^master_process on;/master_process off;/' "$TMP/$kind/nginx.conf"
done

server_cmd() { # name
  case $1 in
    khamsin) echo "$BIN --workers 1 --pool-threads 1 --listen 127.0.0.1:$PORT --log-level warn $KHAMSIN_ARGS bench/apps/hello.lua" ;;
    nginx-*) echo "nginx -p $TMP/$1/ -c $TMP/$1/nginx.conf -e $TMP/$1/error.log" ;;
  esac
}

run() { # tool server out n -> runs the server under the tool, serves n connections
  local tool=$1 s=$2 out=$3 n=$4 i
  local cmd
  read -r -a cmd <<<"$(server_cmd "$s")"
  case $tool in
    callgrind) valgrind --tool=callgrind --callgrind-out-file="$out" "${cmd[@]}" >"$TMP/log" 2>&1 & ;;
    strace) strace -f -c -o "$out" "${cmd[@]}" >"$TMP/log" 2>&1 & ;;
    segments) "${cmd[@]}" >"$TMP/log" 2>&1 & ;;
  esac
  PID=$!
  for ((i = 0; i < 300; i++)); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.1; done
  ((i < 300)) || { cat "$TMP/log" >&2; echo "$s did not start under $tool" >&2; exit 1; }
  [[ $tool == segments ]] && { sleep 0.3; tcp_counts >"$out.before"; }
  if ((n > 0)); then $PY bench/lib/connclient.py "$PORT" "$n" "$CONC" >/dev/null || { echo "$s: client failed" >&2; exit 1; }; fi
  [[ $tool == segments ]] && { sleep 0.5; tcp_counts >"$out.after"; }
  # TERM until it is gone: nginx in single-process mode under valgrind can miss one
  # (under strace the server is strace's child: the signal goes to it, not to strace)
  local target=$PID
  [[ $tool == strace ]] && target=$(pgrep -P "$PID" | head -1)
  for ((i = 0; i < 60; i++)); do kill -TERM "$target" 2>/dev/null || break; sleep 0.5; done
  wait "$PID" || true
  PID=
  for ((i = 0; i < 100; i++)); do $PY bench/lib/benchlib.py portfree "$PORT" 2>/dev/null && break; sleep 0.1; done
}

tcp_counts() { # "OutSegs OutRsts" of this network namespace
  awk '$1 == "Tcp:" && !h {for (i = 2; i <= NF; i++) k[i] = $i; h = 1; next}
       $1 == "Tcp:" {for (i = 2; i <= NF; i++) v[k[i]] = $i; print v["OutSegs"], v["OutRsts"]}' /proc/net/snmp
}
total_ir() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'; }
calls() { # strace -c file -> "syscall calls" lines
  awk '$1 ~ /^[0-9.]+$/ && NF >= 5 {print $NF, $4}' "$1"
}

echo "# bench/perconn.sh: per connection (one GET with Connection: close, then the client closes)"
echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "command:  SERVERS=\"$SERVERS\" TOOLS=\"$TOOLS\" N=$N CONC=$CONC KHAMSIN_BIN=$BIN${KHAMSIN_ARGS:+ KHAMSIN_ARGS=\"$KHAMSIN_ARGS\"} bench/perconn.sh"
echo "git:      $(git rev-parse --short HEAD) ($(git status --porcelain -- core lua | wc -l) uncommitted change(s) under core/ lua/)"
echo "nginx:    $(nginx -v 2>&1 | sed 's/^nginx version: //')"
for tool in $TOOLS; do
  if [[ $tool == segments && -z ${_KH_NETNS:-} ]]; then
    # again inside a network namespace of our own, with only this tool
    unshare -n env _KH_NETNS=1 TOOLS=segments SERVERS="$SERVERS" N="$N" CONC="$CONC" PORT="$PORT" \
      KHAMSIN_BIN="$BIN" KHAMSIN_ARGS="$KHAMSIN_ARGS" bash -c 'ip link set lo up && exec bash bench/perconn.sh' | sed -n '/^## /,$p'
    continue
  fi
  for s in $SERVERS; do
    if [[ $tool == segments ]]; then
      run "$tool" "$s" "$TMP/$s.$tool" "$N"
      read -r o0 r0 <"$TMP/$s.$tool.before"; read -r o1 r1 <"$TMP/$s.$tool.after"
      echo
      echo "## $s: TCP segments per connection (client and server, /proc/net/snmp in a private netns): $(awk -v a="$o0" -v b="$o1" -v n="$N" 'BEGIN {printf "%.2f", (b - a) / n}'), resets sent $(awk -v a="$r0" -v b="$r1" -v n="$N" 'BEGIN {printf "%.3f", (b - a) / n}')"
      continue
    fi
    run "$tool" "$s" "$TMP/$s.$tool.base" 0
    run "$tool" "$s" "$TMP/$s.$tool.load" "$N"
    if [[ $tool == callgrind ]]; then
      b=$(total_ir "$TMP/$s.$tool.base"); l=$(total_ir "$TMP/$s.$tool.load")
      echo
      echo "## $s: callgrind: $(( (l - b) / N )) instructions per connection ($b start+stop, $l with $N connections)"
      echo "   top functions by instructions per connection (with load minus start+stop):"
      $PY - "$TMP/$s.$tool.base" "$TMP/$s.$tool.load" "$N" "$TOP" <<'PYEOF'
import re, subprocess, sys
def fns(f):
    out = subprocess.run(["callgrind_annotate", "--threshold=100", f], capture_output=True, text=True).stdout
    d = {}
    for line in out.split("\n"):
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$", line)
        if m and ":" in m.group(2) and "PROGRAM TOTALS" not in line and "=>" not in line:
            name = re.sub(r"\s*\[.*\]$", "", m.group(2))
            d[name] = d.get(name, 0) + int(m.group(1).replace(",", ""))
    return d
b, l, n, top = fns(sys.argv[1]), fns(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
diff = sorted(((v - b.get(k, 0)) / n, k) for k, v in l.items())
for v, k in reversed(diff[-top:]):
    print(f"  {v:8.0f}  {k}")
PYEOF
    else
      echo
      echo "## $s: strace -f -c: syscalls per connection (with $N connections minus start+stop)"
      join -a1 -e0 -o 0,1.2,2.2 <(calls "$TMP/$s.$tool.load" | sort) <(calls "$TMP/$s.$tool.base" | sort) |
        awk -v n="$N" '$1 != "total" {d = ($2 - $3) / n; if (d >= 0.005) {printf "  %-16s %6.2f\n", $1, d; t += d}} END {printf "  %-16s %6.2f\n", "total", t}'
    fi
  done
done
