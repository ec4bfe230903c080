#!/usr/bin/env bash
# The TLS path: leasegate against nginx and hyper's floor behind rustls,
# like with like, alternating in one run:
#
#   h2 over TLS      h2load -c CONNS -m10 for SECONDS on long-lived
#                    connections (what an API client's pool does)
#   new connections  one TLS handshake (ECDSA P-256, TLS 1.3, ALPN h2) and
#                    one request per connection, BATCH connections at a
#                    time, for SECONDS (what a fleet of short-lived clients
#                    does; `openssl s_time -new`, one handshake at a time,
#                    is its own bottleneck at 600-800/s)
#
# Each proxy is pinned to CPU 0 (nginx: one worker; leasegate: workers = 1;
# the floor: examples/hyper_floor.rs `tls`, hyper behind rustls with
# aws-lc, as leasegate serves), the upstream (nginx, a fixed 200) and
# h2load to CPU 1. Besides requests (or connections) per second, each run
# reports the proxy's own CPU per request (per connection): when the proxy
# is not busy the whole run, the client was the bottleneck, and the CPU
# column is the fair comparison.
#
#   bench/tls.sh [seconds per run] [rounds] [connections] [batch] [out dir]
#
# Prints markdown tables: per target, medians with min-max over the
# rounds; per measure, leasegate ÷ nginx and leasegate ÷ floor (the ratio
# of each round). Installs nginx and h2load if missing (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

DURATION=${1:-8}
ROUNDS=${2:-5}
CONNS=${3:-32}
BATCH=${4:-200}
OUT=${5:-bench/out}
UP_PORT=18281
declare -A PORT=([nginx]=18282 [leasegate]=18283 [hyper]=18284)
ADMIN=18290

need_tools nginx:nginx curl:curl h2load:nghttp2-client taskset:util-linux
if [ "$(nproc)" -lt 2 ]; then
  echo "bench/tls.sh needs at least 2 CPUs (proxy on one, load and upstream on the other)" >&2
  exit 1
fi
cargo build --release --quiet --bin leasegate --example hyper_floor
mkdir -p "$OUT"
bench_work
declare -A PID

nginx_conf upstream "$(ok_server "$UP_PORT")"
taskset -c 1 nginx -p "$work/upstream" -c "$work/upstream/nginx.conf" &
pids+=($!)
nginx_conf nginx "upstream backend { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server { listen 127.0.0.1:${PORT[nginx]} ssl http2;
    ssl_certificate $PWD/certs/dev.crt; ssl_certificate_key $PWD/certs/dev.key;
    ssl_protocols TLSv1.3; ssl_session_cache off; ssl_session_tickets off;
    location / { proxy_pass http://backend; proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme; } }"
taskset -c 0 nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" &
pids+=($!)
PID[nginx]=$!

leasegate_toml "https = \"127.0.0.1:${PORT[leasegate]}\"" "$ADMIN" off "100000000/s" "$UP_PORT" "$PWD/certs" \
  > "$work/leasegate.toml"
LEASEGATE_LOG=warn taskset -c 0 ./target/release/leasegate run --config "$work/leasegate.toml" > /dev/null &
pids+=($!)
PID[leasegate]=$!

taskset -c 0 ./target/release/examples/hyper_floor tls "${PORT[hyper]}" "$UP_PORT" \
  "$PWD/certs/dev.crt" "$PWD/certs/dev.key" 2>/dev/null &
pids+=($!)
PID[hyper]=$!

for n in nginx leasegate hyper; do
  ok=
  for _ in $(seq 100); do
    if [ "$(curl -sk -o /dev/null -w '%{http_code}' --http2 "https://127.0.0.1:${PORT[$n]}/")" = 200 ]; then
      ok=1
      break
    fi
    sleep 0.1
  done
  [ -n "$ok" ] || { echo "$n does not answer 200 on https://127.0.0.1:${PORT[$n]}/" >&2; exit 1; }
done

# CPU ticks (user+system) used so far by a pid and its children.
ticks() {
  local t=0 q
  for q in $1 $(pgrep -P "$1" || true); do
    [ -r "/proc/$q/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$q/stat")))
  done
  echo $t
}
HZ=$(getconf CLK_TCK)

# h2load_ok FILE: how many requests h2load made, all of them 2xx, or exit.
h2load_ok() {
  local reqs ok
  reqs=$(awk '/^requests:/ {print $2}' "$1")
  ok=$(awk '/^status codes:/ {print $3}' "$1")
  if [ -z "$reqs" ] || [ "$reqs" = 0 ] || [ "$ok" != "$reqs" ]; then
    echo "h2load: $ok of ${reqs:-?} answers were 2xx" >&2
    cat "$1" >&2
    exit 1
  fi
  echo "$reqs"
}

