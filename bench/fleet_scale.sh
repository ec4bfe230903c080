#!/usr/bin/env bash
# How the store traffic of one hot key grows with the size of the fleet.
#
#   bench/fleet_scale.sh [N ...]                 # default: 2 5 10 20
#   LEASEGATE_BIN=/tmp/leasegate OUT=/tmp/fs bench/fleet_scale.sh 2 5 10
#
# For each fleet size N: N leasegate instances (workers = 1, each its own
# config, instance_id, http and admin listener on 127.0.0.1) on one
# redis-server, [store] timeout_ms = TIMEOUT_MS (50), no fleet_size (the
# fleet counts itself by its heartbeats),
# [leasing] min = 5, max = 10 (the other leasing keys at their defaults),
# grace_period_ms = 1000. One route answers 200 directly (no upstream) with
# one enforce token bucket keyed by route (by = ["route"]), fail-open. A
# paced python3 client (stdlib: CLIENT_THREADS threads, 16, each with one
# keep-alive connection per instance, round-robin over the N instances, each
# thread sleeping to its own schedule so the total offered load is RATE
# req/s, 600) runs SECONDS_PER_RUN (10) seconds against it.
#
# Two keys per N, ONE AFTER THE OTHER, each on a fresh fleet (new processes)
# and a flushed Redis (FLUSHALL and CONFIG RESETSTAT; one redis-server for
# the whole script):
#   hot    rate = "1000/10s" (burst 1000): RATE 600/s is 6x its 100/s,
#          so the key is drained after the first seconds;
#   below  rate = "100000/10s": far above the load, every request admitted.
#
# Reported per N and key (a markdown table on stdout, OUT/fleet_scale.csv):
#   - admitted (2xx), limited (429), other, against the allowance
#     burst + rate x t (t: the client's measured run time, first scheduled
#     request to last answer) and the bound allowance + N x leasing.max;
#   - store calls: leasegate_store_calls_total (every op and result) summed
#     over the instances' /metrics, after minus before the run, per second
#     and per request sent (and Redis's own EVAL/EVALSHA count beside it);
#   - the fallback's share: rate_limit_bypassed_total (every reason), after
#     minus before, over requests sent;
#   - for calls that missed the deadline: how much of their time went by in
#     the gateways and how much waiting for Redis
#     (leasegate_store_call_phase_seconds, result="timeout");
#   - p50/p99 latency from the client (from the request's send, not from its
#     scheduled time; `late` counts requests sent more than one pacing
#     interval behind schedule, so a saturated client shows).
# Then a least-squares line through the hot key's store calls/s against N,
# and its PROJECTION to N = 500 (text and plot, dashed: an extrapolation,
# not a measurement). OUT/fleet_scale.png: store calls/s with the floor
# refill rate / leasing.min (100/s / 5 = 20 calls/s) and 3x it, the
# projection, store calls per request, admitted / allowance with the bound,
# the fallback's share, p99.
#
# Environment: SECONDS_PER_RUN (10), CLIENT_THREADS (16), RATE (600),
# TIMEOUT_MS (50), OUT (default: a new temp directory, printed),
# LEASEGATE_BIN (default target/release/leasegate, built with cargo first
# only when LEASEGATE_BIN is unset; the binary is copied away before use, so
# a rebuild during the run does not touch it).
# Installs redis-server, redis-tools and curl (apt-get, as root) if missing,
# and matplotlib with pip.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

