#!/usr/bin/env bash
# A soak: does anything grow without bound, and does any request wait
# longer than the store deadline plus queueing, over many minutes of mixed
# traffic, config reloads and Redis outages?
#
#   bench/soak.sh [MINUTES]            # default 15
#   OUT=docs bench/soak.sh 16          # writes docs/soak.png, docs/soak.csv, docs/soak-events.csv
#
# One leasegate (release build, workers = 1) on one redis-server, with an
# http, an https and an admin listener on 127.0.0.1, two routes (`api`
# forwarding to an upstream, on_store_failure = "allow"; `direct`, a direct
# response, on_store_failure = "deny"), four limits keyed by identity, by
# `header:x-tenant`, by subnet and by route (token buckets and sliding
# windows), JWT (HS256) and four API keys, `timeout_ms = 5`. Then, in
# parallel, for MINUTES:
#   - the load (examples/soak_load.rs): RATE requests/s over CONNS
#     connections, half HTTP/1.1 keep-alive, half HTTP/2 over TLS, each
#     connection replaced after 200-2000 requests from another 127.0.S.H
#     source address; unknown API keys (fresh and rotating), known keys,
#     JWTs whose `sub` set keeps growing, random `x-tenant` values; it
#     prints counts by status and p50/p99/max latency every 10 s;
#   - a reload every RELOAD_EVERY s (30): the config rewritten with the
#     per-subnet limit's rate switched between two values, and
#     leasegate_config_reloads_total{result="ok"} checked to have moved;
#   - Redis SIGKILLed at REDIS_FIRST s (60) and every REDIS_EVERY s (120)
#     after, and started again REDIS_DOWN s (10) later on the same port;
#   - a sample every 10 s: the gateway's RSS (VmRSS), open fds, CPU time,
#     lease table size (leasegate_lease_keys), open connections, breaker
#     state, and the load's latest 10 s window (counts, p50/p99/max).
# At the end: OUT/soak.csv (the samples), OUT/soak-events.csv (kills,
# restarts, reloads), OUT/soak.png (RSS, fds, lease keys and p99 against
# minutes, Redis kills marked) and a summary on stdout. OUT defaults to
# bench/out. LOGS=DIR also keeps the gateway's stderr, the load's lines
# and the final /metrics there.
#
# Environment: RATE (3000), CONNS (32), STREAMS (2 per HTTP/2 connection),
# RELOAD_EVERY, REDIS_FIRST, REDIS_EVERY, REDIS_DOWN, BUILD=0 to use the
# binaries already in target/release (they are copied away first, so a
# rebuild during the soak does not touch the running ones).
# Installs redis-server, redis-tools, curl and openssl (apt-get, as root) if
# missing, and matplotlib with pip.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

MINUTES=${1:-15}
OUT=${OUT:-bench/out}
LOGS=${LOGS:-}
RATE=${RATE:-3000}
CONNS=${CONNS:-32}
STREAMS=${STREAMS:-2}
RELOAD_EVERY=${RELOAD_EVERY:-30}
REDIS_FIRST=${REDIS_FIRST:-60}
REDIS_EVERY=${REDIS_EVERY:-120}
REDIS_DOWN=${REDIS_DOWN:-10}
BUILD=${BUILD:-1}
SAMPLE_EVERY=10
REDIS_PORT=18790 HTTP_PORT=18791 HTTPS_PORT=18792 ADMIN_PORT=18793
SECRET=soak-jwt-secret-not-for-production
SUBNET_RATES=("9000/min" "6000/min")   # the reload switches between them
DURATION=$((MINUTES * 60))

need_tools redis-server:redis-server redis-cli:redis-tools curl:curl openssl:openssl python3:python3
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  echo "installing matplotlib (pip)..." >&2
  pip install --quiet matplotlib || { echo "bench/soak.sh needs python3 with matplotlib: pip install matplotlib" >&2; exit 1; }
fi
for p in $REDIS_PORT $HTTP_PORT $HTTPS_PORT $ADMIN_PORT; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "port $p is in use: another soak running?" >&2
    exit 1
  fi
done
target="${CARGO_TARGET_DIR:-target}/release"
if [ "$BUILD" != 0 ]; then
  cargo build --release --quiet --bin leasegate --example soak_load
