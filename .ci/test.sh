#!/usr/bin/env bash
# Runs every test and ends with one line "N passed, N failed" (ctest cases + busted specs +
# fuzz smoke runs). usage: .ci/test.sh ASAN_BUILD_DIR FUZZ_BUILD_DIR
# Time (the suite's budget is 15 min on the 2-core box):
#  - the clang fuzz build (only the kh_fuzz_* binaries: target kh_fuzz_targets) starts first, in
#    the background at nice 19 and the lowest best-effort I/O priority: it takes the CPU that
#    ctest and the specs leave idle (the specs wait on sockets, timers and child processes much
#    of the time) and gives it back as soon as they want it; once the specs are done, the rest of
#    it goes on at the normal priority;
#  - ctest runs its cases $(nproc) at a time;
#  - the libFuzzer smoke runs go FUZZ_JOBS ($(nproc)) at a time, FUZZ_SECONDS (10) each: the
#    corpora and regressions are replayed in full by ctest; the smoke run is for new inputs.
set -uo pipefail
asan=${1:-build-asan}
fuzz=${2:-build-fuzz}
cd "$(dirname "$0")/.."
passed=0
failed=0
fuzz_failed=
jobs=$(nproc)

fuzz_log=$(mktemp)
( nice -n 19 ionice -c 2 -n 7 sh -c 'CC=clang cmake -S . -B "$1" -DKH_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
    cmake --build "$1" -j"$2" --target kh_fuzz_targets' sh "$fuzz" "$jobs" >"$fuzz_log" 2>&1 ) &
fuzz_build=$!

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/.ci/lsan.supp:print_suppressions=0}

echo "== ctest (unit tests, layering, fuzz replays) under ASan+UBSan"
ctest_out=$(cd "$asan" && ctest --output-on-failure -j"$jobs" 2>&1)
echo "$ctest_out"
line=$(echo "$ctest_out" | grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' | tail -1)
if [ -n "$line" ]; then
  total=$(echo "$line" | sed -E 's/.* out of ([0-9]+).*/\1/')
  bad=$(echo "$line" | sed -E 's/.* ([0-9]+) tests failed.*/\1/')
  passed=$((passed + total - bad))
  failed=$((failed + bad))
else
  echo "ctest did not run"
  failed=$((failed + 1))
fi

echo "== busted specs against $asan/khamsin"
spec_out=$(KHAMSIN_BIN=$PWD/$asan/khamsin busted 2>&1)
spec_rc=$?
echo "$spec_out"
line=$(echo "$spec_out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
if [ -n "$line" ]; then
  passed=$((passed + $(echo "$line" | awk '{print $1}')))
  failed=$((failed + $(echo "$line" | awk '{print $3}')))
  if [ $spec_rc -ne 0 ] && [ "$(echo "$line" | awk '{print $3}')" = 0 ]; then
    failed=$((failed + 1)) # errors outside a test (a broken spec file) still fail the run
  fi
else
  echo "busted printed no summary"
  failed=$((failed + 1))
fi

echo "== libFuzzer smoke runs (clang), ${FUZZ_SECONDS:-10} s each, ${FUZZ_JOBS:-$jobs} at a time"
# what is left of the build now runs at the normal priority (as root; else it stays at 19)
descendants() { local c; for c in $(pgrep -P "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done; }
renice -n 0 -p "$fuzz_build" $(descendants "$fuzz_build") >/dev/null 2>&1
if wait "$fuzz_build"; then
  work=$(mktemp -d)
  targets=()
  for bin in "$fuzz"/kh_fuzz_*; do
    [ -x "$bin" ] || continue
    t=${bin##*/kh_fuzz_}
    targets+=("$t")
    mkdir "$work/$t"
  done
  printf '%s\n' "${targets[@]}" | xargs -P "${FUZZ_JOBS:-$jobs}" -I{} sh -c '
    "$1/kh_fuzz_$2" -max_total_time="$3" -print_final_stats=1 -dict=core/fuzz/http.dict "$4/$2" \
      "core/fuzz/corpus/$2" >"$4/$2.log" 2>&1
    echo $? >"$4/$2.rc"' sh "$fuzz" {} "${FUZZ_SECONDS:-10}" "$work"
  for t in "${targets[@]}"; do
    if [ "$(cat "$work/$t.rc")" = 0 ]; then
      echo "fuzz $t: ok ($(grep -Eo 'stat::number_of_executed_units: [0-9]+' "$work/$t.log" | awk '{print $2}') runs)"
      passed=$((passed + 1))
    else
      echo "fuzz $t: FAILED"; tail -40 "$work/$t.log"
      fuzz_failed="$fuzz_failed $t"
      failed=$((failed + 1))
    fi
  done
  rm -rf "$work"
else
  echo "fuzz build failed"; tail -40 "$fuzz_log"
  fuzz_failed=" (the build)"
  failed=$((failed + 1))
fi
rm -f "$fuzz_log"

# what failed, again, above the last line: a log cut to its tail still names it
echo "$ctest_out" | grep -E '^[[:space:]]*[0-9]+ - .*\((Failed|SEGFAULT|Timeout|Subprocess aborted|Exception)' | sed 's/^/FAILED CTEST: /'
echo "$spec_out" | grep -E '^FAILED SPEC: '
[ -n "${fuzz_failed:-}" ] && echo "FAILED FUZZ:$fuzz_failed"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
