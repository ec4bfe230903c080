#!/usr/bin/env bash
# Two leasegate builds alternated as an h2c proxy (prior knowledge, the
# plain listener), one worker pinned to CPU 0, one limit every request
# passes, nginx upstream and h2load -t1 -c32 -m10 on CPU 1: requests/s per
# round. Used for the log filter of issue 27 (docs/benchmarks.md).
#
#   BEFORE=path AFTER=path bench/h2c_ab.sh [rounds] [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
ROUNDS=${1:-3}; SECS=${2:-8}
: "${BEFORE:?a leasegate build}" "${AFTER:?a leasegate build}"
need_tools nginx:nginx h2load:nghttp2-client curl:curl taskset:util-linux

bench_work
UP=18681; P=18682; A=18683
nginx_conf upstream "$(ok_server "$UP")"
taskset -c 1 nginx -p "$work/upstream" -c "$work/upstream/nginx.conf" & pids+=($!)
cat > "$work/g.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
[listeners]
http = "127.0.0.1:$P"
admin = "127.0.0.1:$A"
[[upstreams]]
name = "up"
targets = ["http://127.0.0.1:$UP"]
[[routes]]
name = "all"
path_prefix = "/"
upstream = "up"
limits = ["pass"]
[[limits]]
name = "pass"
rate = "100000000/s"
by = ["route"]
CONF
for r in $(seq "$ROUNDS"); do
  for b in BEFORE AFTER; do
    LEASEGATE_LOG=warn taskset -c 0 "${!b}" run --config "$work/g.toml" >/dev/null 2>&1 & g=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$A/healthz" >/dev/null && break; sleep 0.05; done
    taskset -c 1 h2load -t1 -c32 -m10 -D2 "http://127.0.0.1:$P/" >/dev/null 2>&1
    taskset -c 1 h2load -t1 -c32 -m10 -D"$SECS" "http://127.0.0.1:$P/" > "$work/out" 2>&1
    echo "$b $r $(awk '/^finished in/ {print $4}' "$work/out") req/s; $(grep -E '^requests:' "$work/out")"
    kill $g; wait $g 2>/dev/null || true
  done
done
