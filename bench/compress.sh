#!/bin/sh
# bench/compress.sh - compression CPU per MB of payload: khamsin (limit compress=1; gzip, br and
# zstd at three levels each) against nginx's gzip (static file, gzip on, gzip_comp_level 1/5/9),
# a typical JSON (~37 KB) and HTML (~25 KB) payload, both servers in the same run, alternated
# round by round, pinned with taskset (server core 1, wrk core 0). Prints server CPU ms per MB
# served, the same minus each server's uncompressed baseline ("compression ms/MB"), sizes, and
# the khamsin/nginx ratio at equal gzip levels.
#   bench/compress.sh                       # release build in build-release/ (cmake -DCMAKE_BUILD_TYPE=Release)
#   ROUNDS=3 DURATION=3 CONNS=8 bench/compress.sh   (~10 min)
# Env: KHAMSIN_BIN SERVER_CORE WRK_CORE BASE_PORT. Needs wrk, nginx, curl, /usr/bin/python3.
set -e
cd "$(dirname "$0")/.."
exec /usr/bin/python3 bench/lib/compressbench.py "$@"
