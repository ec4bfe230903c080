#!/usr/bin/env bash
# The TLS path: leasegate against nginx and hyper's floor, one run, rounds
# alternated, each target pinned to CPU 0 (nginx: one worker; leasegate:
# workers = 1), the upstream (nginx) and the client (h2load -t1) on CPU 1.
# The certificate is certs/dev.crt (ECDSA P-256) for all three.
#
#   bench/tls.sh [seconds per run] [rounds] [out dir]
#
# Two loads per target:
#   h2        h2load -c32 -m10 for SECONDS: 32 HTTP/2 connections with 10
#             streams each, kept open: the proxy path over TLS.
#   new conn  batches of BATCH (100) fresh connections, one request each
#             (h2load -c100 -n100 -m1, a new process per batch, so no
#             session is resumed), for SECONDS: full handshakes. The client
#             verifies each server's signature, which costs it more than
#             the server's signing, so connections/s can be the client's
#             figure; the proxy's CPU per connection (its /proc ticks over
#             connections made) is the server's own cost, whichever side
#             is the bottleneck.
# Targets: nginx-h2 (https http2 proxy), hyper-h2 (examples/hyper_floor.rs
# tls: hyper behind rustls with aws-lc, nothing else) and leasegate-h2 (one
# route, one limit every request passes, no access log).
#
# Reports, per target and load: requests (or connections)/s and the proxy's
# CPU µs per request (or connection), median (min–max) over the rounds, and
# leasegate ÷ nginx, leasegate ÷ floor per round, as markdown tables.
# Installs nginx and h2load (nghttp2-client) if missing (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

DURATION=${1:-8}
ROUNDS=${2:-5}
OUT=${3:-bench/out}
BATCH=${BATCH:-100}
UP_PORT=18281
declare -A PORT=([nginx-h2]=18282 [leasegate-h2]=18283 [hyper-h2]=18284)
ADMIN=18290

need_tools nginx:nginx curl:curl h2load:nghttp2-client taskset:util-linux
if [ "$(nproc)" -lt 2 ]; then
  echo "bench/tls.sh needs at least 2 CPUs (proxy on one, load and upstream on the other)" >&2
  exit 1
fi
if [ "$BATCH" -gt 200 ]; then
  echo "BATCH=$BATCH: at most 200 (leasegate's max_connections_per_ip is 256)" >&2
  exit 1
fi
cargo build --release --quiet --bin leasegate --example hyper_floor
mkdir -p "$OUT"
bench_work
declare -A PID