fi
mkdir -p "$OUT" ${LOGS:+"$LOGS"}

bench_work
mkdir "$work/bin"
cp "$target/leasegate" "$target/examples/soak_load" "$work/bin/"
soak_cleanup() {
  local rc=$?
  # The loops first (the Redis loop would start Redis again), then Redis.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$work/redis.pid" ] && kill "$(cat "$work/redis.pid")" 2>/dev/null || true
  if [ "$rc" != 0 ] && [ -f "$work/gateway.log" ]; then
    echo "--- last lines of the gateway's log:" >&2
    tail -n 20 "$work/gateway.log" >&2
  fi
  bench_cleanup
}
trap soak_cleanup EXIT

# --- helpers
T0=$EPOCHREALTIME
elapsed() { awk -v n="$EPOCHREALTIME" -v z="$T0" 'BEGIN {printf "%.1f", n - z}'; }
# sleep_until S: until S seconds after T0.
sleep_until() { sleep "$(awk -v t="$1" -v n="$EPOCHREALTIME" -v z="$T0" 'BEGIN {d = t - (n - z); printf "%.3f", (d > 0 ? d : 0)}')"; }
event() { echo "$(elapsed),$1" >> "$work/events.csv"; }
metrics() { curl -fsS --max-time 2 "http://127.0.0.1:$ADMIN_PORT/metrics" 2>/dev/null || true; }
# metric NAME: the value of one sample line, 0 if absent.
metric() { metrics | awk -v m="$1" '$1 == m {v = $2} END {print v + 0}'; }

redis_start() {
  redis-server --port $REDIS_PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >> "$work/redis.log" 2>&1 &
  echo $! > "$work/redis.pid"
  disown $!  # it dies by SIGKILL on purpose: no "Killed" notice
  for _ in $(seq 50); do redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && return; sleep 0.1; done
  echo "redis-server did not start" >&2
}

# --- certificate, Redis, upstream, gateway
# A CA and a leaf it signs (rustls refuses a self-signed CA:TRUE certificate
# as the server's own, so the CA is what the load trusts).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj "/CN=leasegate soak CA" -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -subj /CN=localhost -keyout "$work/key.pem" -out "$work/leaf.csr" 2>/dev/null
printf 'basicConstraints=critical,CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$work/leaf.ext"
openssl x509 -req -in "$work/leaf.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
  -days 2 -extfile "$work/leaf.ext" -out "$work/cert.pem" 2>/dev/null

redis_start

"$work/bin/soak_load" upstream "$work/upstream.port" > "$work/upstream.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -s "$work/upstream.port" ] && break; sleep 0.1; done
UP_PORT=$(cat "$work/upstream.port")

config() { # per_subnet rate
  cat <<CONF
[gateway]
workers = 1
instance_id = "soak"
access_log = "json"
[listeners]
http = "127.0.0.1:$HTTP_PORT"
https = "127.0.0.1:$HTTPS_PORT"
admin = "127.0.0.1:$ADMIN_PORT"
[tls]
cert = "cert.pem"
key = "key.pem"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT"
timeout_ms = 5
[identity.jwt]
algorithms = ["HS256"]
secret = "$SECRET"
tenant_claim = "tid"
[[identity.api_keys]]
key = "soak-key-0"
id = "k0"
tenant = "acme"
plan = "gold"
[[identity.api_keys]]
key = "soak-key-1"
id = "k1"
tenant = "acme"
[[identity.api_keys]]
key = "soak-key-2"
id = "k2"
tenant = "globex"
[[identity.api_keys]]
key = "soak-key-3"
tenant = "initech"
[[upstreams]]
name = "backend"
targets = ["http://127.0.0.1:$UP_PORT"]
[[routes]]
name = "api"
path_prefix = "/api/"
upstream = "backend"
limits = ["per_identity", "per_tenant", "per_subnet"]
on_store_failure = "allow"
[[routes]]
name = "direct"
path_prefix = "/direct/"
response = { status = 200, body = "pong\n" }
limits = ["per_identity", "per_subnet", "per_route"]
on_store_failure = "deny"
[[limits]]
name = "per_identity"
rate = "3000/min"
burst = 500
by = ["identity"]
plans = { gold = "6000/min" }
[[limits]]
name = "per_tenant"
algorithm = "sliding_window"
rate = "1500/min"
by = ["header:x-tenant"]
[[limits]]
name = "per_subnet"
rate = "$1"
burst = 100
by = ["subnet"]
[[limits]]
name = "per_route"
algorithm = "sliding_window"
rate = "600000/min"
by = ["route"]
CONF
}
config "${SUBNET_RATES[0]}" > "$work/gateway.toml"
"$work/bin/leasegate" check --config "$work/gateway.toml" > /dev/null

