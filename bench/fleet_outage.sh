#!/usr/bin/env bash
# What a fleet admits while its Redis is gone, with the default fallback.
#
#   bench/fleet_outage.sh [warm-up s] [outage s] [rounds] [scenarios]
#
# Two leasegate instances (release build, one worker each) on one Redis, one
# fail-open route with one enforce limit on one key shared by the fleet
# (rate 6000/min = 100/s, burst 100), DEFAULT leasing and fallback settings:
# no fallback_rate, no fleet_size. A paced client (python3, one keep-alive
# connection per instance, requests at fixed times) offers a steady load for
# the warm-up, then Redis gets SIGKILL and the same load goes on for the
# outage. Per phase, per instance and summed: requests sent, admitted (200),
# refused (429), the quota's allowance for the phase (burst + rate × time
# before the outage, rate × time during it), admitted / allowance, the
# admitted rate against the same instances' rate before the outage, and how
# many were admitted by fallback buckets (rate_limit_bypassed_total).
#
# Scenarios (default "below above"):
#   below   0.5 × the quota offered, spread over both instances
#   above   3 × the quota offered, spread over both instances
#   surge   0.5 × before the outage, 3 × during it
# Each round runs every scenario on a fresh Redis and fresh instances; the
# table gives the median and the min–max over the rounds.
# Installs redis-server and curl if missing; needs python3.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

WARMUP=${1:-20}
OUTAGE=${2:-10}
ROUNDS=${3:-2}
SCENARIOS=${4:-below above}
REDIS_PORT=18590
BASE_PORT=18600
RATE=100   # the quota, per second: rate = "6000/min"
BURST=100

need_tools redis-server:redis-server redis-cli:redis-tools curl:curl python3:python3
cargo build --release --quiet
bin="${CARGO_TARGET_DIR:-target}/release/leasegate"

work=$(mktemp -d)
gw_pids=()
redis_pid=""
cleanup() {
  for p in "${gw_pids[@]}" $redis_pid; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

for i in 0 1; do
  cat > "$work/gw-$i.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
instance_id = "outage-$i"
[listeners]
http = "127.0.0.1:$((BASE_PORT + 2 * i))"
admin = "127.0.0.1:$((BASE_PORT + 2 * i + 1))"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT"
[[routes]]
name = "api"
path_prefix = "/"
response = { status = 200, body = "ok" }
limits = ["quota"]
on_store_failure = "allow"
[[limits]]
name = "quota"
rate = "6000/min"
burst = $BURST
by = ["route"]
CONF
done

start() {
  redis-server --port $REDIS_PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
  redis_pid=$!
  disown "$redis_pid"  # it dies by SIGKILL on purpose: no "Killed" notice
  for _ in $(seq 50); do redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
  gw_pids=()
  for i in 0 1; do
    LEASEGATE_LOG=warn "$bin" run --config "$work/gw-$i.toml" & gw_pids+=($!)
  done
  # Ready and connected (readyz, not the route: no token is spent here).
  for i in 0 1; do
    local admin=$((BASE_PORT + 2 * i + 1))
    for _ in $(seq 100); do
      curl -fsS "http://127.0.0.1:$admin/readyz" 2>/dev/null | grep -q "store redis: ok" && break
      sleep 0.1
    done
  done
  sleep 0.5  # the first connection to Redis
}

stop() {
  for p in "${gw_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${gw_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  gw_pids=()
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
  redis_pid=""
}

# drive SCENARIO ROUND: offers the load, kills Redis after the warm-up,
# appends one JSON line of counts to $work/results.
drive() {
  python3 - "$1" "$2" "$redis_pid" "$WARMUP" "$OUTAGE" "$RATE" "$BASE_PORT" >> "$work/results" <<'PY'
import http.client, json, os, signal, sys, threading, time, urllib.request

scenario, rnd, redis_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
warmup, outage, quota, base = float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
# Offered load per instance, before and during the outage (req/s).
before, during = {"below": (0.25, 0.25), "above": (1.5, 1.5), "surge": (0.25, 1.5)}[scenario]
before, during = before * quota, during * quota

def bypassed(i):
    text = urllib.request.urlopen(f"http://127.0.0.1:{base + 2 * i + 1}/metrics", timeout=5).read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith("rate_limit_bypassed_total"))

# counts[instance][phase][status class]; phases 0 = before, 1 = outage,
# 2 = second half of the outage (also counted in 1).
counts = [[{"sent": 0, "ok": 0, "refused": 0, "other": 0} for _ in range(3)] for _ in range(2)]
bypass_at_kill = [0.0, 0.0]
start = time.monotonic() + 0.2

def kill():
    time.sleep(max(0.0, start + warmup - time.monotonic()))
    for i in range(2):
        bypass_at_kill[i] = bypassed(i)
    os.kill(redis_pid, signal.SIGKILL)

def client(i):
    conn = http.client.HTTPConnection("127.0.0.1", base + 2 * i, timeout=5)
    t = start
    while t < start + warmup + outage:
        now = time.monotonic()
        if t > now:
            time.sleep(t - now)
        phases = [0] if t < start + warmup else ([1, 2] if t >= start + warmup + outage / 2 else [1])
        try:
            conn.request("GET", "/")
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", base + 2 * i, timeout=5)
            status = 0
        cls = "ok" if status == 200 else "refused" if status == 429 else "other"
        for p in phases:
            counts[i][p]["sent"] += 1
            counts[i][p][cls] += 1
        t += 1.0 / (before if t < start + warmup else during)

threads = [threading.Thread(target=client, args=(i,)) for i in range(2)] + [threading.Thread(target=kill)]
for th in threads:
    th.start()
for th in threads:
    th.join()
after = [bypassed(i) for i in range(2)]
print(json.dumps({
    "scenario": scenario, "round": rnd, "counts": counts,
    "bypassed_before": bypass_at_kill, "bypassed_outage": [a - b for a, b in zip(after, bypass_at_kill)],
}))
PY
}

