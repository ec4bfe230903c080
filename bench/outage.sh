#!/usr/bin/env bash
# Request latency while Redis is healthy, frozen (SIGSTOP: calls hang) and
# dead (SIGKILL: calls are refused), on a fail-open and a fail-closed route.
# The gap between the healthy p99 and the outage p99 must stay within the
# store deadline (timeout_ms): the guard answers every request in time.
#
#   bench/outage.sh [seconds per phase] [connections]
#
# One leasegate instance (one worker), one Redis, wrk on each route at once.
# Small leases (min = max = 1) so that every request needs the store: the
# worst case for an outage. Installs wrk and redis-server if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

DURATION=${1:-8}
CONNS=${2:-16}
REDIS_PORT=18490 PORT=18491 ADMIN=18492

need_tools wrk:wrk redis-server:redis-server redis-cli:redis-tools curl:curl
cargo build --release --quiet

work=$(mktemp -d)
pids=()
redis_pid=""
cleanup() {
  [ -n "$redis_pid" ] && kill -CONT "$redis_pid" 2>/dev/null || true
  for p in "${pids[@]}" $redis_pid; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

redis-server --port $REDIS_PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
redis_pid=$!
for _ in $(seq 50); do redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && break; sleep 0.1; done

cat > "$work/gateway.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
[listeners]
http = "127.0.0.1:$PORT"
admin = "127.0.0.1:$ADMIN"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT"
timeout_ms = 5
[leasing]
min = 1
max = 1
[[routes]]
name = "open"
path_prefix = "/open"
response = { status = 200, body = "ok" }
limits = ["roomy"]
on_store_failure = "allow"
[[routes]]
name = "closed"
path_prefix = "/closed"
response = { status = 200, body = "ok" }
limits = ["roomy"]
on_store_failure = "deny"
[[limits]]
name = "roomy"
rate = "100000000/s"
by = ["route"]
CONF
LEASEGATE_LOG=error ./target/release/leasegate run --config "$work/gateway.toml" & pids+=($!)
for _ in $(seq 100); do curl -fsS -o /dev/null "http://127.0.0.1:$PORT/open" 2>/dev/null && break; sleep 0.1; done

codes() { awk '/Non-2xx/ {print $5} END {}' "$1" | head -1; }

phase() { # label
  wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$PORT/open" > "$work/open.out" &
  local a=$!
  wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$PORT/closed" > "$work/closed.out" &
  local b=$!
  wait $a $b
  local ro rc
  ro=$(awk '/^Requests\/sec:/ {print $2}' "$work/open.out")
  rc=$(awk '/^Requests\/sec:/ {print $2}' "$work/closed.out")
  echo "| $1 | $ro | $(wrk_p99_ms "$work/open.out") | $(wrk_max_ms "$work/open.out") | $(codes "$work/open.out") | $rc | $(wrk_p99_ms "$work/closed.out") | $(wrk_max_ms "$work/closed.out") | $(codes "$work/closed.out") |"
}

echo "| phase | open: req/s | open: p99 ms | open: max ms | open: non-2xx | closed: req/s | closed: p99 ms | closed: max ms | closed: non-2xx (503) |"
echo "|---|---|---|---|---|---|---|---|---|"
phase "Redis healthy"
kill -STOP "$redis_pid"
phase "Redis frozen (SIGSTOP)"
kill -CONT "$redis_pid"
sleep 3
phase "Redis healthy again"
kill -KILL "$redis_pid"; wait "$redis_pid" 2>/dev/null || true; redis_pid=""
phase "Redis dead (SIGKILL)"
echo
curl -fsS "http://127.0.0.1:$ADMIN/metrics" | grep -E '^(rate_limit_bypassed_total|leasegate_store_calls_total|leasegate_circuit_open)' | sed 's/^/    /'
echo
echo "wrk -t1 -c$CONNS -d${DURATION}s on each route at once; timeout_ms = 5, breaker 3 failures / 2000 ms; $(nproc) CPUs, $(uname -r)"