# The access log (stdout) is written, to /dev/null: its writer is part of
# what is soaked. Diagnostics (stderr) are kept.
LEASEGATE_LOG=info "$work/bin/leasegate" run --config "$work/gateway.toml" > /dev/null 2> "$work/gateway.log" &
gw=$!
pids+=($gw)
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$ADMIN_PORT/readyz" 2>/dev/null | grep -q "store redis: ok" && break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$ADMIN_PORT/readyz" | grep -q "store redis: ok" || { echo "the gateway is not ready" >&2; exit 1; }

# --- the run
echo "soak: ${MINUTES} min, $RATE req/s over $CONNS connections; reload every ${RELOAD_EVERY}s; Redis killed at ${REDIS_FIRST}s and every ${REDIS_EVERY}s for ${REDIS_DOWN}s" >&2
echo "t_s,event" > "$work/events.csv"
T0=$EPOCHREALTIME
# 3 s past the last full window, so that the last sample is taken under load.
"$work/bin/soak_load" load --http "127.0.0.1:$HTTP_PORT" --https "127.0.0.1:$HTTPS_PORT" \
  --ca "$work/ca.pem" --secret "$SECRET" --seconds $((DURATION + 3)) \
  --conns "$CONNS" --streams "$STREAMS" --rate "$RATE" > "$work/load.jsonl" 2> "$work/load.err" &
load=$!
pids+=($load)

