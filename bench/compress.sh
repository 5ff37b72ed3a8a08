#!/usr/bin/env bash
# bench/compress.sh - compression CPU per MB of payload: khamsin (limit compress=1; gzip, br and
# zstd at three levels each) against nginx's gzip (static file, gzip on, gzip_comp_level 1/5/9),
# a typical JSON (~37 KB) and HTML (~25 KB) payload, both servers in the same run, pinned with
# taskset (server core 1, wrk core 0), on the noisy-box method of bench/lib/common.sh (every
# configuration once per round, the order flipped each round; ROUNDS kept rounds, disturbed rounds
# discarded and redone). Prints server CPU ms per MB served, the compression share (minus the
# same server's identity figure of the round), sizes, and the per-round khamsin/nginx ratio at
# equal gzip levels with a bootstrap CI95. The result goes to bench/results/compress-<date>.txt.
#   bench/compress.sh                       # release build in build-release/ (cmake -DCMAKE_BUILD_TYPE=Release)
#   ROUNDS=5 DURATION=3 CONNS=8 bench/compress.sh   (~20 min; CODINGS=gzip GZIP_LEVELS="1 5": ~3 min)
# Env: KHAMSIN_BIN SERVER_CORE WRK_CORE BASE_PORT ROUNDS(5) DURATION(5) CONNS(8) CODINGS("gzip br zstd")
#   GZIP_LEVELS("1 5 9") PAYLOADS("json html"). Needs wrk, nginx, curl, /usr/bin/python3.
set -eo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
out=bench/results/compress-$(date +%Y%m%d-%H%M%S).txt
/usr/bin/python3 bench/lib/compressbench.py "$@" 2>&1 | tee "$out"
echo "results written to $out"
