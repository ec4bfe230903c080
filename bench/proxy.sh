#!/usr/bin/env bash
# leasegate against nginx on one core, like with like, alternating in one
# run (issue #12's table):
#
#   proxy            nginx reverse proxy            vs leasegate proxy + one limit every request passes
#                    (both without access log)
#   proxy + log      nginx, default access_log      vs leasegate, JSON access log (stdout)
#                    to a file                          to a file
#   429              nginx limit_req (serving a     vs leasegate, a limit that refuses every
#                    file, limit_req_status 429)        request (full headers, problem+json)
#   h2 over TLS      nginx https http2 proxy        vs leasegate https proxy + one limit
#                    (h2load)                           (h2load)
#
# and, for scale, the upstream directly and hyper's floor: the least a
# gateway on hyper costs (examples/hyper_floor.rs, served as leasegate
# serves, with none of its work): `hyper` proxies each client connection
# over an upstream connection of its own, `hyper-429` answers leasegate's
# 429, fields and body, fixed, `hyper-h2` is `hyper` behind rustls for
# h2load (ALPN h2, an upstream connection per stream in flight). The
# access-log pair's floor is `hyper`: the floor logs nothing, so against
# it the pair shows the log and leasegate's work together, and the table
# gives the log's own cost (leasegate-log ÷ leasegate) apart. The proxy
# under test is pinned to
# CPU 0 (nginx: one worker; leasegate: workers = 1); the upstream (nginx)
# and the load (wrk -t1, or h2load -t1) share CPU 1.
#
#   bench/proxy.sh [seconds per run] [rounds] [connections] [out dir]
#
# Reports, per target: requests/s and p99 (median and min-max over the
# rounds), the proxy's CPU per request; per pair, leasegate ÷ nginx,
# leasegate ÷ hyper's floor and the floor ÷ nginx (the ratio of each
# round, median and min-max); and what the access log costs each, as
# markdown tables, and
# draws them into OUT/proxy.png (python3 with matplotlib, installed with
# pip if missing). Installs wrk, nginx and h2load (nghttp2-client) from the
# system packages if missing (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

DURATION=${1:-8}
ROUNDS=${2:-5}
CONNS=${3:-32}
OUT=${4:-bench/out}
UP_PORT=18081
declare -A PORT=(
  [nginx]=18082 [leasegate]=18083
  [nginx-log]=18084 [leasegate-log]=18085
  [nginx-429]=18086 [leasegate-429]=18087
  [nginx-h2]=18088 [leasegate-h2]=18089
  [hyper]=18092 [hyper-429]=18093 [hyper-h2]=18094
  [leasegate-lean]=18095
)
ADMIN_BASE=18190

need_tools wrk:wrk nginx:nginx curl:curl h2load:nghttp2-client taskset:util-linux
if [ "$(nproc)" -lt 2 ]; then
  echo "bench/proxy.sh needs at least 2 CPUs (proxy on one, load and upstream on the other)" >&2
  exit 1
fi
python3 -c 'import matplotlib' 2>/dev/null || pip install --quiet matplotlib
cargo build --release --quiet --bin leasegate --example hyper_floor
mkdir -p "$OUT"

bench_work

start_nginx() { # name cpu
  taskset -c "$2" nginx -p "$work/$1" -c "$work/$1/nginx.conf" &
  pids+=($!)
  PID[$1]=$!
}
declare -A PID

PROXY_LOCATION="location / { proxy_pass http://backend; proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme; }"
UPSTREAM_BLOCK="upstream backend { server 127.0.0.1:$UP_PORT; keepalive 64; }"

# The upstream: a fixed 200 with keep-alive, on CPU 1.
nginx_conf upstream "$(ok_server "$UP_PORT")"
start_nginx upstream 1

nginx_conf nginx "$UPSTREAM_BLOCK
  server { listen 127.0.0.1:${PORT[nginx]}; $PROXY_LOCATION }"
# The log goes in the server block: the http block's `access_log off` cancels
# every other access_log of its own level.
nginx_conf nginx-log "$UPSTREAM_BLOCK
  server { listen 127.0.0.1:${PORT[nginx-log]}; access_log $work/nginx-log/access.log; $PROXY_LOCATION }"