start_nginx() { # name cpu
  taskset -c "$2" nginx -p "$work/$1" -c "$work/$1/nginx.conf" &
  pids+=($!)
  PID[$1]=$!
}
nginx_conf upstream "$(ok_server "$UP_PORT")"
start_nginx upstream 1
nginx_conf nginx-h2 "upstream backend { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server { listen 127.0.0.1:${PORT[nginx-h2]} ssl http2;
    ssl_certificate $PWD/certs/dev.crt; ssl_certificate_key $PWD/certs/dev.key;
    location / { proxy_pass http://backend; proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme; } }"
start_nginx nginx-h2 0

leasegate_toml "https = \"127.0.0.1:${PORT[leasegate-h2]}\"" "$ADMIN" off "100000000/s" "$UP_PORT" "$PWD/certs" \
  > "$work/leasegate-h2.toml"
LEASEGATE_LOG=warn taskset -c 0 ./target/release/leasegate run --config "$work/leasegate-h2.toml" &
pids+=($!)
PID[leasegate-h2]=$!
taskset -c 0 ./target/release/examples/hyper_floor tls "${PORT[hyper-h2]}" "$UP_PORT" \
  "$PWD/certs/dev.crt" "$PWD/certs/dev.key" 2>/dev/null &
pids+=($!)
PID[hyper-h2]=$!

for n in nginx-h2 leasegate-h2 hyper-h2; do
  ok=
  for _ in $(seq 100); do
    if [ "$(curl -sk -o /dev/null -w '%{http_code}' --http2 "https://127.0.0.1:${PORT[$n]}/")" = 200 ]; then ok=1; break; fi
    sleep 0.1
  done
  [ -n "$ok" ] || { echo "$n: no 200 over https" >&2; exit 1; }
done


# all_2xx FILE: every request h2load made was answered with a 2xx.
all_2xx() {
  local reqs ok
  reqs=$(awk '/^requests:/ {print $2}' "$1")
  ok=$(awk '/^status codes:/ {print $3}' "$1")
  [ -n "$reqs" ] && [ "$reqs" -gt 0 ] && [ "$ok" = "$reqs" ]
}

# h2 NAME -> "requests/s cpu_us_per_request"
h2() {
  local name=$1 before after reqs rps
  before=$(ticks "${PID[$name]}")
  taskset -c 1 h2load -t1 -c32 -m10 -D"$DURATION" "https://127.0.0.1:${PORT[$name]}/" > "$work/load.out" 2>&1
  after=$(ticks "${PID[$name]}")
  all_2xx "$work/load.out" || { echo "$name: not every answer was a 2xx" >&2; cat "$work/load.out" >&2; exit 1; }
  rps=$(awk '/^finished in/ {gsub(",", "", $4); print $4}' "$work/load.out")
  reqs=$(awk '/^requests:/ {print $2}' "$work/load.out")
  awk -v r="$rps" -v t=$((after - before)) -v hz="$HZ" -v n="$reqs" 'BEGIN {printf "%s %.1f\n", r, t / hz * 1e6 / n}'
}

# conns NAME -> "connections/s cpu_us_per_connection"
conns() {
  local name=$1 before after start now made=0
  before=$(ticks "${PID[$name]}")
  start=$(date +%s.%N)
  while :; do
    taskset -c 1 h2load -t1 -c"$BATCH" -n"$BATCH" -m1 "https://127.0.0.1:${PORT[$name]}/" > "$work/load.out" 2>&1
    all_2xx "$work/load.out" || { echo "$name: a batch failed" >&2; cat "$work/load.out" >&2; exit 1; }
    made=$((made + BATCH))
    now=$(date +%s.%N)
    awk -v a="$start" -v b="$now" -v d="$DURATION" 'BEGIN {exit !(b - a >= d)}' && break
  done
  after=$(ticks "${PID[$name]}")
  awk -v n="$made" -v a="$start" -v b="$now" -v t=$((after - before)) -v hz="$HZ" \
    'BEGIN {printf "%.0f %.1f\n", n / (b - a), t / hz * 1e6 / n}'
}

names=(nginx-h2 hyper-h2 leasegate-h2)
for n in "${names[@]}"; do h2 "$n" >/dev/null; done   # warm-up
: > "$work/rows"
for r in $(seq "$ROUNDS"); do
  order=("${names[@]}")
  [ $((r % 2)) -eq 0 ] && order=(leasegate-h2 hyper-h2 nginx-h2)
  for n in "${order[@]}"; do
    read -r rps cpu < <(h2 "$n")
    echo "$r h2 $n $rps $cpu" >> "$work/rows"
    echo "round $r h2 $n: $rps req/s, $cpu CPU us/request" >&2
    read -r cps cpu < <(conns "$n")
    echo "$r conn $n $cps $cpu" >> "$work/rows"
    echo "round $r new connections $n: $cps conn/s, $cpu CPU us/connection" >&2
  done
done
cp "$work/rows" "$OUT/tls.rows"

python3 - "$OUT/tls.rows" "$ROUNDS" "$DURATION" "$BATCH" <<'PY'
import sys, statistics, collections
rows, rounds, duration, batch = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
by = collections.defaultdict(dict)
for line in open(rows):
    r, load, name, rate, cpu = line.split()
    by[(load, name)][int(r)] = (float(rate), float(cpu))
def spread(vs, fmt):
    return f"{fmt(statistics.median(vs))} ({fmt(min(vs))}–{fmt(max(vs))})"
whole = lambda v: f"{v:,.0f}"
two = lambda v: f"{v:.2f}"
print("\n| load | target | per second | proxy CPU µs each |\n|---|---|---|---|")
for load, label in (("h2", "h2, 32 connections × 10 streams"), ("conn", f"new connections, batches of {batch}")):
    for name in ("nginx-h2", "hyper-h2", "leasegate-h2"):
        v = by[(load, name)].values()
        print(f"| {label} | {name} | {spread([x[0] for x in v], whole)} | {spread([x[1] for x in v], lambda c: f'{c:.1f}')} |")
print("\n| load | leasegate ÷ nginx (per second) | leasegate ÷ floor | nginx CPU ÷ leasegate CPU (per request or connection) |\n|---|---|---|---|")
for load in ("h2", "conn"):
    lg, ng, fl = by[(load, "leasegate-h2")], by[(load, "nginx-h2")], by[(load, "hyper-h2")]
    vs_n = [lg[r][0] / ng[r][0] for r in lg if r in ng]
    vs_f = [lg[r][0] / fl[r][0] for r in lg if r in fl]
    cpu = [ng[r][1] / lg[r][1] for r in lg if r in ng]
    print(f"| {load} | {spread(vs_n, two)} | {spread(vs_f, two)} | {spread(cpu, two)} |")
print(f"\n{rounds} rounds of {duration} s per load and target; medians with min–max over the rounds.")
PY
echo
echo "proxies pinned to CPU 0, h2load and the upstream to CPU 1; $(nproc) CPUs, $(uname -r); $(nginx -v 2>&1); $(h2load --version 2>&1 | head -1)"
