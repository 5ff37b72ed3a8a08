# bench/lib/upstream.sh: what the benches of outbound calls share (bench/proxy.sh, bench/redis.sh):
# servers that call an upstream per request, measured per second of their own CPU over wrk
# windows, rounds alternating the servers. Sourced after the script set its defaults
# (DURATION CONNS NAME; ROUNDS SERVER_CORE WRK_CORE KHAMSIN_BIN: common.sh's bench_knobs); needs
# bench/lib/waitbench.py (ready, window). Never compare figures across scripts.

PY=${PY:-/usr/bin/python3}
. bench/lib/common.sh
LIB=${LIB:-bench/lib/waitbench.py}
bench_knobs
bench_paths "$NAME"
OUT=$RESULT
bench_pids_trap

# Builds the release binary when the script runs the default one (or the given one is missing).
if [[ $KHAMSIN_BIN == "$KHAMSIN_BIN_DEFAULT" || ! -x $KHAMSIN_BIN ]]; then bench_build_release khamsin; fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

# up_header: the result file's first lines (the command, the load, the machine, the binary);
# the script adds its own (versions of what it runs against). Output goes to $OUT from here.
up_header() {
  exec > >(tee "$OUT") 2>&1
  echo "# bench/$NAME.sh $STAMP"
  echo "# command: bench/$NAME.sh (DURATION=$DURATION ROUNDS=$ROUNDS CONNS=$CONNS SERVER_CORE=$SERVER_CORE WRK_CORE=$WRK_CORE)"
  echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (the machine is shared with other runs: figures are noisy, compare the ratios of one run)"
  echo "# machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -r)"
  bench_method_line
  echo "# khamsin: $KHAMSIN_BIN ($(git rev-parse --short HEAD 2>/dev/null))"
}

# up_rounds MULT LABEL RUN...: a 1 s warm-up window per run (JIT, pools), then rounds on the
# noisy-box method of bench/lib/common.sh (ROUNDS kept rounds; a disturbed round is said,
# discarded and redone): one DURATION window per run and round, in the order given on odd rounds
# and reversed on even ones (A B, B A). A RUN is "name pid port path". Per window: MULT * 1e6 /
# (server CPU microseconds) units of work per CPU-second, kept in the associative array
# PER_CPU[name] (kept rounds only) and as rows of $TMP/up.jsonl for up_summary.
declare -A PER_CPU PER_CPU_ALL
up_rounds() {
  local mult=$1 label=$2 run name pid port path r rps cpu_us share non2xx errs v order i
  shift 2
  printf '%-20s %6s %10s %14s %10s %8s %7s\n' server round req/s "$label" cpu_share non2xx errors
  for run in "$@"; do
    read -r name pid port path <<<"$run"
    $PY $LIB window "$pid" "$port" "$path" "$CONNS" 1 "$WRK_CORE" >/dev/null
  done
  bench_rounds_init "$TMP"
  : >"$TMP/up.jsonl"
  while bench_round_next; do
    r=$BENCH_ROUND
    order=("$@")
    if ((r % 2 == 0)); then order=(); for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done; fi
    declare -A THIS=()
    for run in "${order[@]}"; do
      read -r name pid port path <<<"$run"
      read -r rps cpu_us share non2xx errs < <($PY $LIB window "$pid" "$port" "$path" "$CONNS" "$DURATION" "$WRK_CORE")
      v=$(awk -v c="$cpu_us" -v m="$mult" 'BEGIN { if (c > 0) printf "%.0f", m * 1e6 / c; else print 0 }')
      THIS[$name]=$v
      echo "{\"round\": $r, \"server\": \"$name\", \"per_cpu\": $v, \"rps\": $rps}" >>"$TMP/up.jsonl"
      printf '%-20s %6s %10s %14s %10s %8s %7s\n' "$name" "$r" "$rps" "$v" "$share" "$non2xx" "$errs"
    done
    if bench_round_end; then
      for name in "${!THIS[@]}"; do PER_CPU[$name]="${PER_CPU[$name]:-} ${THIS[$name]}"; done
    fi
    for name in "${!THIS[@]}"; do PER_CPU_ALL[$name]="${PER_CPU_ALL[$name]:-} ${THIS[$name]}"; done
  done
  if ((BENCH_KEPT == 0)); then # every round disturbed: all are used (the summary says ALL-DISTURBED)
    echo "(every round was disturbed: the medians below use them all)"
    for name in "${!PER_CPU_ALL[@]}"; do PER_CPU[$name]=${PER_CPU_ALL[$name]}; done
  fi
}

# up_summary SUBJECT ANCHOR LABEL: the method's table (medians [min..max], per-round ratio with
# a bootstrap CI95) of every run, SUBJECT / ANCHOR; also appended to all.sh's summary.
up_summary() {
  bench_summary "$TMP/up.jsonl" --metric per_cpu --metric rps --subject "$1" --anchor "$2" --label "$3"
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
spread() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {printf "%s..%s", a[1], a[NR]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

# up_medians RUN...: one line per run: the median of PER_CPU and its min..max.
up_medians() {
  local run name
  for run in "$@"; do
    read -r name _ <<<"$run"
    printf '%-20s %12s  (%s)\n' "$name" "$(echo "${PER_CPU[$name]}" | median)" "$(echo "${PER_CPU[$name]}" | spread)"
  done
}

# up_pair_ratio A B: the ratio A/B within each round (the two windows ran back to back, under
# about the same load), then their median and min..max: steadier than a ratio of medians when
# the box's load drifts during the run.
up_pair_ratio() {
  local a=(${PER_CPU[$1]}) b=(${PER_CPU[$2]}) i rs=""
  for ((i = 0; i < ${#a[@]}; i++)); do
    rs="$rs $(ratio "${a[$i]}" "${b[$i]}")"
  done
  printf '%s  (%s; per round:%s)\n' "$(echo "$rs" | median)" "$(echo "$rs" | spread)" "$rs"
}
