#!/usr/bin/env bash
# Where a ShouldRateLimit call's CPU goes: one leasegate (BIN, default the
# release build; bench/rls.sh's leasing configuration, pinned to CPU 0) under
# examples/rls_load (8 callers, 100 keys, on CPU 1 with Redis), profiled by
# `perf record -g` for 6 s of a 10 s load; prints the load's figures and the
# top symbols (perf report --no-children). Issue 27 (docs/benchmarks.md).
#
#   BIN=path bench/rls_profile.sh [top]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
TOP=${1:-30}
BIN=${BIN:-./target/release/leasegate}
need_tools perf:linux-perf redis-server:redis-server redis-cli:redis-tools taskset:util-linux
cargo build --release --quiet --bin leasegate --example rls_load
bench_work
REDIS_PORT=18590; RLS_PORT=18591; HTTP_PORT=18592
taskset -c 1 redis-server --port $REDIS_PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null & pids+=($!)
for _ in $(seq 50); do redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
cat > "$work/ratelimit.yaml" <<'YAML'
domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100000000}
YAML
cat > "$work/g.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
[listeners]
http = "127.0.0.1:$HTTP_PORT"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT"
timeout_ms = 5
[rls]
listen = "127.0.0.1:$RLS_PORT"
config = "ratelimit.yaml"
[[routes]]
name = "all"
path_prefix = "/"
response = { status = 200, body = "ok" }
CONF
taskset -c 0 env LEASEGATE_LOG=warn "$BIN" run --config "$work/g.toml" & gw=$!; pids+=($gw)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$RLS_PORT) 2>/dev/null && break; sleep 0.1; done
taskset -c 1 ./target/release/examples/rls_load "127.0.0.1:$RLS_PORT" 1 8 100 >/dev/null
taskset -c 1 ./target/release/examples/rls_load "127.0.0.1:$RLS_PORT" 10 8 100 > "$work/load.out" &
lp=$!
sleep 1
perf record -F 2000 -g -p "$gw" -o "$work/perf.data" -- sleep 6 2>/dev/null
wait $lp
cat "$work/load.out"
perf report -i "$work/perf.data" --no-children --sort symbol --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -"$TOP"
