#!/usr/bin/env bash
# Three regions on loopback, each its own Redis and one leasegate, with a
# 75 ms relay (bench/relay.py) between the other two regions and the
# primary's link.
#
#   bench/regions.sh [seconds per run] [connections per region] [link latency ms]
#
# Shares: us-east 0.5 (the primary), eu-central 0.3, ap-south 0.2. Three
# routes, each with its own global limit (one key, `by = ["route"]`):
#   /steady  a limit no load reaches: per-region throughput and p99, and
#            link messages per second (the link should carry none);
#   /surge   30000/min: wrk on eu-central only, well past its slice (9000):
#            time from the surge's start to the transfer credited, and
#            global admitted against the allowance;
#   /part    30000/min with the link cut (hanging): all three regions
#            surge; admitted against the allowance, p99, errors.
# Installs wrk and redis-server from the system packages if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

DURATION=${1:-8}
CONNS=${2:-16}
LATENCY=${3:-75}
BASE=18500
SURGE_RATE=30000

need_tools wrk:wrk redis-server:redis-server redis-cli:redis-tools curl:curl python3:python3
cargo build --release --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/leasegate

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

names=(us-east eu-central ap-south)
shares=(0.5 0.3 0.2)
redis_port() { echo $((BASE + 10 * $1)); }
http_port() { echo $((BASE + 10 * $1 + 1)); }
admin_port() { echo $((BASE + 10 * $1 + 2)); }
link_port() { echo $((BASE + 10 * $1 + 3)); }
RELAY_PORT=$((BASE + 40))

for i in 0 1 2; do
  redis-server --port "$(redis_port $i)" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
  pids+=($!)
done
for i in 0 1 2; do
  for _ in $(seq 50); do redis-cli -p "$(redis_port $i)" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
python3 bench/relay.py "$RELAY_PORT" "127.0.0.1:$(link_port 0)" "$LATENCY" "$work/links" &
relay=$!
pids+=($relay)

for i in 0 1 2; do
  primary=""
  [ "$i" -gt 0 ] && primary="primary = \"http://127.0.0.1:$RELAY_PORT\""
  cat > "$work/gw-$i.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
instance_id = "${names[$i]}"
[listeners]
http = "127.0.0.1:$(http_port $i)"
admin = "127.0.0.1:$(admin_port $i)"
[store]
backend = "redis"
url = "redis://127.0.0.1:$(redis_port $i)"
timeout_ms = 5
[region]
name = "${names[$i]}"
share = ${shares[$i]}
link = "127.0.0.1:$(link_port $i)"
$primary
rebalance_at = 0.8
rebalance_window_ms = 20000
[[routes]]
name = "steady"
path_prefix = "/steady"
response = { status = 200, body = "ok" }
limits = ["steady"]
[[routes]]
name = "surge"
path_prefix = "/surge"
response = { status = 200, body = "ok" }
limits = ["surge"]
[[routes]]
name = "part"
path_prefix = "/part"
response = { status = 200, body = "ok" }
limits = ["part"]
[[limits]]
name = "steady"
rate = "100000000/s"
by = ["route"]
[[limits]]
name = "surge"
rate = "$SURGE_RATE/min"
by = ["route"]
[[limits]]
name = "part"
rate = "$SURGE_RATE/min"
by = ["route"]
CONF
  LEASEGATE_LOG=warn "$BIN" run --config "$work/gw-$i.toml" > /dev/null 2> "$work/gw-$i.log" &
  pids+=($!)
done
for i in 0 1 2; do
  for _ in $(seq 100); do curl -fsS -o /dev/null "http://127.0.0.1:$(admin_port $i)/metrics" 2>/dev/null && break; sleep 0.1; done
done

links() { cat "$work/links" 2>/dev/null || echo 0; }
for _ in $(seq 50); do [ -s "$work/links" ] && break; sleep 0.1; done
metric() { # region-index metric-line-prefix
  curl -fsS "http://127.0.0.1:$(admin_port "$1")/metrics" | awk -v m="$2" 'index($0, m) == 1 {print $NF; found = 1} END {if (!found) print 0}'
}

