#!/usr/bin/env bash
# bench.sh (make bench): the bench suite against the cluster make run started
# (its config under REDCELL_VAR, default ./var), in about ten minutes:
#   0. roundrobin: 2,000 packets sent first, opened round robin by fresh
#      accounts, closed loop, 64 openers, one run per strategy (cold packets,
#      no sends during the load);
#   1. cold: many small packets sent during the load, each opened by its two
#      members, closed loop, 64 openers, one run per strategy;
#   2. hot: one packet, closed loop, 64 openers, one run per strategy, plus the
#      ceilings (the database alone, HTTP no-op via the router and direct, the
#      no-op sent by the bench and by wrk in turn), the router profiled when
#      BENCH_PPROF names its pprof address;
#   3. festival: each strategy's highest sustained open-loop rate (p99 within
#      50 ms, nothing shed), by a short search;
#   4. festival at 70% of the last strategy's sustained rate, audited (when
#      the search confirmed no rate for it: reported so, and the audit runs
#      alone);
#   5. rewards (about 30 s in all): token issuance against book_now,
#      closed-loop, 5 s each, with the booking lag of 200 samples and the
#      no-op against the issued-so-far read; then the booking lag at a fixed
#      300 issues/s, open-loop, 5 s. Skipped on a build whose cells have no
#      budget pool wired while the activities control their stock: issuing
#      there would crash the cells.
# Each step writes report.md, report.json and chart.svg in its own directory
# under one var/bench/<time>/ (BENCH_OUT overrides it); the script prints
# where. Every step runs with --allow-shed: the answers by which the cluster
# sheds load by design (OVERLOADED, TIMEOUT, MOVING, the RATE_LIMITED codes,
# DB_UNAVAILABLE while a database breaker is open, client timeouts and drops)
# are counted and reported per run ("shed by design"), not failed, and a strategy whose search confirms no rate is
# reported as "no confirmed rate". A step fails only when money is wrong (an
# audit difference or problem, a claim beyond its packet, a balance off) or
# a run could not be made (the cluster down, a setup that failed, any other
# error code). Every step runs even when an earlier one failed; the exit
# status is the first failure's, and the last line names the failed steps.
#
# BENCH_STRATEGIES (comma-separated) overrides the strategies: by default
# naive,batched,grouped when this build knows grouped, else naive,batched.
# BENCH_SUSTAIN_AT names the strategy of step 4 (default: the last one).
# BENCH_DURATION (10s) is each comparison run; BENCH_SEARCH_TIME (4m) the whole
# search; BENCH_SUSTAIN_DURATION (30s) the run of step 4; BENCH_REWARDS_DURATION
# (5s) each run of step 5 and BENCH_REWARDS_RATE (300) its fixed rate.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
VAR=${REDCELL_VAR:-$root/var}
BIN=${BIN:-$VAR/bin/redcell}
config=$VAR/redcell.yaml
if [ ! -f "$config" ]; then
  echo "bench.sh: no cluster config at $config: start the cluster first (make run, with the same REDCELL_VAR)" >&2
  exit 2
fi
if [ ! -x "$BIN" ]; then
  echo "bench.sh: no redcell binary at $BIN (make build)" >&2
  exit 2
fi

# grouped exists in builds whose cell package names it (cell/config.go).
default_strategies=naive,batched
if grep -qs 'StrategyGrouped[[:space:]]*=[[:space:]]*"grouped"' "$root/cell/config.go"; then
  default_strategies=naive,batched,grouped
fi
strategies=${BENCH_STRATEGIES:-$default_strategies}
sustain_at=${BENCH_SUSTAIN_AT:-${strategies##*,}}
duration=${BENCH_DURATION:-10s}
search_time=${BENCH_SEARCH_TIME:-4m}
sustain_duration=${BENCH_SUSTAIN_DURATION:-30s}
out=${BENCH_OUT:-$VAR/bench/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"

status=0
failed=()
# step NAME ARGS...: one bench invocation; its text report (stdout) goes to
# $out/NAME/report.txt as well as to the terminal, its progress (stderr) to
# the terminal only.
step() {
  local name=$1
  shift
  mkdir -p "$out/$name"
  echo
  echo "=== bench $name: redcell bench $*"
  local rc=0
  "$BIN" bench --config "$config" --out "$out/$name" "$@" | tee "$out/$name/report.txt" || rc=$?
  if [ "$rc" != 0 ]; then
    echo "=== bench $name FAILED (exit $rc)"
    failed+=("$name")
    if [ "$status" = 0 ]; then status=$rc; fi
  fi
}

started=$(date +%s)
step roundrobin --workload roundrobin --openers 64 --compare "$strategies" --duration "$duration" --allow-shed
step cold --workload cold --openers 64 --compare "$strategies" --duration "$duration" --allow-shed
# hot also measures the no-op route by the bench and by wrk in turn (wrk where
# installed: is the bench client the bottleneck?), and, with BENCH_PPROF (make
# bench sets it when make run serves pprof: REDCELL_PPROF=1), profiles the router.
step hot --workload hot --openers 64 --compare "$strategies" --duration "$duration" \
  --limits --limits-duration "${BENCH_NOOP_DURATION:-5s}" --allow-shed --wrk auto \
  ${BENCH_PPROF:+--router-pprof "$BENCH_PPROF"}
step festival --workload festival --compare "$strategies" --search-only --search-time "$search_time" \
  --sustain-at "$sustain_at" --sustain-duration "$sustain_duration" --allow-shed
rewards_duration=${BENCH_REWARDS_DURATION:-5s}
step rewards --workload rewards --compare async,sync --duration "$rewards_duration" --allow-shed
step rewards-lag --workload rewards --rate "${BENCH_REWARDS_RATE:-300}" --duration "$rewards_duration" \
  --reads-duration 0 --allow-shed

echo
echo "bench: strategies $strategies, $(($(date +%s) - started)) s in all; reports in $out/{roundrobin,cold,hot,festival,rewards,rewards-lag}/report.md"
if [ "$status" = 0 ]; then
  echo "bench OK: money balanced and every run was made (shedding and strategies without a confirmed rate are listed in each step's verdict)"
else
  echo "bench FAILED in ${failed[*]}: money wrong or a run not made (see each step's Problems)"
fi
exit "$status"