reload_loop() {
  local i=0 before after
  while :; do
    i=$((i + 1))
    sleep_until $((i * RELOAD_EVERY))
    before=$(metric 'leasegate_config_reloads_total{result="ok"}')
    config "${SUBNET_RATES[$((i % 2))]}" > "$work/gateway.toml.new"
    mv "$work/gateway.toml.new" "$work/gateway.toml"
    after=$before
    for _ in $(seq 25); do  # the watch looks every 500 ms
      sleep 0.2
      after=$(metric 'leasegate_config_reloads_total{result="ok"}')
      [ "$after" -gt "$before" ] && break
    done
    if [ "$after" -gt "$before" ]; then event "reload_ok ${SUBNET_RATES[$((i % 2))]}"; else event reload_missed; fi
  done
}
redis_loop() {
  local at=$REDIS_FIRST
  # No kill whose restart would come within 10 s of the end.
  while [ $((at + REDIS_DOWN + 10)) -le "$DURATION" ]; do
    sleep_until "$at"
    kill -KILL "$(cat "$work/redis.pid")" 2>/dev/null || true
    event redis_kill
    sleep "$REDIS_DOWN"
    redis_start
    event redis_start
    at=$((at + REDIS_EVERY))
  done
}
sampler() {
  local k=1 t rss fds cpu redis_up load_line
  echo "t_s,rss_kb,fds,lease_keys,conns_open,circuit_open,redis_up,reloads_ok,bypassed,cpu_s,rps,requests,s2xx,s429,s503,other,errors,p50_ms,p99_ms,max_ms,api_503,api_other,api_p99_ms,direct_503,direct_other,direct_p99_ms" > "$work/soak.csv"
  # The load prints its window at k × 10 s; one sample just after each.
  while [ $((k * SAMPLE_EVERY)) -le "$DURATION" ]; do
    sleep_until $((k * SAMPLE_EVERY + 1))
    k=$((k + 1))
    [ -d "/proc/$gw" ] || break
    t=$(elapsed)
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$gw/status")
    fds=$(ls "/proc/$gw/fd" | wc -l)
    cpu=$(awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$gw/stat")
    metrics > "$work/sample.metrics"
    redis_up=0
    redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && redis_up=1
    load_line=$(tail -n 1 "$work/load.jsonl" 2>/dev/null || true)
    python3 - "$t" "$rss" "$fds" "$cpu" "$redis_up" "$load_line" "$work/sample.metrics" <<'PY' >> "$work/soak.csv"
import json, sys
t, rss, fds, cpu, redis_up, line, metrics = sys.argv[1:8]
m = {}
for l in open(metrics).read().splitlines():
    if l and not l.startswith("#"):
        name, _, v = l.rpartition(" ")
        m[name] = float(v)
bypassed = sum(v for k, v in m.items() if k.startswith("rate_limit_bypassed_total"))
try:
    w = json.loads(line)
except ValueError:
    w = {}
if w.get("final"):
    w = {}  # the whole run's line, not a window's
g = lambda d, k: d.get(k, "")
api, direct = w.get("api", {}), w.get("direct", {})
print(",".join(str(x) for x in [t, rss, fds, int(m.get("leasegate_lease_keys", -1)),
    int(m.get("leasegate_connections_open", -1)), int(m.get("leasegate_circuit_open", -1)), redis_up,
    int(m.get('leasegate_config_reloads_total{result="ok"}', -1)), int(bypassed), cpu,
    g(w, "rps"), g(w, "requests"), g(w, "2xx"), g(w, "429"), g(w, "503"), g(w, "other"), g(w, "errors"),
    g(w, "p50_ms"), g(w, "p99_ms"), g(w, "max_ms"),
    g(api, "503"), g(api, "other"), g(api, "p99_ms"), g(direct, "503"), g(direct, "other"), g(direct, "p99_ms")]))
PY
  done
}
reload_loop & reloader=$!
redis_loop & chaos=$!
sampler & sampling=$!
pids+=($reloader $chaos $sampling)

wait "$load" || echo "the load ended with an error" >&2
wait "$sampling" || true  # its last sample, just after the load's last window
kill "$reloader" "$chaos" 2>/dev/null || true
wait "$reloader" "$chaos" 2>/dev/null || true
metrics > "$work/metrics.txt"
# Idle: what is left 10 s after the load stopped (a lease key is forgotten
# max(ttl_ms, max_block_ms) + 1 s after its last use: 6 s here).
redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 || redis_start  # also for the shutdown's give-back
sleep 10
idle="$(awk '/^VmRSS:/ {print $2}' "/proc/$gw/status"),$(ls "/proc/$gw/fd" | wc -l),$(metric leasegate_lease_keys),$(metric leasegate_connections_open)"
stop_at=$EPOCHREALTIME
kill -TERM "$gw"
gw_rc=0
wait "$gw" || gw_rc=$?
stop_s=$(awk -v n="$EPOCHREALTIME" -v z="$stop_at" 'BEGIN {printf "%.2f", n - z}')

cp "$work/soak.csv" "$OUT/soak.csv"
cp "$work/events.csv" "$OUT/soak-events.csv"
if [ -n "$LOGS" ]; then
  cp "$work/gateway.log" "$work/load.jsonl" "$work/load.err" "$work/metrics.txt" "$work/gateway.toml" "$LOGS/"
fi

# --- summary and plot
python3 - "$OUT" "$work" "$MINUTES" "$RATE" "$CONNS" "$STREAMS" "$gw_rc" "$stop_s" "$idle" \
  "$RELOAD_EVERY" "$REDIS_FIRST" "$REDIS_EVERY" "$REDIS_DOWN" <<'PY'
import collections, csv, json, re, sys
out, work, minutes, rate, conns, streams, gw_rc, stop_s, idle = sys.argv[1:10]
reload_every, redis_first, redis_every, redis_down = sys.argv[10:14]
idle_rss, idle_fds, idle_keys, idle_conns = idle.split(",")
rows = list(csv.DictReader(open(f"{out}/soak.csv")))
events = list(csv.DictReader(open(f"{out}/soak-events.csv")))
load = [json.loads(l) for l in open(f"{work}/load.jsonl") if l.strip()]
final = next((l for l in load if l.get("final")), {})
windows = [l for l in load if not l.get("final")]

def num(r, k):
    try:
        return float(r[k])
    except (KeyError, ValueError):
        return None

def series(k):
    return [(float(r["t_s"]), num(r, k)) for r in rows if num(r, k) is not None]

def at(k, frac):
    s = series(k)
    if not s:
        return None
    t_end = s[-1][0]
    return min(s, key=lambda p: abs(p[0] - frac * t_end))[1]

def trend(k):
    """Least-squares slope over the second half of the run, per minute."""
    s = series(k)
    pts = [(t / 60, v) for t, v in s if t >= s[-1][0] / 2] if s else []
    if len(pts) < 3:
        return "n/a"
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return f"{sum((x - mx) * (y - my) for x, y in pts) / den:+.1f}/min over the second half"

def growth(k):
    q, e = at(k, 0.25), at(k, 1.0)
    if q is None or e is None:
        return "n/a"
    pct = (e - q) / q * 100 if q else float("inf")
    return f"{q:.0f} at 25 % -> {e:.0f} at the end ({pct:+.1f} %)"

kills = [float(e["t_s"]) for e in events if e["event"] == "redis_kill"]
starts = [float(e["t_s"]) for e in events if e["event"] == "redis_start"]
reloads_ok = sum(1 for e in events if e["event"].startswith("reload_ok"))
reloads_missed = sum(1 for e in events if e["event"] == "reload_missed")
rss = [v for _, v in series("rss_kb")]
fds = [v for _, v in series("fds")]
keys = [v for _, v in series("lease_keys")]
worst = max(windows, key=lambda w: w.get("p99_ms", 0), default={})

print()
print(f"soak: {minutes} min, {rate} req/s offered over {conns} connections "
      f"(half HTTP/1.1, half HTTP/2 over TLS x {streams} streams), {len(rows)} samples")
print(f"Redis killed {len(kills)} times, reloads applied {reloads_ok} (missed {reloads_missed})")
print()
print("| measure | value |")
print("|---|---|")
print(f"| RSS, max | {max(rss) / 1024:.1f} MB |" if rss else "| RSS | n/a |")
print(f"| RSS, kB | {growth('rss_kb')}; {trend('rss_kb')} |")
print(f"| open fds, max | {max(fds):.0f} |" if fds else "| fds | n/a |")
print(f"| open fds | {growth('fds')}; {trend('fds')} |")
print(f"| lease keys, max | {max(keys):.0f} |" if keys else "| lease keys | n/a |")
print(f"| lease keys | {growth('lease_keys')}; {trend('lease_keys')} |")
print(f"| idle, 10 s after the load | RSS {int(idle_rss) / 1024:.1f} MB, {idle_fds} fds, {idle_keys} lease keys, "
      f"{idle_conns} connections open |")
metrics = {}
for l in open(f"{work}/metrics.txt"):
    if l and not l.startswith("#"):
        name, _, v = l.strip().rpartition(" ")
        try:
            metrics[name] = float(v)
        except ValueError:
            pass
served = sum(v for k, v in metrics.items() if k.startswith("leasegate_requests_total{"))
calls = sum(v for k, v in metrics.items() if k.startswith("leasegate_store_calls_total{"))
cpu = at("cpu_s", 1.0) or 0
print(f"| gateway CPU | {cpu:.1f} s over the run, {cpu / max(served, 1) * 1e6:.0f} µs per request |")
print(f"| store calls per request | {calls / max(served, 1):.2f} (acquires and releases) |")
print(f"| worst 10 s p99 | {worst.get('p99_ms', 0)} ms (window ending at {worst.get('elapsed_s', 0)} s) |")
print(f"| slowest request | {final.get('max_ms', 0)} ms |")
for route in ("api", "direct"):
    w = max(windows, key=lambda w: w.get(route, {}).get("p99_ms", 0), default={})
    print(f"| worst p99 / slowest, {route} | {w.get(route, {}).get('p99_ms', 0)} ms / "
          f"{max((x.get(route, {}).get('max_ms', 0) for x in windows), default=0)} ms |")
print(f"| requests answered | {final.get('requests', 0)} |")
print(f"| 2xx / 429 / 503 / other | {final.get('2xx', 0)} / {final.get('429', 0)} / "
      f"{final.get('503', 0)} / {final.get('other', 0)} |")
api_5xx = sum(v for k, v in metrics.items() if k.startswith('leasegate_requests_total{route="api",status="5'))
print(f"| 5xx on `api`, the fail-open route (gateway's count) | {api_5xx:.0f} |")
print(f"| transport errors (timeouts) | {final.get('errors', 0)} ({final.get('timeouts', 0)}) |")
print(f"| connections opened (failed) | {final.get('connects', 0)} ({final.get('connect_errors', 0)}) |")
print(f"| fresh API keys / JWT subs made | {final.get('fresh_keys', 0)} / {final.get('jwt_subs', 0)} |")
print(f"| shutdown (SIGTERM to exit) | {stop_s} s, exit {gw_rc} |")

# The gateway's own counts, from its last /metrics.
print()
print("gateway /metrics at the end:")
wanted = ("leasegate_requests_total", "rate_limit_bypassed_total", "leasegate_store_calls_total",
          "leasegate_config_reloads_total", "leasegate_upstream_errors_total",
          "leasegate_tls_handshake_failures_total", "leasegate_connections_accepted_total")
for l in open(f"{work}/metrics.txt"):
    if l.startswith(wanted):
        print("   ", l.rstrip())

# The gateway's WARN and ERROR lines, by message.
levels = collections.Counter()
messages = collections.Counter()
for l in open(f"{work}/gateway.log"):
    l = re.sub(r"\x1b\[[0-9;]*m", "", l)
    m = re.search(r"\b(WARN|ERROR)\b\s+(?:[\w:]+:\s+)?(.*)", l)
    if m:
        levels[m.group(1)] += 1
        msg = re.sub(r"\s\w+=.*", "", m.group(2)).strip()
        messages[(m.group(1), msg)] += 1
print()
print(f"gateway log: {levels['WARN']} WARN, {levels['ERROR']} ERROR lines")
for (lvl, msg), n in messages.most_common(12):
    print(f"    {n:6d}  {lvl:5s} {msg}")

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
panels = [("rss_kb", "RSS (MB)", 1 / 1024), ("fds", "open fds", 1), ("lease_keys", "lease keys", 1),
          ("p99_ms", "p99 latency, 10 s window (ms)", 1)]
fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
for ax, (k, label, scale) in zip(axes, panels):
    s = series(k)
    ax.plot([t / 60 for t, _ in s], [v * scale for _, v in s], color="#1f5f9e", linewidth=1.4, marker=".", markersize=3)
    if k == "p99_ms":
        m = series("max_ms")
        ax.plot([t / 60 for t, _ in m], [v for _, v in m], color="#999999", linewidth=0.8, label="max")
        ax.axhline(5, color="#c92a2a", linestyle="--", linewidth=1, label="store deadline (5 ms)")
        ax.set_yscale("log")
        ax.legend(loc="upper right", fontsize=8)
    for i, kt in enumerate(kills):
        end = next((st for st in starts if st > kt), kt)
        ax.axvspan(kt / 60, end / 60, color="#c92a2a", alpha=0.12, label="Redis down" if (i == 0 and k == "rss_kb") else None)
        ax.axvline(kt / 60, color="#c92a2a", linewidth=1)
    ax.set_ylabel(label)
    ax.set_ylim(bottom=0 if k != "p99_ms" else None)
    ax.grid(alpha=0.3)
axes[0].legend(loc="lower right", fontsize=8)
axes[-1].set_xlabel("minutes")
axes[-1].set_xlim(0, int(minutes))
fig.suptitle(f"leasegate soak: {minutes} min, {rate} req/s, {conns} connections, reload every {reload_every} s,\n"
             f"Redis SIGKILLed at {redis_first} s and every {redis_every} s for {redis_down} s (red)", fontsize=10)
fig.tight_layout()
fig.savefig(f"{out}/soak.png", dpi=100)
print(f"\nplot: {out}/soak.png, samples: {out}/soak.csv, events: {out}/soak-events.csv", file=sys.stderr)
PY
echo
echo "$(nproc) CPUs, $(uname -r); redis $(redis-server --version | awk '{print $3}'); $(date -u '+%Y-%m-%d %H:%M UTC')"
