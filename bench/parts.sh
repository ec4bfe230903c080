#!/usr/bin/env bash
# What a proxied request costs leasegate, part by part: the same build as
#
#   full        a limit every request passes, with its RateLimit-* fields
#   no-fields   the same limit, `rate_limit_headers = "none"`
#   no-limit    no limit on the route (no decision, no fields)
#   floor       hyper's floor (examples/hyper_floor.rs): served as leasegate
#               serves, with none of its work
#
# each pinned to CPU 0 (`workers = 1`, no access log), driven in turn by
# wrk (-t1 -c32) on CPU 1 against an nginx upstream on CPU 1, round after
# round. Prints the CPU per request (user + system, from /proc) of each, and
# each one's share of `full` within the same round, median (min-max):
# what the fields cost, what the decision costs, what the proxy machinery
# costs over hyper's.
#
#   bench/parts.sh [rounds] [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

ROUNDS=${1:-5}
SECS=${2:-3}
UP_PORT=18181
need_tools wrk:wrk nginx:nginx taskset:util-linux
cargo build --release --quiet --bin leasegate --example hyper_floor

bench_work
nginx_conf up "$(ok_server "$UP_PORT")"
taskset -c 1 nginx -p "$work/up" -c "$work/up/nginx.conf" &
pids+=($!)

names=(full no-fields no-limit floor)
declare -A PORT=([full]=18184 [no-fields]=18185 [no-limit]=18186 [floor]=18187) PID
toml() { leasegate_toml "http = \"127.0.0.1:${PORT[$1]}\"" "$2" off "100000000/s" "$UP_PORT"; }
toml full 18284 > "$work/full.toml"
toml no-fields 18285 | sed 's/^access_log = "off"$/&\nrate_limit_headers = "none"/' > "$work/no-fields.toml"
toml no-limit 18286 | sed 's/^limits = \["one"\]$/limits = []/' > "$work/no-limit.toml"
for n in full no-fields no-limit; do
  LEASEGATE_LOG=warn taskset -c 0 ./target/release/leasegate run --config "$work/$n.toml" > /dev/null &
  pids+=($!)
  PID[$n]=$!
done
taskset -c 0 ./target/release/examples/hyper_floor proxy "${PORT[floor]}" "$UP_PORT" 2>/dev/null &
pids+=($!)
PID[floor]=$!
for port in $UP_PORT "${PORT[@]}"; do
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
done
# Each target is what its name says: RateLimit fields on `full` only.
fields() { curl -s -D - -o /dev/null "http://127.0.0.1:${PORT[$1]}/" | grep -ci '^ratelimit-policy:' || true; }
for n in "${names[@]}"; do
  want=0
  [ "$n" = full ] && want=1
  got=$(fields "$n")
  [ "$got" = "$want" ] || { echo "$n: $got RateLimit-Policy fields, expected $want" >&2; exit 1; }
done

: > "$work/rows"
for r in $(seq "$ROUNDS"); do
  order=("${names[@]}")
  [ $((r % 2)) -eq 0 ] && order=(floor no-limit no-fields full)
  for n in "${order[@]}"; do
    t0=$(ticks "${PID[$n]}")
    taskset -c 1 wrk -t1 -c32 -d"${SECS}s" "http://127.0.0.1:${PORT[$n]}/" > "$work/w"
    t1=$(ticks "${PID[$n]}")
    if grep -q "Non-2xx" "$work/w"; then echo "$n: non-2xx answers" >&2; cat "$work/w" >&2; exit 1; fi
    reqs=$(awk '/requests in/ {print $1}' "$work/w")
    cpu=$(awk -v t=$((t1 - t0)) -v hz="$HZ" -v n="$reqs" 'BEGIN {printf "%.2f", t / hz * 1e6 / n}')
    echo "$r $n $cpu" | tee -a "$work/rows" >&2
  done
done

python3 - "$work/rows" <<'PY'
import sys, statistics, collections
cpu = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, name, c = line.split()
    cpu[name][int(r)] = float(c)
def stat(v):
    return f"{statistics.median(v):.3f} ({min(v):.3f}–{max(v):.3f})"
print("\n| target | CPU µs/request | ÷ full, per round |\n|---|---|---|")
for name in ["full", "no-fields", "no-limit", "floor"]:
    v = list(cpu[name].values())
    share = [cpu[name][r] / cpu["full"][r] for r in cpu[name]]
    print(f"| {name} | {statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f}) | {stat(share)} |")
PY