FLEETS=("$@")
[ ${#FLEETS[@]} -gt 0 ] || FLEETS=(2 5 10 20)
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
CLIENT_THREADS=${CLIENT_THREADS:-16}
RATE=${RATE:-600}
TIMEOUT_MS=${TIMEOUT_MS:-50}
LEASE_MIN=${LEASE_MIN:-5}
LEASE_MAX=${LEASE_MAX:-10}
# The two keys' limits: name, count, period (s); burst = count.
HOT_COUNT=1000 BELOW_COUNT=100000 PERIOD_S=10
PROJECT_TO=500
REDIS_PORT=19390
BASE_PORT=19400   # instance i: http BASE_PORT + 2i, admin BASE_PORT + 2i + 1

for n in "${FLEETS[@]}"; do
  if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 1000 ]; then
    echo "fleet size '$n': want a whole number, 1 to 1000" >&2
    exit 1
  fi
done
MAX_N=$(printf '%s\n' "${FLEETS[@]}" | sort -n | tail -1)

need_tools redis-server:redis-server redis-cli:redis-tools curl:curl python3:python3
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  echo "installing matplotlib (pip)..." >&2
  pip install --quiet matplotlib || { echo "bench/fleet_scale.sh needs python3 with matplotlib: pip install matplotlib" >&2; exit 1; }
fi
for p in $REDIS_PORT $(seq $BASE_PORT $((BASE_PORT + 2 * MAX_N - 1))); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "port $p is in use: another fleet_scale running?" >&2
    exit 1
  fi
done
if [ -z "${LEASEGATE_BIN:-}" ]; then
  cargo build --release --quiet
fi
BIN=${LEASEGATE_BIN:-target/release/leasegate}
[ -x "$BIN" ] || { echo "no leasegate binary at $BIN" >&2; exit 1; }
if [ -z "${OUT:-}" ]; then
  OUT=$(mktemp -d /tmp/fleet_scale.XXXXXX)
fi
mkdir -p "$OUT"
echo "output: $OUT" >&2

work=$(mktemp -d)
gw_pids=()
redis_pid=""
client_pid=""
cleanup() {
  for p in $client_pid "${gw_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cp "$BIN" "$work/leasegate"

redis-server --port $REDIS_PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 50); do redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p $REDIS_PORT ping >/dev/null || { echo "redis-server did not start" >&2; exit 1; }
script_calls() {
  redis-cli -p $REDIS_PORT info commandstats |
    awk -F'[=:,]' '/^cmdstat_(evalsha|eval|evalsha_ro|eval_ro|fcall):/ {n += $3} END {print n + 0}'
}

# config I N KEY COUNT: $work/gw-I.toml, instance I of N, one limit of COUNT/10s.
config() {
  cat > "$work/gw-$1.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
instance_id = "scale-$1"
grace_period_ms = 1000
[listeners]
http = "127.0.0.1:$((BASE_PORT + 2 * $1))"
admin = "127.0.0.1:$((BASE_PORT + 2 * $1 + 1))"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT"
timeout_ms = $TIMEOUT_MS
[leasing]
min = $LEASE_MIN
max = $LEASE_MAX
[[routes]]
name = "$3"
path_prefix = "/"
response = { status = 200, body = "ok" }
limits = ["$3"]
on_store_failure = "allow"
[[limits]]
name = "$3"
rate = "$4/${PERIOD_S}s"
by = ["route"]
CONF
}

# start N KEY COUNT: a fresh fleet on a flushed Redis, ready (readyz on the
# admin listener: no request on the limited route, no token spent).
start() {
  local i n=$1
  redis-cli -p $REDIS_PORT flushall >/dev/null
  redis-cli -p $REDIS_PORT config resetstat >/dev/null
  gw_pids=()
  for i in $(seq 0 $((n - 1))); do
    config "$i" "$n" "$2" "$3"
    LEASEGATE_LOG=warn "$work/leasegate" run --config "$work/gw-$i.toml" 2>>"$work/gw-$i.log" &
    gw_pids+=($!)
  done
  for i in $(seq 0 $((n - 1))); do
    local admin=$((BASE_PORT + 2 * i + 1)) ok=""
    for _ in $(seq 150); do
      if curl -fsS --max-time 1 "http://127.0.0.1:$admin/readyz" 2>/dev/null | grep -q "store redis: ok"; then ok=1; break; fi
      sleep 0.1
    done
    if [ -z "$ok" ]; then
      echo "instance $i (N = $n) not ready after 15 s; its log:" >&2
      tail -n 20 "$work/gw-$i.log" >&2
      exit 1
    fi
  done
  sleep 0.5  # the first connection to Redis
}

stop() {
  local p _
  for p in "${gw_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq 50); do
    local alive=0
    for p in "${gw_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${gw_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  gw_pids=()
}

# scrape N: the fleet's counters, summed over the instances, as JSON.
scrape() {
  local i
  for i in $(seq 0 $(($1 - 1))); do
    curl -fsS --max-time 5 "http://127.0.0.1:$((BASE_PORT + 2 * i + 1))/metrics"
  done | awk '
    $1 ~ /^leasegate_store_calls_total(\{|$)/ {
      calls += $2
      if ($1 ~ /op="acquire"/) acq += $2; else if ($1 ~ /op="release"/) rel += $2
      if ($1 ~ /result="timeout"/ || $1 ~ /result="error"/) failed += $2
    }
    $1 ~ /^rate_limit_bypassed_total(\{|$)/ {byp += $2}
    $1 ~ /^leasegate_decisions_total(\{|$)/ {dec += $2; if ($1 ~ /outcome="limited"/) lim += $2}
    $1 ~ /^leasegate_store_call_phase_seconds_sum\{phase="gateway",result="timeout"\}/ {tgw += $2}
    $1 ~ /^leasegate_store_call_phase_seconds_sum\{phase="redis",result="timeout"\}/ {trd += $2}
    END {printf "{\"store_calls\": %.0f, \"acquire\": %.0f, \"release\": %.0f, \"failed\": %.0f, \"bypassed\": %.0f, \"decisions\": %.0f, \"decisions_limited\": %.0f, \"timeout_gateway_s\": %.6f, \"timeout_redis_s\": %.6f}\n",
      calls, acq, rel, failed, byp, dec, lim, tgw, trd}'
}

# The paced client: THREADS threads, each with one keep-alive connection per
# port, round-robin over the ports, each thread on a fixed schedule of
# RATE/THREADS req/s (offset from the others), for DURATION s. Prints JSON.
cat > "$work/client.py" <<'PY'
import http.client, json, sys, threading, time

ports = [int(p) for p in sys.argv[1].split(",")]
threads, rate, duration = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
interval = threads / rate  # per thread
n = len(ports)

def connect(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    c.connect()
    return c

results = [None] * threads
ready = threading.Barrier(threads + 1)
start = [0.0]

def worker(k):
    conns = {p: connect(p) for p in ports}
    lat, counts, late = [], {"admitted": 0, "limited": 0, "other": 0}, 0
    ready.wait()
    ready.wait()  # start[0] is set between the two
    offset = start[0] + k * interval / threads
    end = start[0] + duration
    i, last = 0, start[0]
    while True:
        t = offset + i * interval
        if t >= end:
            break
        now = time.monotonic()
        if t > now:
            time.sleep(t - now)
        elif now - t > interval:
            late += 1
        port = ports[(k + i) % n]
        sent = time.monotonic()
        try:
            conn = conns[port]
            conn.request("GET", "/")
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        except (OSError, http.client.HTTPException):
            conns[port].close()
            try:
                conns[port] = connect(port)
            except OSError:
                pass
            status = 0
        last = time.monotonic()
        lat.append((last - sent) * 1000)
        if 200 <= status < 300:
            counts["admitted"] += 1
        elif status == 429:
            counts["limited"] += 1
        else:
            counts["other"] += 1
        i += 1
    for c in conns.values():
        c.close()
    results[k] = (lat, counts, late, last)

ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
for t in ts:
    t.start()
ready.wait()
start[0] = time.monotonic() + 0.1
ready.wait()
for t in ts:
    t.join()
lat = sorted(x for r in results for x in r[0])
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0
elapsed = max(r[3] for r in results) - start[0]
out = {k: sum(r[1][k] for r in results) for k in ("admitted", "limited", "other")}
out.update(sent=len(lat), duration_s=round(elapsed, 3), offered_rps=round(len(lat) / elapsed, 1),
           late=sum(r[2] for r in results), p50_ms=round(q(0.50), 3), p99_ms=round(q(0.99), 3),
           max_ms=round(lat[-1] if lat else 0.0, 3))
print(json.dumps(out))
PY

# run N KEY COUNT: one measured run, one JSON line appended to $work/rows.
run() {
  local n=$1 key=$2 count=$3 before after rb ra client ports
  start "$n" "$key" "$count"
  ports=$(seq -s, $BASE_PORT 2 $((BASE_PORT + 2 * (n - 1))))
  before=$(scrape "$n")
  rb=$(script_calls)
  timeout $((SECONDS_PER_RUN + 60)) python3 "$work/client.py" "$ports" "$CLIENT_THREADS" "$RATE" "$SECONDS_PER_RUN" \
    > "$work/client.out" &
  client_pid=$!
  wait $client_pid || { echo "the client failed (N = $n, $key)" >&2; exit 1; }
  client_pid=""
  client=$(cat "$work/client.out")
  after=$(scrape "$n")
  ra=$(script_calls)
  stop
  python3 - "$n" "$key" "$count" "$before" "$after" "$((ra - rb))" "$client" >> "$work/rows" <<'PY'
import json, sys
n, key, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
b, a = json.loads(sys.argv[4]), json.loads(sys.argv[5])
row = {"n": n, "key": key, "count": count, "redis_script_calls": int(sys.argv[6])}
row.update({k: a[k] - b[k] for k in a})
row.update(json.loads(sys.argv[7]))
print(json.dumps(row))
print(f"N = {n:>3} {key:<5}: sent {row['sent']} in {row['duration_s']} s, admitted {row['admitted']}, "
      f"limited {row['limited']}, other {row['other']}, store calls {row['store_calls']}, "
      f"bypassed {row['bypassed']}, p99 {row['p99_ms']} ms", file=sys.stderr)
PY
}

: > "$work/rows"
for n in "${FLEETS[@]}"; do
  run "$n" hot $HOT_COUNT
  run "$n" below $BELOW_COUNT
done
cp "$work/rows" "$OUT/fleet_scale.rows.jsonl"

python3 - "$OUT" "$PERIOD_S" "$LEASE_MIN" "$LEASE_MAX" "$PROJECT_TO" "$RATE" "$CLIENT_THREADS" "$SECONDS_PER_RUN" "$TIMEOUT_MS" <<'PY'
import csv, json, sys
out = sys.argv[1]
period, lease_min, lease_max, project_to = float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rate, threads, seconds, timeout_ms = sys.argv[6], sys.argv[7], sys.argv[8], sys.argv[9]
rows = [json.loads(l) for l in open(f"{out}/fleet_scale.rows.jsonl")]
for r in rows:
    per_s = r["count"] / period
    burst = r["count"]
    r["limit"] = f"{r['count']}/{period:g}s"
    r["allowance"] = burst + per_s * r["duration_s"]
    r["bound"] = r["allowance"] + r["n"] * lease_max
    r["admitted_over_allowance"] = r["admitted"] / r["allowance"]
    r["bound_over_allowance"] = r["bound"] / r["allowance"]
    r["store_calls_per_s"] = r["store_calls"] / r["duration_s"]
    r["store_calls_per_request"] = r["store_calls"] / max(1, r["sent"])
    r["fallback_share"] = r["bypassed"] / max(1, r["sent"])
hot_per_s = [r for r in rows if r["key"] == "hot"][0]["count"] / period if any(r["key"] == "hot" for r in rows) else 100.0
floor = hot_per_s / lease_min

cols = ["n", "key", "limit", "duration_s", "sent", "offered_rps", "late", "admitted", "limited", "other",
        "allowance", "bound", "admitted_over_allowance", "bound_over_allowance",
        "store_calls", "acquire", "release", "failed", "store_calls_per_s", "store_calls_per_request",
        "redis_script_calls", "bypassed", "fallback_share", "decisions", "decisions_limited",
        "timeout_gateway_s", "timeout_redis_s",
        "p50_ms", "p99_ms", "max_ms"]
with open(f"{out}/fleet_scale.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(cols)
    for r in rows:
        w.writerow([round(r[c], 4) if isinstance(r[c], float) else r[c] for c in cols])

print("\n| N | key | sent (req/s) | admitted | 429 | other | allowance | admitted ÷ allowance | bound ÷ allowance "
      "| store calls/s | store calls/request | Redis scripts/s | fallback share | p50 ms | p99 ms |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['n']} | {r['key']} ({r['limit']}) | {r['sent']} ({r['offered_rps']:.0f}) | {r['admitted']} | {r['limited']} "
          f"| {r['other']} | {r['allowance']:.0f} | {r['admitted_over_allowance']:.3f} | {r['bound_over_allowance']:.3f} "
          f"| {r['store_calls_per_s']:.1f} | {r['store_calls_per_request']:.4f} | {r['redis_script_calls'] / r['duration_s']:.1f} "
          f"| {r['fallback_share']:.4f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
missed = [r for r in rows if r["timeout_gateway_s"] + r["timeout_redis_s"] > 0]
for r in missed:
    t = r["timeout_gateway_s"] + r["timeout_redis_s"]
    print(f"N = {r['n']} {r['key']}: calls past the deadline spent {t * 1e3:.1f} ms in all, "
          f"{100 * r['timeout_gateway_s'] / t:.0f} % of it in the gateways (before sending, after the reply) "
          f"and {100 * r['timeout_redis_s'] / t:.0f} % waiting for Redis (leasegate_store_call_phase_seconds)")

def fit(points):
    """Least squares y = a + b x; None with fewer than two distinct x."""
    xs = [p[0] for p in points]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(p[1] for p in points) / len(points)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b

hot = sorted((r["n"], r["store_calls_per_s"]) for r in rows if r["key"] == "hot")
line = fit(hot)
print(f"\nfloor: refill rate ÷ leasing.min = {hot_per_s:g}/s ÷ {lease_min} = {floor:g} store calls/s (3x: {3 * floor:g}/s)")
if line:
    a, b = line
    print(f"hot key, least-squares fit of store calls/s against N: {a:.1f} + {b:.2f} × N")
    print(f"PROJECTION (extrapolated, not measured): N = {project_to}: {a + b * project_to:.0f} store calls/s "
          f"({(a + b * project_to) / floor:.1f}x the floor)")
else:
    print("projection: needs at least two fleet sizes")
print(f"\n{threads} client threads, {rate} req/s offered in total for {seconds} s per run, round-robin over the N instances; "
      f"[store] timeout_ms = {timeout_ms}, [leasing] min = {lease_min}, max = {lease_max}; "
      f"allowance = burst + rate × measured run time, bound = allowance + N × {lease_max}. "
      f"Each key on a fresh fleet and a flushed Redis, one after the other.")

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
keys = [("hot", "#c92a2a", "hot key (drained)"), ("below", "#1971c2", "below-quota key")]
series = lambda key, field: sorted((r["n"], r[field]) for r in rows if r["key"] == key)
fig, axes = plt.subplots(2, 3, figsize=(16, 9))
ax = axes[0][0]
for key, color, label in keys:
    s = series(key, "store_calls_per_s")
    if s:
        ax.plot([p[0] for p in s], [p[1] for p in s], "o-", color=color, label=label)
ax.axhline(floor, color="black", linestyle=":", label=f"floor {floor:g}/s (refill ÷ min lease)")
ax.axhline(3 * floor, color="gray", linestyle=":", label=f"3 × floor ({3 * floor:g}/s)")
if line:
    xs = [min(p[0] for p in hot), max(p[0] for p in hot)]
    ax.plot(xs, [a + b * x for x in xs], "--", color="#c92a2a", alpha=0.6, label="least-squares fit (hot)")
ax.set_xlabel("fleet size N"); ax.set_ylabel("store calls/s (fleet)"); ax.set_title("Store calls per second")
ax.set_ylim(bottom=0); ax.legend(fontsize=8)

ax = axes[0][1]
ax.plot([p[0] for p in hot], [p[1] for p in hot], "o", color="#c92a2a", label="hot key, measured")
ax.axhline(floor, color="black", linestyle=":", label=f"floor {floor:g}/s")
ax.axhline(3 * floor, color="gray", linestyle=":", label=f"3 × floor")
if line:
    ax.plot([0, project_to], [a, a + b * project_to], "--", color="#c92a2a",
            label=f"PROJECTION (fit): {a + b * project_to:.0f}/s at N = {project_to}")
    ax.annotate(f"projection\n{a + b * project_to:.0f}/s", (project_to, a + b * project_to),
                textcoords="offset points", xytext=(-60, -25), fontsize=8)
ax.set_xlim(0, project_to * 1.05); ax.set_ylim(bottom=0)
ax.set_xlabel("fleet size N"); ax.set_ylabel("store calls/s (fleet)")
ax.set_title(f"Hot key: PROJECTION to N = {project_to} (dashed, extrapolated)"); ax.legend(fontsize=8)

ax = axes[0][2]
for key, color, label in keys:
    s = series(key, "store_calls_per_request")
    if s:
        ax.plot([p[0] for p in s], [p[1] for p in s], "o-", color=color, label=label)
ax.set_xlabel("fleet size N"); ax.set_ylabel("store calls per request sent"); ax.set_title("Store calls per request")
ax.set_ylim(bottom=0); ax.legend(fontsize=8)

ax = axes[1][0]
s = series("hot", "admitted_over_allowance")
bnd = series("hot", "bound_over_allowance")
ax.plot([p[0] for p in s], [p[1] for p in s], "o-", color="#c92a2a", label="hot key: admitted ÷ allowance")
ax.plot([p[0] for p in bnd], [p[1] for p in bnd], "--", color="black", label=f"bound (allowance + N × {lease_max}) ÷ allowance")
ax.axhline(1.0, color="gray", linewidth=1)
ax.set_xlabel("fleet size N"); ax.set_ylabel("ratio"); ax.set_title("Accuracy (hot key)"); ax.legend(fontsize=8)

ax = axes[1][1]
for key, color, label in keys:
    s = series(key, "fallback_share")
    if s:
        ax.plot([p[0] for p in s], [p[1] * 100 for p in s], "o-", color=color, label=label)
ax.set_xlabel("fleet size N"); ax.set_ylabel("% of requests sent"); ax.set_ylim(bottom=0)
ax.set_title("Admitted by the fallback (rate_limit_bypassed_total)"); ax.legend(fontsize=8)

ax = axes[1][2]
for key, color, label in keys:
    s = series(key, "p99_ms")
    if s:
        ax.plot([p[0] for p in s], [p[1] for p in s], "o-", color=color, label=label)
ax.set_xlabel("fleet size N"); ax.set_ylabel("ms"); ax.set_ylim(bottom=0); ax.set_title("Client p99 latency"); ax.legend(fontsize=8)
fig.suptitle(f"N leasegates on one Redis: {rate} req/s offered by {threads} paced threads for {seconds} s, "
             f"timeout_ms {timeout_ms}, leasing min {lease_min} max {lease_max}", fontsize=10)
fig.tight_layout(); fig.savefig(f"{out}/fleet_scale.png", dpi=100)
print(f"plot: {out}/fleet_scale.png, table: {out}/fleet_scale.csv", file=sys.stderr)
PY
echo
echo "$(nproc) CPUs, $(uname -r); redis $(redis-server --version | awk '{print $3}'); python $(python3 -c 'import platform; print(platform.python_version())'); output in $OUT"
