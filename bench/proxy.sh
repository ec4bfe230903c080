#!/usr/bin/env bash
# Proxy throughput and latency: direct to an nginx upstream, nginx as reverse
# proxy, leasegate as reverse proxy (same route, no limits), and leasegate
# with one rate limit on every request (never exceeded: the cost of the
# decision), alternating in one run. The proxy under test is pinned to CPU 0; the upstream and wrk
# share CPU 1, so both proxies get exactly one core.
#
#   bench/proxy.sh [seconds per run] [rounds] [connections]
#
# Installs wrk and nginx from the system packages if missing (needs root).
# Prints a markdown table of medians: requests/s and p99 latency.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

DURATION=${1:-8}
ROUNDS=${2:-3}
CONNS=${3:-50}
UP_PORT=18081 NGINX_PORT=18082 LG_PORT=18083 LG_ADMIN=18084 LGL_PORT=18085 LGL_ADMIN=18086

need_tools wrk:wrk nginx:nginx curl:curl
if [ "$(nproc)" -lt 2 ]; then
  echo "bench/proxy.sh needs at least 2 CPUs (proxy on one, load and upstream on the other)" >&2
  exit 1
fi
cargo build --release --quiet

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

nginx_conf() { # name body
  mkdir -p "$work/$1/logs"
  cat > "$work/$1/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $work/$1/nginx.pid;
error_log $work/$1/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/$1/body;
  proxy_temp_path $work/$1/proxy;
  fastcgi_temp_path $work/$1/fastcgi;
  uwsgi_temp_path $work/$1/uwsgi;
  scgi_temp_path $work/$1/scgi;
  keepalive_requests 1000000;
  $2
}
CONF
}

# The upstream: a fixed 200 with keep-alive.
nginx_conf upstream "server { listen 127.0.0.1:$UP_PORT; location / { return 200 'ok\n'; } }"
taskset -c 1 nginx -p "$work/upstream" -c "$work/upstream/nginx.conf" & pids+=($!)

# nginx as reverse proxy, keep-alive to the upstream, forwarding headers set.
nginx_conf proxy "upstream backend { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server { listen 127.0.0.1:$NGINX_PORT;
    location / { proxy_pass http://backend; proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme; } }"
taskset -c 0 nginx -p "$work/proxy" -c "$work/proxy/nginx.conf" & pids+=($!); NGINX_MASTER=$!

# leasegate as reverse proxy, one worker.
cat > "$work/gateway.toml" <<CONF
[gateway]
workers = 1
access_log = "off"                # nginx runs with access_log off too
[listeners]
http = "127.0.0.1:$LG_PORT"
admin = "127.0.0.1:$LG_ADMIN"
[[upstreams]]
name = "backend"
targets = ["http://127.0.0.1:$UP_PORT"]
[[routes]]
name = "all"
path_prefix = "/"
upstream = "backend"
CONF
LEASEGATE_LOG=warn taskset -c 0 ./target/release/leasegate run --config "$work/gateway.toml" & pids+=($!); LG_PID=$!

# The same, with one limit every request passes (one hot key).
sed -e "s/$LG_PORT/$LGL_PORT/; s/$LG_ADMIN/$LGL_ADMIN/" "$work/gateway.toml" > "$work/limited.toml"
cat >> "$work/limited.toml" <<CONF
limits = ["big"]
[[limits]]
name = "big"
rate = "100000000/s"
CONF
LEASEGATE_LOG=warn taskset -c 0 ./target/release/leasegate run --config "$work/limited.toml" & pids+=($!); LGL_PID=$!

for port in $UP_PORT $NGINX_PORT $LG_PORT $LGL_PORT; do
  for _ in $(seq 100); do curl -fsS -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null && break; sleep 0.1; done
  curl -fsS -o /dev/null "http://127.0.0.1:$port/" || { echo "port $port is not answering" >&2; exit 1; }
done

# CPU ticks (user+system) used so far by the given pids and their children.
ticks() {
  local t=0 p
  for p in "$@"; do
    for q in $p $(pgrep -P "$p" || true); do
      [ -r "/proc/$q/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$q/stat")))
    done
  done
  echo $t
}
HZ=$(getconf CLK_TCK)

run() { # port [proxy pid] -> "rps p99_ms cpu_us_per_request"
  local before after
  before=$(ticks ${2:-})
  taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$1/" > "$work/wrk.out"
  after=$(ticks ${2:-})
  local rps p99 reqs cpu=-
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$work/wrk.out")
  p99=$(wrk_p99_ms "$work/wrk.out")
  reqs=$(awk '/requests in/ {print $1}' "$work/wrk.out")
  if [ -n "${2:-}" ]; then cpu=$(awk -v t=$((after - before)) -v hz="$HZ" -v n="$reqs" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}'); fi
  if grep -q "Non-2xx" "$work/wrk.out"; then echo "non-2xx responses from port $1" >&2; cat "$work/wrk.out" >&2; exit 1; fi
  echo "$rps $p99 $cpu"
}

declare -A RPS P99 CPU
names=(direct nginx leasegate leasegate+limit)
declare -A PORT=([direct]=$UP_PORT [nginx]=$NGINX_PORT [leasegate]=$LG_PORT [leasegate+limit]=$LGL_PORT)
declare -A PID=([direct]="" [nginx]=$NGINX_MASTER [leasegate]=$LG_PID [leasegate+limit]=$LGL_PID)
for n in "${names[@]}"; do run "${PORT[$n]}" >/dev/null; done   # warm-up
for r in $(seq "$ROUNDS"); do
  for n in "${names[@]}"; do
    read -r rps p99 cpu < <(run "${PORT[$n]}" "${PID[$n]}")
    RPS[$n]+="$rps "; P99[$n]+="$p99 "; CPU[$n]+="$cpu "
    echo "round $r $n: $rps req/s, p99 $p99 ms, proxy CPU $cpu us/request" >&2
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo
echo "| target | requests/s (median of $ROUNDS) | p99 ms (median) | proxy CPU µs/request (median) |"
echo "|---|---|---|---|"
for n in "${names[@]}"; do
  cpu=$( [ -n "${PID[$n]}" ] && echo "${CPU[$n]}" | median || echo "—")
  echo "| $n | $(echo "${RPS[$n]}" | median) | $(echo "${P99[$n]}" | median) | $cpu |"
done
echo
echo "wrk -t1 -c$CONNS -d${DURATION}s; proxies pinned to CPU 0, wrk and upstream to CPU 1; $(nproc) CPUs, $(uname -r)"
