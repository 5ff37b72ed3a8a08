#!/usr/bin/env bash
# bench/tls-callgrind.sh - user-space instructions per TLS 1.3 handshake (valgrind callgrind:
# repeatable on a loaded box, unlike server CPU time), khamsin with the record-layer hand-off on
# and off against nginx + lua, same ECDSA P-256 certificate, TLS 1.3 only, tickets on.
#
#   bench/tls-callgrind.sh             # ~3 min; N=200 SERVERS="khamsin khamsin-ossl nginx-lua"
#   SERVERS="khamsin nginx-lua nginx-lua-aes128" bench/tls-callgrind.sh
#                                      # nginx-lua-aes128: nginx with khamsin's TLS 1.3 suite order
#                                      # (TLS_AES_128_GCM_SHA256 first, server preference), the
#                                      # like-for-like anchor: nginx-lua keeps OpenSSL's default
#                                      # order, where clients get TLS_AES_256_GCM_SHA384
#   TOP=25 bench/tls-callgrind.sh      # also the TOP functions by inclusive Ir per handshake
#
# Per server, three runs under callgrind, one worker (nginx: master_process off, one process):
#   base   start, a TCP connect (ready), one full handshake + GET, stop
#   new    the same + N full handshakes, each with one GET / (bench/lib/tlsbench.py hs, ALPN
#          http/1.1, one connection after the other)
#   reuse  the same + one full handshake for a ticket + N handshakes resumed from it
# Ir/handshake: new = (new - base) / N; reuse = (reuse - base - one full) / N. Everything in the
# server process counts: accept, the HTTP request, Lua, close; the kernel does not.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BIN=${KHAMSIN_BIN:-build/khamsin}
N=${N:-200}
TOP=${TOP:-0}
PORT=${PORT:-29610}
SERVERS=${SERVERS:-"khamsin khamsin-ossl nginx-lua"}
PY=/usr/bin/python3
LIB=bench/lib/tlsbench.py
. bench/lib/common.sh
NGX_MODDIR=${NGX_MODDIR:-/usr/lib/nginx/modules}
TMP=${KEEP_DIR:-$(mktemp -d /tmp/khtlscg.XXXXXX)}
mkdir -p "$TMP"
[[ -n ${KEEP_DIR:-} ]] || trap 'rm -rf "$TMP"' EXIT
[[ -x $BIN ]] || { echo "no $BIN: cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build" >&2; exit 1; }
[[ -f $TMP/cert.pem ]] || openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout "$TMP/key.pem" -out "$TMP/cert.pem" -days 2 -subj /CN=localhost 2>/dev/null
nginx_conf "$TMP/ngx" bench/tls-callgrind.sh 1024 512 1 "    listen 127.0.0.1:$PORT ssl;
    ssl_certificate $TMP/cert.pem;
    ssl_certificate_key $TMP/key.pem;
    ssl_protocols TLSv1.3;
    ssl_session_tickets on;
    location / { $NGX_HELLO_LUA }"
sed -i 's/^master_process on;/master_process off;/' "$TMP/ngx/nginx.conf"
nginx_conf "$TMP/ngx128" bench/tls-callgrind.sh 1024 512 1 "    listen 127.0.0.1:$PORT ssl;
    ssl_certificate $TMP/cert.pem;
    ssl_certificate_key $TMP/key.pem;
    ssl_protocols TLSv1.3;
    ssl_prefer_server_ciphers on;
    ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256;
    ssl_session_tickets on;
    location / { $NGX_HELLO_LUA }"
sed -i 's/^master_process on;/master_process off;/' "$TMP/ngx128/nginx.conf"

server_cmd() {
  case $1 in
    khamsin) echo "$BIN --workers 1 --listen tls://127.0.0.1:$PORT --tls-cert $TMP/cert.pem --tls-key $TMP/key.pem --log-level warn examples/hello.lua" ;;
    khamsin-ossl) echo "$BIN --workers 1 --listen tls://127.0.0.1:$PORT --tls-cert $TMP/cert.pem --tls-key $TMP/key.pem --tls-own-records 0 --log-level warn examples/hello.lua" ;;
    nginx-lua) echo "nginx -p $TMP/ngx/ -c $TMP/ngx/nginx.conf -e $TMP/ngx/error.log" ;;
    nginx-lua-aes128) echo "nginx -p $TMP/ngx128/ -c $TMP/ngx128/nginx.conf -e $TMP/ngx128/error.log" ;;
  esac
}