# wrk_run INDEX PATH -> writes $work/wrk-INDEX.out
wrk_run() { wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$(http_port "$1")$2" > "$work/wrk-$1.out"; }
# summary INDEX -> "rps p99_ms requests non2xx"
summary() {
  awk -v p99="$(wrk_p99_ms "$work/wrk-$1.out")" '
    /^Requests\/sec:/ {rps = $2}
    /requests in/ {reqs = $1}
    /Non-2xx/ {bad = $5}
    END {printf "%.0f %.2f %d %d\n", rps, p99, reqs, bad}' "$work/wrk-$1.out"
}

echo "## Steady load below every threshold (/steady, ${DURATION}s, $CONNS connections per region)"
echo
echo "| region | share | requests/s | p99 ms |"
echo "|---|---|---|---|"
before=$(links)
wrks=()
for i in 0 1 2; do wrk_run "$i" /steady & wrks+=($!); done
wait "${wrks[@]}"
for i in 0 1 2; do
  read -r rps p99 _ _ < <(summary "$i")
  echo "| ${names[$i]} | ${shares[$i]} | $rps | $p99 |"
done
after=$(links)
echo
echo "Link connections (one per message) during the run: $((after - before)), $(awk -v n=$((after - before)) -v d="$DURATION" 'BEGIN {printf "%.2f", n / d}')/s."
echo

echo "## Surge in eu-central (/surge, limit $SURGE_RATE/min, slice $(awk -v s=$SURGE_RATE 'BEGIN {print int(s * 0.3)}'), link ${LATENCY} ms each way)"
echo
before=$(links)
granted0=$(metric 1 'leasegate_region_transfers_total{result="granted"}')
started=$(date +%s.%N)
wrk_run 1 /surge &
surge=$!
took=""
while kill -0 "$surge" 2>/dev/null; do
  if [ -z "$took" ] && [ "$(metric 1 'leasegate_region_transfers_total{result="granted"}')" != "$granted0" ]; then
    took=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", (b - a) * 1000}')
  fi
  sleep 0.01
done
wait "$surge" || true
ended=$(date +%s.%N)
read -r rps p99 reqs bad < <(summary 1)
admitted=$((reqs - bad))
el=$(awk -v a="$started" -v b="$ended" 'BEGIN {print b - a}')
echo "| measure | value |"
echo "|---|---|"
echo "| eu-central requests/s, p99 ms | $rps, $p99 |"
echo "| time from surge start to transfer credited (polled every 10 ms) | ${took:-none} ms |"
echo "| transfers granted (eu-central) | $(( $(metric 1 'leasegate_region_transfers_total{result="granted"}') - granted0 )) |"
echo "| link connections during the surge | $(( $(links) - before )) |"
awk -v a="$admitted" -v s="$SURGE_RATE" -v el="$el" 'BEGIN {
  allowance = s + s * el / 60
  printf "| admitted (all in eu-central) / global allowance (burst + rate × %.1f s) | %d / %.0f = %.3f |\n", el, a, allowance, a / allowance
  printf "| eu-central slice alone would have admitted at most | %.0f |\n", 0.3 * allowance
}'
echo

echo "## Partition: the link hangs, all three regions surge (/part, limit $SURGE_RATE/min)"
echo
kill -USR1 "$relay"
errors0=$(metric 1 'leasegate_region_transfers_total{result="error"}')
started=$(date +%s.%N)
wrks=()
for i in 0 1 2; do wrk_run "$i" /part & wrks+=($!); done
wait "${wrks[@]}"
ended=$(date +%s.%N)
el=$(awk -v a="$started" -v b="$ended" 'BEGIN {print b - a}')
echo "| region | requests/s | p99 ms | admitted | slice allowance |"
echo "|---|---|---|---|---|"
total=0
for i in 0 1 2; do
  read -r rps p99 reqs bad < <(summary "$i")
  total=$((total + reqs - bad))
  echo "| ${names[$i]} | $rps | $p99 | $((reqs - bad)) | $(awk -v s=$SURGE_RATE -v sh="${shares[$i]}" -v el="$el" 'BEGIN {printf "%.0f", sh * (s + s * el / 60)}') |"
done
awk -v a="$total" -v s="$SURGE_RATE" -v el="$el" 'BEGIN {
  allowance = s + s * el / 60
  printf "\nGlobal admitted %d against the allowance %.0f (%.3f) during %.1f s of partition.\n", a, allowance, a / allowance, el }'
echo "Transfers given up in eu-central (retried until their window ends, then counted error): $(( $(metric 1 'leasegate_region_transfers_total{result="error"}') - errors0 )); link_up: eu-central $(metric 1 'leasegate_region_link_up{'), ap-south $(metric 2 'leasegate_region_link_up{')."
echo "Gateway 5xx answers: $(for i in 0 1 2; do curl -fsS "http://127.0.0.1:$(admin_port $i)/metrics" | awk '/^leasegate_requests_total\{.*status="5/ {n += $NF} END {printf "%d ", n + 0}'; done)(us-east eu-central ap-south)"
kill -USR2 "$relay"
echo
echo "wrk -t1 -c$CONNS -d${DURATION}s per region; link latency ${LATENCY} ms each way (bench/relay.py); $(nproc) CPUs, $(uname -r); redis $(redis-server --version | awk '{print $3}')"