# run NAME MEASURE -> "per_second cpu_us_each busy_percent"
run() {
  local name=$1 measure=$2 url="https://127.0.0.1:${PORT[$1]}/" pid=${PID[$1]}
  local before after start end count=0 n
  before=$(ticks "$pid")
  start=$(date +%s.%N)
  case $measure in
    h2)
      taskset -c 1 h2load -t1 -c"$CONNS" -m10 -D"$DURATION" "$url" > "$work/load.out" 2>&1
      count=$(h2load_ok "$work/load.out")
      ;;
    new)
      # Batches of BATCH clients, each one handshake and one request,
      # until SECONDS have passed.
      local until
      until=$(awk -v s="$start" -v d="$DURATION" 'BEGIN {printf "%.3f", s + d}')
      while awk -v now="$(date +%s.%N)" -v u="$until" 'BEGIN {exit !(now < u)}'; do
        taskset -c 1 h2load -t1 -c"$BATCH" -n"$BATCH" -m1 "$url" > "$work/load.out" 2>&1
        n=$(h2load_ok "$work/load.out")
        count=$((count + n))
      done
      ;;
  esac
  end=$(date +%s.%N)
  after=$(ticks "$pid")
  awk -v c="$count" -v s="$start" -v e="$end" -v t=$((after - before)) -v hz="$HZ" 'BEGIN {
    secs = e - s; cpu = t / hz
    printf "%.1f %.1f %.0f\n", c / secs, cpu * 1e6 / c, 100 * cpu / secs
  }'
}

names=(nginx hyper leasegate)
for n in "${names[@]}"; do run "$n" h2 >/dev/null; run "$n" new >/dev/null; done # warm-up
: > "$work/rows"
for r in $(seq "$ROUNDS"); do
  order=("${names[@]}")
  [ $((r % 2)) -eq 0 ] && order=(leasegate hyper nginx)
  for m in h2 new; do
    for n in "${order[@]}"; do
      read -r rate cpu busy < <(run "$n" "$m")
      echo "$r $m $n $rate $cpu $busy" >> "$work/rows"
      echo "round $r $m $n: $rate/s, proxy CPU $cpu us each, busy $busy %" >&2
    done
  done
done
cp "$work/rows" "$OUT/tls.rows"

python3 - "$OUT" "$ROUNDS" "$DURATION" "$CONNS" "$BATCH" <<'PY'
import sys, statistics, collections
out, rounds, duration, conns, batch = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
by = collections.defaultdict(dict)
for r, m, n, rate, cpu, busy in (l.split() for l in open(f"{out}/tls.rows")):
    by[(m, n)][int(r)] = (float(rate), float(cpu), float(busy))
def stat(v):
    m = statistics.median(v)
    return f"{m:,.0f} ({min(v):,.0f}–{max(v):,.0f})" if m >= 100 else f"{m:,.1f} ({min(v):,.1f}–{max(v):,.1f})"
label = {"h2": f"h2 over TLS, {conns} connections × 10 streams (requests/s)",
         "new": f"new TLS connections, {batch} at a time, one request each (connections/s)"}
print("\n| measure | target | per second | proxy CPU µs each | proxy busy % |\n|---|---|---|---|---|")
for m in ("h2", "new"):
    for n in ("nginx", "hyper", "leasegate"):
        v = by[(m, n)].values()
        print(f"| {label[m]} | {n} | {stat([x[0] for x in v])} | {stat([x[1] for x in v])} | {stat([x[2] for x in v])} |")
def ratio(m, a, b, i):
    return [by[(m, a)][r][i] / by[(m, b)][r][i] for r in by[(m, b)] if r in by[(m, a)]]
def spread(rs):
    return f"{statistics.median(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})"
print("\n| measure | leasegate ÷ nginx, per second | leasegate ÷ floor, per second | nginx ÷ leasegate, CPU each | floor ÷ leasegate, CPU each |\n|---|---|---|---|---|")
for m in ("h2", "new"):
    print(f"| {label[m]} | {spread(ratio(m, 'leasegate', 'nginx', 0))} | {spread(ratio(m, 'leasegate', 'hyper', 0))} "
          f"| {spread(ratio(m, 'nginx', 'leasegate', 1))} | {spread(ratio(m, 'hyper', 'leasegate', 1))} |")
print(f"\n{rounds} rounds of {duration} s; medians with min–max over the rounds; a CPU ratio above 1 means leasegate spends less CPU each.")
PY
echo
echo "proxies pinned to CPU 0, upstream and h2load to CPU 1; $(nproc) CPUs, $(uname -r); $(nginx -v 2>&1); $(h2load --version 2>&1 | head -1)"
