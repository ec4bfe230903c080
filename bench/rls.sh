#!/usr/bin/env bash
# Envoy's rate limit service (RLS v3 ShouldRateLimit) on leasegate, with
# leasing against the per-request design envoyproxy/ratelimit uses (one
# Redis script call per decision: leasing min = max = 1), alternating in one
# run.
#
#   bench/rls.sh [seconds per run] [rounds] [concurrency] [keys]
#
# BIN=path runs another leasegate build (default: the release build of
# this checkout), so two builds can be alternated run by run.
#
# PROFILE=N: one round of the leasing design only, with the gateway under
# `perf record -g` from the load's second second to three seconds before its
# end; prints the table and the N top symbols (perf report --no-children).
# Issue 27 (docs/benchmarks.md): `PROFILE=30 bench/rls.sh 10 1 8 100`.
#
# Pinning: leasegate on CPU 0 (its gRPC service runs on one thread), Redis
# and the load client (examples/rls_load.rs: one HTTP/2 connection per
# concurrent caller, as Envoys would hold) on CPU 1. Every descriptor
# matches one rule whose limit no call reaches, so every decision is a
# full one (matched, counted, OK). Reports decisions/s and p50/p99 from the
# client, Redis script calls per decision (INFO commandstats), and decisions
# per Redis CPU second (INFO cpu): medians with min-max over the rounds.
# Installs redis-server if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

DURATION=${1:-8}
ROUNDS=${2:-3}
CONC=${3:-32}
KEYS=${4:-100}
BIN=${BIN:-./target/release/leasegate}
REDIS_PORT=18490
RLS_PORT=18491
HTTP_PORT=18492

need_tools redis-server:redis-server redis-cli:redis-tools taskset:util-linux
PROFILE=${PROFILE:-}
if [ -n "$PROFILE" ]; then
  need_tools perf:linux-perf
  ROUNDS=1
fi
cargo build --release --quiet --bin leasegate --example rls_load

work=$(mktemp -d)
pids=()
gw=""
cleanup() {
  [ -n "$gw" ] && kill "$gw" 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

taskset -c 1 redis-server --port $REDIS_PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
pids+=($!)
for _ in $(seq 50); do redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && break; sleep 0.1; done

cat > "$work/ratelimit.yaml" <<'YAML'
domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100000000}
YAML

config() { # name leasing
  cat > "$work/$1.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
[listeners]
http = "127.0.0.1:$HTTP_PORT"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT"
timeout_ms = 5
[leasing]
$2
[rls]
listen = "127.0.0.1:$RLS_PORT"
config = "ratelimit.yaml"
[[routes]]
name = "all"
path_prefix = "/"
response = { status = 200, body = "ok" }
CONF
}
config leased 'min = 5
max = 500'
config per_request 'min = 1
max = 1
max_block_ms = 1'

script_calls() {
  redis-cli -p $REDIS_PORT info commandstats |
    awk -F'[=:,]' '/^cmdstat_(evalsha|eval):/ {n += $3} END {print n + 0}'
}
redis_cpu() {
  redis-cli -p $REDIS_PORT info cpu |
    awk -F: '/^used_cpu_(sys|user):/ {n += $2} END {printf "%.3f", n}'
}

# run NAME -> appends "per_sec p50 p99 calls_per_decision decisions_per_redis_cpu_s" to $work/NAME.rows
run() {
  taskset -c 0 env LEASEGATE_LOG=warn "$BIN" run --config "$work/$1.toml" &
  gw=$!
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$RLS_PORT) 2>/dev/null && break; sleep 0.1; done
  redis-cli -p $REDIS_PORT flushall >/dev/null
  # Warm-up: connections, leases.
  taskset -c 1 ./target/release/examples/rls_load "127.0.0.1:$RLS_PORT" 1 "$CONC" "$KEYS" >/dev/null
  local calls0 cpu0 out calls1 cpu1
  calls0=$(script_calls)
  cpu0=$(redis_cpu)
  local profiler=""
  if [ -n "$PROFILE" ]; then
    (sleep 1; perf record -q -F 2000 -g -p "$gw" -o "$work/perf.data" -- sleep $((DURATION > 5 ? DURATION - 4 : 1)) 2>/dev/null) &
    profiler=$!
  fi
  out=$(taskset -c 1 ./target/release/examples/rls_load "127.0.0.1:$RLS_PORT" "$DURATION" "$CONC" "$KEYS")
  [ -z "$profiler" ] || wait "$profiler"
  calls1=$(script_calls)
  cpu1=$(redis_cpu)
  kill -TERM "$gw"
  wait "$gw" 2>/dev/null || true
  gw=""
  echo "$out" | awk -v calls=$((calls1 - calls0)) -v cpu="$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN {print b - a}')" '{
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    if (v["errors"] > 0) { print "errors: " v["errors"] > "/dev/stderr" }
    dpc = (cpu > 0) ? v["decisions"] / cpu : 0
    printf "%s %s %s %.4f %.0f\n", v["per_sec"], v["p50_ms"], v["p99_ms"], calls / v["decisions"], dpc
  }' >> "$work/$1.rows"
}

designs=(leased per_request)
[ -z "$PROFILE" ] || designs=(leased)
for r in $(seq "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  for d in "${designs[@]}"; do run "$d"; done
done

# col FILE N -> "median (min-max)" of column N
col() { awk -v c="$2" '{print $c}' "$1" | med; }

echo
echo "ShouldRateLimit, $CONC concurrent callers, $KEYS keys, ${DURATION}s x $ROUNDS rounds (median (min-max)):"
echo
echo "| design | decisions/s | p50 ms | p99 ms | Redis calls per decision | decisions per Redis CPU second |"
echo "|---|---|---|---|---|---|"
for name in "${designs[@]}"; do
  label=$([ "$name" = leased ] && echo "leasegate, leasing (default [leasing])" || echo "one store call per decision (min = max = 1)")
  echo "| $label | $(col "$work/$name.rows" 1) | $(col "$work/$name.rows" 2) | $(col "$work/$name.rows" 3) | $(col "$work/$name.rows" 4) | $(col "$work/$name.rows" 5) |"
done
if [ -n "$PROFILE" ]; then
  echo
  perf report -i "$work/perf.data" --no-children --sort symbol --stdio 2>/dev/null | grep -E "^ +[0-9]" | sed -E "s/[[:space:]]+-[[:space:]]+-[[:space:]]*$//" | head -"$PROFILE"
fi
