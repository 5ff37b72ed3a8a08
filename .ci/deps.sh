#!/usr/bin/env bash
# Installs the Debian 12 packages khamsin needs (as root), or prints the one apt-get line.
# usage: .ci/deps.sh run|test|bench
set -euo pipefail
what=${1:-run}
# luajit2 (the luajit command) compiles khamsin's Lua modules to the bytecode built into the binary
pkgs=(cmake make gcc pkg-config libluajit2-5.1-dev luajit2 libuv1-dev libnghttp2-dev libssl-dev lua-cjson curl zlib1g-dev libbrotli-dev libzstd-dev)
# --http3 (khamsin-h3.so): ngtcp2 0.12 with its GnuTLS crypto helper, nghttp3 0.8
pkgs+=(libngtcp2-dev libnghttp3-dev libngtcp2-crypto-gnutls-dev libgnutls28-dev)
if [ "$what" = test ] || [ "$what" = bench ]; then
  # luarocks: spec/luarocks_spec.lua; lua5.1: khamsin.test under PUC Lua (spec/khamsin_test_spec.lua)
  pkgs+=(lua-busted lua-socket lua-sec luarocks lua5.1 clang libclang-rt-14-dev python3 python3-h2 nghttp2-client openssl iproute2 testssl.sh nginx python3-brotli zstd)
  # spec/h3_spec.lua: gtlsclient (HTTP/3 interop) and headless Chromium
  pkgs+=(ngtcp2-client chromium)
  # spec/redis_spec.lua: a real redis-server, and redis-lua (luasocket API) run on k.socket
  pkgs+=(redis-server lua-redis)
  # spec/websocket_spec.lua: python3-websockets (h1), python3-wsproto (h2 frames, RFC 8441)
  pkgs+=(python3-websockets python3-wsproto)
  # spec/tls_openssl_conf_spec.lua: which files the server opens at start-up
  pkgs+=(strace)
fi
if [ "$what" = bench ]; then
  pkgs+=(wrk nginx libnginx-mod-http-lua util-linux procps slowhttptest)
  # bench/startup.sh, bench/callgrind.sh: instruction counts; startup.sh PARTS=faults: perf
  pkgs+=(valgrind linux-perf)
  # bench/websocket.sh: lua-resty-websocket; bench/h2.sh: lighttpd (its own h2) answering via mod_magnet
  pkgs+=(lua-nginx-websocket lighttpd lighttpd-modules-lua)
fi
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "khamsin needs these Debian packages; as root run:" >&2
  echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
