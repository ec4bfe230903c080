#!/usr/bin/env bash
# A fleet of leasegate instances sharing one Redis, against the same fleet on
# the embedded store, a single instance, and the per-request approach (one
# Redis script call per request: leasing min = max = 1).
#
#   bench/fleet.sh [seconds per run] [instances] [connections per instance]
#
# Every instance serves a direct response (no upstream: this measures the
# gateway and its limiter) with one limit on one hot key shared by the whole
# fleet. Load: one wrk per instance, all at once. Reports requests/s (sum),
# the worst p99, Redis script calls per request (INFO commandstats), and, for
# a limit the load exceeds, requests admitted against the allowance.
# Installs wrk and redis-server from the system packages if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

DURATION=${1:-8}
INSTANCES=${2:-2}
CONNS=${3:-32}
REDIS_PORT=18390
BASE_PORT=18400

need_tools wrk:wrk redis-server:redis-server redis-cli:redis-tools
cargo build --release --quiet

work=$(mktemp -d)
pids=()
gw_pids=()
cleanup() {
  for p in "${gw_pids[@]}" "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

redis-server --port $REDIS_PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null & pids+=($!)
for _ in $(seq 50); do redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
script_calls() {
  redis-cli -p $REDIS_PORT info commandstats |
    awk -F'[=:,]' '/^cmdstat_(evalsha|eval):/ {n += $3} END {print n + 0}'
}

# config NAME STORE LEASING RATE -> writes $work/NAME-i.toml for each instance
config() {
  local name=$1 store=$2 leasing=$3 rate=$4 i
  for i in $(seq 0 $((INSTANCES - 1))); do
    cat > "$work/$name-$i.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
instance_id = "bench-$i"
[listeners]
http = "127.0.0.1:$((BASE_PORT + 2 * i))"
admin = "127.0.0.1:$((BASE_PORT + 2 * i + 1))"
[store]
$store
[leasing]
$leasing
[[routes]]
name = "hot"
path_prefix = "/"
response = { status = 200, body = "ok" }
limits = ["hot"]
[[limits]]
name = "hot"
rate = "$rate"
by = ["route"]
CONF
  done
}

start() { # name count
  local i
  gw_pids=()
  for i in $(seq 0 $(($2 - 1))); do
    LEASEGATE_LOG=warn ./target/release/leasegate run --config "$work/$1-$i.toml" & gw_pids+=($!)
  done
  for i in $(seq 0 $(($2 - 1))); do
    local port=$((BASE_PORT + 2 * i))
    for _ in $(seq 100); do curl -fsS -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null && break; sleep 0.1; done
  done
}

# A metric summed over the running instances' /metrics.
fleet_sum() { # series
  local i n=0
  for i in $(seq 0 $((${#gw_pids[@]} - 1))); do
    n=$((n + $(admin_sum $((BASE_PORT + 2 * i + 1)) "$1")))
  done
  echo $n
}
# Requests admitted by fallback buckets (store timeouts, errors, open circuit).
bypassed() { fleet_sum rate_limit_bypassed_total; }
# Acquires and releases, every result: what `leasegate simulate` counts.
store_calls() { fleet_sum leasegate_store_calls_total; }

stop() {
  for p in "${gw_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${gw_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  gw_pids=()
}

# load count -> "rps p99_ms requests non2xx elapsed_s"
load() {
  local i started ended wrks=()
  started=$(date +%s.%N)
  for i in $(seq 0 $(($1 - 1))); do
    wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$((BASE_PORT + 2 * i))/" > "$work/wrk-$i.out" &
    wrks+=($!)
  done
  wait "${wrks[@]}"
  ended=$(date +%s.%N)
  cat "$work"/wrk-*.out | awk -v el="$(awk -v a="$started" -v b="$ended" 'BEGIN {print b - a}')" \
    -v p99="$(wrk_p99_ms "$work"/wrk-*.out)" '
    /^Requests\/sec:/ {rps += $2}
    /requests in/ {reqs += $1}
    /Non-2xx/ {bad += $5}
    END {printf "%.0f %.2f %d %d %.2f\n", rps, p99, reqs, bad, el}'
  rm -f "$work"/wrk-*.out
}

REDIS="backend = \"redis\"
url = \"redis://127.0.0.1:$REDIS_PORT\"
timeout_ms = 5
fleet_size = $INSTANCES"
MEMORY='backend = "memory"'
LEASING='min = 5
max = 500
lookahead_ms = 250
ttl_ms = 1000'
PER_REQUEST='min = 1
max = 1
max_block_ms = 1'
HIGH="100000000/s"

echo "| fleet | requests/s (sum) | worst p99 ms | Redis calls per request | store calls/s (gateways' count) | bypassed (store failures) |"
echo "|---|---|---|---|---|---|"
row() { # label name count
  local before after rps p99 reqs bad el skipped calls
  start "$2" "$3"
  load "$3" >/dev/null   # warm-up
  before=$(script_calls)
  skipped=$(bypassed)
  calls=$(store_calls)
  read -r rps p99 reqs bad el < <(load "$3")
  after=$(script_calls)
  skipped=$(($(bypassed) - skipped))
  calls=$(($(store_calls) - calls))
  stop
  echo "| $1 | $rps | $p99 | $(awk -v c=$((after - before)) -v n="$reqs" 'BEGIN {printf "%.4f", c / n}') | $(awk -v c=$calls -v el="$el" 'BEGIN {printf "%.1f", c / el}') | $skipped |"
}
config memory "$MEMORY" "$LEASING" "$HIGH"
row "1 instance, memory store" memory 1
row "$INSTANCES instances, memory store each" memory "$INSTANCES"
config leased "$REDIS" "$LEASING" "$HIGH"
row "$INSTANCES instances, one Redis, leased" leased "$INSTANCES"
config perreq "$REDIS" "$PER_REQUEST" "$HIGH"
row "$INSTANCES instances, one Redis, one call per request" perreq "$INSTANCES"

# Accuracy: a limit the load exceeds several times over.
LIMIT=${LIMIT:-5000}
config limited "$REDIS" "$LEASING" "$LIMIT/s"
redis-cli -p $REDIS_PORT flushall >/dev/null
start limited "$INSTANCES"
# The probes of start() took a few tokens; count from a fresh bucket.
redis-cli -p $REDIS_PORT flushall >/dev/null
calls=$(store_calls)
read -r rps p99 reqs bad el < <(load "$INSTANCES")
skipped=$(bypassed)
calls=$(($(store_calls) - calls))
stop
admitted=$((reqs - bad))
echo
echo "Limit $LIMIT/s (burst $LIMIT) on one key across $INSTANCES instances, ${el}s of load at $rps req/s:"
awk -v a="$admitted" -v l="$LIMIT" -v el="$el" -v n="$INSTANCES" 'BEGIN {
  allowance = l + l * el
  printf "admitted %d, allowance %.0f (burst + rate × time), admitted/allowance %.3f, bound allowance + %d × 500 = %.0f\n",
    a, allowance, a / allowance, n, allowance + n * 500 }'
echo "of which admitted by fallback buckets while the store was failing: $skipped"
awk -v c=$calls -v el="$el" -v a="$admitted" 'BEGIN {printf "store calls %d: %.1f/s, %.4f per admitted request\n", c, c / el, c / a}'
echo "offered $reqs requests: $(awk -v r="$reqs" -v el="$el" 'BEGIN {printf "%.0f", r / el}')/s (leasegate simulate --offered)"

# The same limit on one instance with the embedded store (no round trip):
# `leasegate simulate --instances 1 --store-rtt-ms 0` models this one.
config limitedmem "$MEMORY" "$LEASING" "$LIMIT/s"
start limitedmem 1   # its probe took one token of the burst
calls=$(store_calls)
read -r rps p99 reqs bad el < <(load 1)
calls=$(($(store_calls) - calls))
stop
echo
echo "Limit $LIMIT/s on 1 instance, memory store, ${el}s at $rps req/s: admitted $((reqs - bad)),"
awk -v c=$calls -v el="$el" -v r="$reqs" 'BEGIN {printf "store calls %d: %.1f/s; offered %.0f/s\n", c, c / el, r / el}'
echo
echo "wrk -t1 -c$CONNS -d${DURATION}s per instance; $(nproc) CPUs, $(uname -r); redis $(redis-server --version | awk '{print $3}')"