for round in $(seq "$ROUNDS"); do
  for s in $SCENARIOS; do
    start
    drive "$s" "$round"
    stop
    echo "round $round, $s: done" >&2
  done
done

python3 - "$work/results" "$WARMUP" "$OUTAGE" "$RATE" "$BURST" <<'PY'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1])]
warmup, outage, rate, burst = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
allowance = [burst + rate * warmup, rate * outage, rate * outage / 2]
offered = {"below": (0.5, 0.5), "above": (3, 3), "surge": (0.5, 3)}
names = ["before (Redis up)", "outage", "outage, 2nd half"]

def cell(values, fmt):
    m = statistics.median(values)
    lo, hi = min(values), max(values)
    return fmt.format(m) if lo == hi else f"{fmt.format(m)} ({fmt.format(lo)}–{fmt.format(hi)})"

for scenario in dict.fromkeys(r["scenario"] for r in rows):
    runs = [r for r in rows if r["scenario"] == scenario]
    b, d = offered[scenario]
    print(f"\n{scenario}: offered {b:g} × the quota before the outage, {d:g} × during it; "
          f"{len(runs)} rounds, median (min–max)\n")
    print("| phase | instance | sent | admitted (200) | refused (429) | other | allowance | admitted / allowance "
          "| admitted per s / before | by fallback |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p, name in enumerate(names):
        for who in ["outage-0", "outage-1", "fleet"]:
            if p == 2 and who != "fleet":
                continue
            pick = [0, 1] if who == "fleet" else [int(who[-1])]
            got = lambda key: [sum(r["counts"][i][p][key] for i in pick) for r in runs]
            ratio = [sum(r["counts"][i][p]["ok"] for i in pick) / allowance[p] for r in runs]
            # Admitted per second against the same instances' rate before the outage.
            secs = [warmup, outage, outage / 2][p]
            vs = [sum(r["counts"][i][p]["ok"] for i in pick) / secs
                  / max(1, sum(r["counts"][i][0]["ok"] for i in pick) / warmup) for r in runs]
            if p == 0:
                fb = [sum(r["bypassed_before"][i] for i in pick) for r in runs]
            elif p == 1:
                fb = [sum(r["bypassed_outage"][i] for i in pick) for r in runs]
            else:
                fb = None
            print(f"| {name} | {who} | {cell(got('sent'), '{:.0f}')} | {cell(got('ok'), '{:.0f}')} | "
                  f"{cell(got('refused'), '{:.0f}')} | {cell(got('other'), '{:.0f}')} | {allowance[p]:.0f} | "
                  f"{cell(ratio, '{:.2f}')} | {cell(vs, '{:.2f}') if p else '1'} | {cell(fb, '{:.0f}') if fb is not None else '—'} |")
PY
echo
echo "warm-up ${WARMUP}s, outage ${OUTAGE}s (Redis SIGKILL), quota 6000/min (100/s, burst $BURST) on one key;"
echo "allowance = burst + rate × time before the outage, rate × time during it (the whole fleet's quota)."
echo "$(nproc) CPUs, $(uname -r); redis $(redis-server --version | awk '{print $3}')"
