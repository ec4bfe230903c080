#!/usr/bin/env bash
# Two leasegate builds alternated as an HTTP/2 proxy, one worker pinned to
# CPU 0, one limit every request passes, nginx upstream and h2load -t1
# -c32 -m10 on CPU 1: requests/s and the proxy's CPU µs per request per
# round, the after ÷ before ratio of each round, and their medians (min–
# max). h2c (prior knowledge, the plain listener) by default; TLS=1 runs
# h2 over TLS (certs/dev.crt, ALPN h2), where the fingerprint tier
# identifies the client. Used for the log filter of issue 27 and the
# HPACK change of issue 43 (docs/benchmarks.md).
#
#   BEFORE=path AFTER=path [TLS=1] bench/h2c_ab.sh [rounds] [seconds]
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
if [ "${TLS:-0}" != 0 ]; then
  leasegate_toml "https = \"127.0.0.1:$P\"" "$A" off "100000000/s" "$UP" "$PWD/certs" > "$work/g.toml"
  url="https://127.0.0.1:$P/"
else
  leasegate_toml "http = \"127.0.0.1:$P\"" "$A" off "100000000/s" "$UP" > "$work/g.toml"
  url="http://127.0.0.1:$P/"
fi
: > "$work/rounds"
for r in $(seq "$ROUNDS"); do
  for b in BEFORE AFTER; do
    LEASEGATE_LOG=warn taskset -c 0 "${!b}" run --config "$work/g.toml" >/dev/null 2>&1 & g=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$A/healthz" >/dev/null && break; sleep 0.05; done
    taskset -c 1 h2load -t1 -c32 -m10 -D2 "$url" >/dev/null 2>&1
    t0=$(ticks "$g")
    taskset -c 1 h2load -t1 -c32 -m10 -D"$SECS" "$url" > "$work/out" 2>&1
    t1=$(ticks "$g")
    kill $g; wait $g 2>/dev/null || true
    ok=$(awk '/^requests:/ {print $8}' "$work/out")
    failed=$(awk '/^status codes:/ {print $5 + $7 + $9}' "$work/out")
    [ "${failed:-1}" = 0 ] || { echo "$b: responses other than 2xx: $(grep '^status codes' "$work/out")" >&2; exit 1; }
    us=$(awk -v t=$((t1 - t0)) -v n="$ok" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", t / hz * 1e6 / n}')
    rps=$(awk -v n="$ok" -v s="$SECS" 'BEGIN {printf "%.0f", n / s}')
    echo "$b $r $rps $us" | tee -a "$work/rounds"
  done
done
python3 - "$work/rounds" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for b, r, rps, us in rows:
    by.setdefault(int(r), {})[b] = (float(rps), float(us))
def show(xs):
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})"
rps = [v["AFTER"][0] / v["BEFORE"][0] for v in by.values()]
cpu = [v["AFTER"][1] / v["BEFORE"][1] for v in by.values()]
for b in ("BEFORE", "AFTER"):
    print(f"{b}: {statistics.median(v[b][0] for v in by.values()):,.0f} req/s, "
          f"{statistics.median(v[b][1] for v in by.values()):.2f} CPU µs/request (medians)")
print(f"after ÷ before, requests/s: {show(rps)}")
print(f"after ÷ before, CPU per request: {show(cpu)}")
PY