run() { # server kind -> prints total Ir
  local s=$1 kind=$2 out=$TMP/$1.$2.cg p
  # shellcheck disable=SC2046
  valgrind --tool=callgrind --callgrind-out-file="$out" $(server_cmd "$s") >"$TMP/$s.$kind.log" 2>&1 &
  p=$!
  # ready = the port accepts (a TCP connect, no TLS: a TLS probe with a timeout could be retried
  # under valgrind and add a variable number of handshakes to the counts); then one full
  # handshake with no timeout, in every run, so that first-use costs are all in the base
  $PY -c 'import socket, sys, time
for _ in range(1200):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close(); sys.exit(0)
    except OSError: time.sleep(0.1)
sys.exit(1)' "$PORT" || { tail "$TMP/$s.$kind.log" >&2; exit 1; }
  $PY $LIB hs "$PORT" 1 new >/dev/null
  [[ $kind == base ]] || $PY $LIB hs "$PORT" "$N" "$kind" >"$TMP/$s.$kind.json"
  # nginx under valgrind sometimes lets the first SIGTERM pass (seen on base runs: the client
  # done, nginx idle in epoll_wait for minutes; a second SIGTERM ends it): resend every 10 s
  kill -TERM "$p"
  for ((i = 1; i <= 600; i++)); do
    kill -0 "$p" 2>/dev/null || break
    ((i % 50)) || kill -TERM "$p" 2>/dev/null || true
    sleep 0.2
  done
  wait "$p" || true
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}

echo "# TLS 1.3 handshake instructions (callgrind), N=$N per kind, $(openssl version | cut -d' ' -f1-2), $(nginx -v 2>&1 | sed 's/^nginx version: //')"
echo "server        full Ir/hs   resumed Ir/hs"
declare -A FULL RES
for s in $SERVERS; do
  b=$(run "$s" base); f=$(run "$s" new); r=$(run "$s" reuse)
  FULL[$s]=$(( (f - b) / N ))
  RES[$s]=$(( (r - b - FULL[$s]) / N ))
  printf '%-12s %11d %15d\n' "$s" "${FULL[$s]}" "${RES[$s]}"
done
if [[ -n ${FULL[nginx-lua]:-} ]]; then
  for s in $SERVERS; do
    [[ $s == nginx-lua* ]] && continue
    awk -v s="$s" -v f="${FULL[$s]}" -v r="${RES[$s]}" -v nf="${FULL[nginx-lua]}" -v nr="${RES[nginx-lua]}" \
      'BEGIN { printf "%-12s nginx-lua/this: full x%.2f, resumed x%.2f (above 1: fewer instructions than nginx)\n", s, nf / f, nr / r }'
  done
fi
if [[ -n ${FULL[nginx-lua-aes128]:-} ]]; then
  for s in $SERVERS; do
    [[ $s == nginx-lua* ]] && continue
    awk -v s="$s" -v f="${FULL[$s]}" -v r="${RES[$s]}" -v nf="${FULL[nginx-lua-aes128]}" -v nr="${RES[nginx-lua-aes128]}" \
      'BEGIN { printf "%-12s nginx-lua-aes128/this: full x%.2f, resumed x%.2f (same suite)\n", s, nf / f, nr / r }'
  done
fi
if ((TOP > 0)); then
  for s in $SERVERS; do
    for kind in new reuse; do
      echo; echo "## $s $kind: top $TOP functions, inclusive Ir per handshake ($kind run - base run) / N"
      $PY - "$TMP/$s.base.cg" "$TMP/$s.$kind.cg" "$N" "$TOP" <<'PYEOF'
import re, subprocess, sys
def incl(f):
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", f],
                         capture_output=True, text=True).stdout
    d = {}
    for line in out.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*?)(?:\s+\[.*\])?$", line)
        if m and ":" in m.group(2):
            d[m.group(2)] = d.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return d
b, l = incl(sys.argv[1]), incl(sys.argv[2])
n, top = int(sys.argv[3]), int(sys.argv[4])
rows = sorted(((v - b.get(k, 0)) / n, k) for k, v in l.items())
for v, k in rows[::-1][:top]:
    print(f"{v:12.0f}  {k}")
PYEOF
    done
  done
fi