mkdir -p "$work/www" && echo ok > "$work/www/index.html"
# One bucket for every request, like leasegate's `by = ["route"]`. The key
# must not be empty: limit_req does not account requests whose key is, and
# $server_name is empty unless server_name is set.
nginx_conf nginx-429 "limit_req_zone \$server_name zone=one:1m rate=1r/m;
  server { listen 127.0.0.1:${PORT[nginx-429]}; server_name bench;
    location / { root $work/www; limit_req zone=one nodelay; limit_req_status 429; } }"
nginx_conf nginx-h2 "$UPSTREAM_BLOCK
  server { listen 127.0.0.1:${PORT[nginx-h2]} ssl http2;
    ssl_certificate $PWD/certs/dev.crt; ssl_certificate_key $PWD/certs/dev.key;
    $PROXY_LOCATION }"
for n in nginx nginx-log nginx-429 nginx-h2; do start_nginx "$n" 0; done

# leasegate NAME LISTENER-LINE ACCESS-LOG LIMIT-RATE [GATEWAY-LINES LIMIT-LINES]
leasegate() {
  local name=$1 admin=$((ADMIN_BASE + ${#pids[@]}))
  leasegate_toml "$2" "$admin" "$3" "$4" "$UP_PORT" "$PWD/certs" "${5:-}" "${6:-}" > "$work/$name.toml"
  LEASEGATE_LOG=warn taskset -c 0 ./target/release/leasegate run --config "$work/$name.toml" \
    > "$work/$name.access.log" &
  pids+=($!)
  PID[$name]=$!
}
PASS="100000000/s"
leasegate leasegate "http = \"127.0.0.1:${PORT[leasegate]}\"" off "$PASS"
leasegate leasegate-log "http = \"127.0.0.1:${PORT[leasegate-log]}\"" json "$PASS"
leasegate leasegate-429 "http = \"127.0.0.1:${PORT[leasegate-429]}\"" off "1/h"
# The operator's lean choice: RateLimit-* on 429s only, the client's
# x-request-id forwarded (wrk sends none: generated, but not echoed back).
leasegate leasegate-lean "http = \"127.0.0.1:${PORT[leasegate-lean]}\"" off "$PASS" \
  'request_id = "forward"' 'headers = "refusals"'
leasegate leasegate-h2 "https = \"127.0.0.1:${PORT[leasegate-h2]}\"" off "$PASS"

# hyper_floor NAME MODE [UPSTREAM-PORT [CERT KEY]]
hyper_floor() {
  local name=$1 mode=$2
  shift 2
  taskset -c 0 ./target/release/examples/hyper_floor "$mode" "${PORT[$name]}" "$@" 2>/dev/null &
  pids+=($!)
  PID[$name]=$!
}
hyper_floor hyper proxy "$UP_PORT"
hyper_floor hyper-429 429
hyper_floor hyper-h2 tls "$UP_PORT" "$PWD/certs/dev.crt" "$PWD/certs/dev.key"

for n in upstream nginx leasegate leasegate-lean hyper nginx-log leasegate-log nginx-429 leasegate-429 hyper-429; do
  port=${PORT[$n]:-$UP_PORT}
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null && break; sleep 0.1; done
done
for n in nginx-h2 leasegate-h2 hyper-h2; do
  for _ in $(seq 100); do curl -sk -o /dev/null --http2 "https://127.0.0.1:${PORT[$n]}/" && break; sleep 0.1; done
done

# expect_status NAME: the target answers what its row claims to measure,
# 429 for the *-429 pair and 200 for the rest ("not 2xx" is not enough: an
# nginx that cannot read its file answers 403, cheaper than limit_req's 429).
expect_status() {
  local name=$1 want=200 got
  case $name in *-429) want=429 ;; esac
  case $name in
    *-h2) got=$(curl -sk -o /dev/null -w '%{http_code}' --http2 "https://127.0.0.1:${PORT[$name]}/") ;;
    *) got=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${PORT[$name]:-$UP_PORT}/") ;;
  esac
  if [ "$got" != "$want" ]; then
    echo "$name: answers $got, expected $want" >&2
    exit 1
  fi
}

# log_size NAME: bytes in the access log of a *-log target (nothing for the
# others); `run` holds each to growing while it is timed.
log_size() {
  case $1 in
    nginx-log) stat -c %s "$work/nginx-log/access.log" ;;
    leasegate-log) stat -c %s "$work/leasegate-log.access.log" ;;
  esac
}


