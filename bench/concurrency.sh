#!/usr/bin/env bash
# Store calls per request of an in-flight limit under steady load: two
# leasegate instances on one Redis in front of an upstream that takes
# UPSTREAM_MS per request, a concurrency limit (max MAX, one key for the
# route) and, for reference, the same load on a token bucket. Load:
# THREADS client threads split over the instances, each on one keep-alive
# connection, for SECONDS. Reports requests, 429s, the largest number in
# flight the upstream saw, Redis script calls (INFO commandstats) and the
# gateways' store calls (leasegate_store_calls_total) per request.
#
#   bench/concurrency.sh [seconds] [threads] [max]
#
# Installs redis-server from the system packages if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

SECONDS_=${1:-10}
THREADS=${2:-16}
MAX=${3:-24}
UPSTREAM_MS=${UPSTREAM_MS:-20}
REDIS_PORT=18690
BASE_PORT=18700
UPSTREAM_PORT=18799

need_tools redis-server:redis-server redis-cli:redis-tools python3:python3
cargo build --release --quiet

bench_work
redis-server --port $REDIS_PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null & pids+=($!)
for _ in $(seq 50); do redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
python3 bench/concurrency.py upstream $UPSTREAM_PORT "$UPSTREAM_MS" & pids+=($!)
script_calls() {
  redis-cli -p $REDIS_PORT info commandstats |
    awk -F'[=:,]' '/^cmdstat_(evalsha|eval):/ {n += $3} END {print n + 0}'
}
store_calls() {
  local total=0 i
  for i in 0 1; do
    n=$(curl -s "http://127.0.0.1:$((BASE_PORT + 2 * i + 1))/metrics" |
      awk '/^leasegate_store_calls_total/ {n += $2} END {print n + 0}')
    total=$((total + n))
  done
  echo $total
}

run() { # NAME LABEL LIMIT-LINES
  local gw=() i
  for i in 0 1; do
    cat > "$work/$1-$i.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
[listeners]
http = "127.0.0.1:$((BASE_PORT + 2 * i))"
admin = "127.0.0.1:$((BASE_PORT + 2 * i + 1))"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT"
[[upstreams]]
name = "backend"
targets = ["http://127.0.0.1:$UPSTREAM_PORT"]
[[routes]]
name = "api"
path_prefix = "/"
upstream = "backend"
limits = ["inflight"]
[[limits]]
name = "inflight"
by = ["route"]
$3
CONF
    LEASEGATE_LOG=warn target/release/leasegate run --config "$work/$1-$i.toml" >/dev/null 2>"$work/$1-$i.log" & gw+=($!)
  done
  for i in 0 1; do
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$((BASE_PORT + 2 * i + 1))/healthz" >/dev/null && break; sleep 0.05; done
  done
  sleep 1
  local s0 c0 out
  s0=$(script_calls); c0=$(store_calls)
  out=$(python3 bench/concurrency.py load "$((BASE_PORT)),$((BASE_PORT + 2))" "$THREADS" "$SECONDS_" $UPSTREAM_PORT)
  local s1 c1
  s1=$(script_calls); c1=$(store_calls)
  kill "${gw[@]}"; wait "${gw[@]}" 2>/dev/null || true
  echo "$out" | awk -v name="$2" -v s=$((s1 - s0)) -v c=$((c1 - c0)) '
    { req = $1; refused = $2; peak = $3 }
    END { printf "%-22s %9d %7d %6d %10d %8.4f %10d %8.4f\n", name, req, refused, peak, s, s / req, c, c / req }'
}

printf "%-22s %9s %7s %6s %10s %8s %10s %8s\n" limit requests 429s peak redis_calls per_req store_calls per_req
run concurrency "concurrency max=$MAX" "algorithm = \"concurrency\"
max = $MAX"
run bucket "token_bucket 100000/s" "rate = \"100000/s\""
