#!/usr/bin/env bash
# How long an override takes to reach a fleet: N leasegate instances on one
# Redis; each of C changes is a PUT /overrides/... on the first instance (a
# new rate each time), then every instance's GET /overrides is polled every
# 2 ms until it shows the new rate. Reports, per change, when the last
# instance had it (from the PUT's answer), and over all changes the median
# and max of that, and of every instance's arrival.
#
#   bench/overrides.sh [instances] [changes]
#
# BIN=path/to/leasegate runs another build (to compare two, alternate them).
#
# Installs redis-server from the system packages if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

INSTANCES=${1:-10}
CHANGES=${2:-20}
REDIS_PORT=18590
BASE_PORT=18600

need_tools redis-server:redis-server redis-cli:redis-tools python3:python3
BIN=${BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release --quiet
  BIN=${CARGO_TARGET_DIR:-target}/release/leasegate
fi

bench_work
redis-server --port $REDIS_PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null & pids+=($!)
for _ in $(seq 50); do redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
echo -n "0123456789abcdef0123456789abcdef" > "$work/admin.token"
for i in $(seq 0 $((INSTANCES - 1))); do
  cat > "$work/gw-$i.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
instance_id = "bench-$i"
[listeners]
http = "127.0.0.1:$((BASE_PORT + 2 * i))"
admin = "127.0.0.1:$((BASE_PORT + 2 * i + 1))"
[admin]
token_file = "$work/admin.token"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT"
[[routes]]
name = "api"
path_prefix = "/"
response = { status = 200, body = "ok" }
limits = ["per_client"]
[[limits]]
name = "per_client"
rate = "100/min"
CONF
  LEASEGATE_LOG=warn "$BIN" run --config "$work/gw-$i.toml" >/dev/null 2>"$work/gw-$i.log" & pids+=($!)
done
for i in $(seq 0 $((INSTANCES - 1))); do
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$((BASE_PORT + 2 * i + 1))/healthz" >/dev/null && break
    sleep 0.05
  done
done
sleep 1.5 # every instance has polled once
ADMINS=$(seq -s, $((BASE_PORT + 1)) 2 $((BASE_PORT + 2 * INSTANCES - 1)))
python3 bench/overrides.py "$ADMINS" "$CHANGES" "$(cat "$work/admin.token")"