# run NAME -> "rps p99_ms cpu_us_per_request"
run() {
  local name=$1 before after rps p99 reqs cpu="-"
  local pid=${PID[$name]:-} logged
  logged=$(log_size "$name")
  [ -n "$pid" ] && before=$(ticks "$pid")
  case $name in
    *-h2)
      taskset -c 1 h2load -t1 -c"$CONNS" -m10 -D"$DURATION" "https://127.0.0.1:${PORT[$name]}/" > "$work/load.out" 2>&1
      rps=$(awk '/^finished in/ {gsub(",", "", $4); print $4}' "$work/load.out")
      reqs=$(awk '/^requests:/ {print $6}' "$work/load.out")
      # h2load counts any answer as succeeded: every one must be a 2xx.
      local ok
      ok=$(awk '/^status codes:/ {print $3}' "$work/load.out")
      if [ -z "$reqs" ] || [ "$ok" != "$reqs" ]; then
        echo "$name: $ok of ${reqs:-?} answers were 2xx" >&2; cat "$work/load.out" >&2; exit 1
      fi
      # h2load has no percentiles: the mean + 3 sd of its request times stands in.
      p99=$(awk 'function ms(v) { if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
                                 if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
                                 if (v ~ /s$/) return substr(v, 1, length(v) - 1) * 1000
                                 return v + 0 }
        /^time for request:/ {printf "%.2f", ms($6) + 3 * ms($7)}' "$work/load.out")
      ;;
    *)
      local port=${PORT[$name]:-$UP_PORT}
      taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$port/" > "$work/load.out"
      rps=$(awk '/^Requests\/sec:/ {print $2}' "$work/load.out")
      p99=$(wrk_p99_ms "$work/load.out")
      reqs=$(awk '/requests in/ {print $1}' "$work/load.out")
      case $name in
        *-429) grep -q "Non-2xx" "$work/load.out" || { echo "$name: expected 429s" >&2; cat "$work/load.out" >&2; exit 1; } ;;
        *) if grep -q "Non-2xx" "$work/load.out"; then echo "$name: non-2xx answers" >&2; cat "$work/load.out" >&2; exit 1; fi ;;
      esac
      ;;
  esac
  if [ -n "$pid" ]; then
    after=$(ticks "$pid")
    cpu=$(awk -v t=$((after - before)) -v hz="$HZ" -v n="$reqs" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
  fi
  expect_status "$name"
  if [ -n "$logged" ] && [ "$(log_size "$name")" -le "$logged" ]; then
    echo "$name: its access log did not grow under load" >&2
    exit 1
  fi
  echo "$rps $p99 $cpu"
}

names=(upstream nginx hyper leasegate leasegate-lean nginx-log leasegate-log nginx-429 hyper-429 leasegate-429 nginx-h2 hyper-h2 leasegate-h2)
for n in "${names[@]}"; do run "$n" >/dev/null; done   # warm-up
: > "$work/rows"
for r in $(seq "$ROUNDS"); do
  # Alternate which side of each pair goes first.
  order=("${names[@]}")
  if [ $((r % 2)) -eq 0 ]; then
    order=(upstream leasegate-lean leasegate hyper nginx leasegate-log nginx-log leasegate-429 hyper-429 nginx-429 leasegate-h2 hyper-h2 nginx-h2)
  fi
  for n in "${order[@]}"; do
    read -r rps p99 cpu < <(run "$n")
    echo "$r $n $rps $p99 $cpu" >> "$work/rows"
    echo "round $r $n: $rps req/s, p99 $p99 ms, CPU $cpu us/request" >&2
  done
done
cp "$work/rows" "$OUT/proxy.rows"

# Tables and the plot, from the rows (round name rps p99 cpu).
python3 - "$OUT" "$ROUNDS" "$DURATION" "$CONNS" <<'PY'
import sys, statistics, collections
out, rounds, duration, conns = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = [l.split() for l in open(f"{out}/proxy.rows")]
by = collections.defaultdict(dict)
for r, name, rps, p99, cpu in rows:
    by[name][int(r)] = (float(rps), float(p99), None if cpu == "-" else float(cpu))
def stat(vals):
    vals = [v for v in vals if v is not None]
    if not vals: return "—"
    m = statistics.median(vals)
    return f"{m:,.2f} ({min(vals):,.2f}–{max(vals):,.2f})" if m < 100 else f"{m:,.0f} ({min(vals):,.0f}–{max(vals):,.0f})"
print(f"\n| target | requests/s | p99 ms | proxy CPU µs/request |\n|---|---|---|---|")
for name in by:
    v = by[name].values()
    print(f"| {name} | {stat([x[0] for x in v])} | {stat([x[1] for x in v])} | {stat([x[2] for x in v])} |")
# (label, nginx, hyper's floor, leasegate): the access-log pair's floor is
# the proxy floor, which logs nothing.
pairs = [("proxy, no access log", "nginx", "hyper", "leasegate"),
         ("proxy, headers on 429s, request id forwarded", "nginx", "hyper", "leasegate-lean"),
         ("proxy, access log", "nginx-log", "hyper", "leasegate-log"),
         ("429 path", "nginx-429", "hyper-429", "leasegate-429"),
         ("h2 over TLS (h2load)", "nginx-h2", "hyper-h2", "leasegate-h2")]
def per_round(num, den):
    return [by[num][r][0] / by[den][r][0] for r in by[den] if r in by[num]]
def spread(rs):
    return f"{statistics.median(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})"
print(f"\n| pair | leasegate ÷ nginx | leasegate ÷ hyper's floor | hyper's floor ÷ nginx | p99 ms, leasegate / floor / nginx (medians) |\n|---|---|---|---|---|")
ratios, floors = {}, {}
for label, n, f, l in pairs:
    ratios[label], floors[label] = per_round(l, n), per_round(l, f)
    p = [statistics.median([x[1] for x in by[t].values()]) for t in (l, f, n)]
    print(f"| {label} | {spread(ratios[label])} | {spread(floors[label])} | {spread(per_round(f, n))} | {p[0]:.2f} / {p[1]:.2f} / {p[2]:.2f} |")
print(f"\n| what the access log costs, requests/s per round | ratio |\n|---|---|")
print(f"| leasegate-log ÷ leasegate | {spread(per_round('leasegate-log', 'leasegate'))} |")
print(f"| nginx-log ÷ nginx | {spread(per_round('nginx-log', 'nginx'))} |")
print(f"\n{rounds} rounds of {duration} s, {conns} connections; medians with min–max over the rounds.")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("(matplotlib missing: no plot)", file=sys.stderr); sys.exit(0)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
labels = [p[0] for p in pairs]
x = range(len(pairs))
for i, (col, who, color) in enumerate([(1, "nginx", "#888888"), (2, "hyper's floor", "#4c6ef5"), (3, "leasegate", "#d9822b")]):
    med, lo, hi = [], [], []
    for pair in pairs:
        vals = [v[0] for v in by[pair[col]].values()]
        m = statistics.median(vals); med.append(m); lo.append(m - min(vals)); hi.append(max(vals) - m)
    ax1.bar([j + (i - 1) * 0.27 for j in x], med, 0.27, yerr=[lo, hi], capsize=3, label=who, color=color)
ax1.set_xticks(list(x)); ax1.set_xticklabels(labels, rotation=12, fontsize=8)
ax1.set_ylabel("requests/s (median, min–max)"); ax1.set_title("Throughput on one core"); ax1.legend(fontsize=8)
for i, (series, who, color) in enumerate([(ratios, "leasegate ÷ nginx", "#888888"), (floors, "leasegate ÷ hyper's floor", "#4c6ef5")]):
    meds = [statistics.median(series[l]) for l in labels]
    errs = [[m - min(series[l]) for m, l in zip(meds, labels)], [max(series[l]) - m for m, l in zip(meds, labels)]]
    xs = [j + (i - 0.5) * 0.38 for j in x]
    ax2.bar(xs, meds, 0.38, yerr=errs, capsize=3, color=color, label=who)
    for j, m in zip(xs, meds): ax2.text(j, m + 0.03, f"{m:.2f}", ha="center", fontsize=8)
ax2.axhline(1.0, color="black", linewidth=1)
ax2.set_xticks(list(x)); ax2.set_xticklabels(labels, rotation=12, fontsize=8)
ax2.set_ylabel("requests/s ratio (per round)"); ax2.set_title("leasegate against nginx and hyper's floor (1.0 = parity)")
ax2.legend(fontsize=8)
fig.tight_layout(); fig.savefig(f"{out}/proxy.png", dpi=110)
print(f"plot: {out}/proxy.png", file=sys.stderr)
PY
echo
echo "proxies pinned to CPU 0, load and upstream to CPU 1; $(nproc) CPUs, $(uname -r); $(nginx -v 2>&1)"
