#!/usr/bin/env bash
# Two leasegate builds side by side, at the same time, on the same core:
# does a change make a request cheaper?
#
#   bench/ab.sh BASE_BINARY VARIANT_BINARY [proxy|log|429|h2c|h2tls] [rounds] [seconds]
#
# h2c and h2tls drive each build with h2load (-t1 -c32 -m10) instead of
# wrk: HTTP/2 by prior knowledge on the plain listener, or over TLS
# (certs/dev.crt, ALPN h2) where the fingerprint tier identifies clients.
#
# Both builds run pinned to CPU 0 with `workers = 1`, each driven by its own
# wrk (-t1 -c32) on CPU 1, in the same seconds; an nginx upstream on CPU 1
# answers 200. Whatever else the machine does in those seconds, it does to
# both: their CPU per request (user + system, /proc) can be compared within
# a round even when the machine drifts by 20-30 % between rounds, which
# one-after-the-other runs cannot. A build against itself gives ratios of
# 0.99-1.01; a change that moves the ratio by 2 % or more in every round is
# real. Prints, per round, requests and CPU µs/request of each, and the
# variant's CPU per request as a share of the base's; then the median.
#
#   cp target/release/leasegate /tmp/base   # before the change
#   cargo build --release && bench/ab.sh /tmp/base target/release/leasegate proxy
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

BASE=${1:?usage: bench/ab.sh BASE_BINARY VARIANT_BINARY [proxy|log|429|h2c|h2tls] [rounds] [seconds]}
VARIANT=${2:?usage: bench/ab.sh BASE_BINARY VARIANT_BINARY [proxy|log|429|h2c|h2tls] [rounds] [seconds]}
MODE=${3:-proxy}
ROUNDS=${4:-5}
SECS=${5:-4}
UP_PORT=18181
need_tools wrk:wrk nginx:nginx taskset:util-linux
case $MODE in h2c | h2tls) need_tools h2load:nghttp2-client ;; esac

bench_work
nginx_conf up "$(ok_server "$UP_PORT")"
taskset -c 1 nginx -p "$work/up" -c "$work/up/nginx.conf" &
pids+=($!)

case $MODE in
  proxy) log=off rate="100000000/s" ;;
  log) log=json rate="100000000/s" ;;
  429) log=off rate="1/h" ;;
  h2c | h2tls) log=off rate="100000000/s" ;;
  *) echo "mode: proxy, log, 429, h2c or h2tls" >&2; exit 2 ;;
esac
scheme=http certs=""
[ "$MODE" = h2tls ] && scheme=https certs="$PWD/certs"
start() { # name binary port admin
  leasegate_toml "$scheme = \"127.0.0.1:$3\"" "$4" "$log" "$rate" "$UP_PORT" $certs > "$work/$1.toml"
  LEASEGATE_LOG=warn taskset -c 0 "$2" run --config "$work/$1.toml" > "$work/$1.out" &
  pids+=($!)
}
start a "$BASE" 18182 18282
start b "$VARIANT" 18183 18283
PA=${pids[1]} PB=${pids[2]}
for port in $UP_PORT 18182 18183; do
  s=$scheme; [ "$port" = "$UP_PORT" ] && s=http
  for _ in $(seq 100); do curl -sk -o /dev/null "$s://127.0.0.1:$port/" && break; sleep 0.1; done
done
# load PORT OUT: drives one build for SECS seconds; prints the requests done.
load() {
  case $MODE in
    h2c | h2tls)
      taskset -c 1 h2load -t1 -c32 -m10 -D"$SECS" "$scheme://127.0.0.1:$1/" > "$2"
      awk '/^status codes:/ {if ($5 + $7 + $9) print "non-2xx answers" > "/dev/stderr"} /^requests:/ {print $8}' "$2" ;;
    *)
      taskset -c 1 wrk -t1 -c32 -d"${SECS}s" "http://127.0.0.1:$1/" > "$2"
      awk '/requests in/ {print $1}' "$2" ;;
  esac
}

ticks() { local t=0 q; for q in /proc/"$1"/task/*; do t=$((t + $(awk '{print $14 + $15}' "$q/stat"))); done; echo $t; }
: > "$work/ratios"
for r in $(seq "$ROUNDS"); do
  a0=$(ticks "$PA") b0=$(ticks "$PB")
  load 18182 "$work/wa" > "$work/na" &
  wa=$!
  load 18183 "$work/wb" > "$work/nb"
  wait "$wa"
  a1=$(ticks "$PA") b1=$(ticks "$PB")
  na=$(cat "$work/na") nb=$(cat "$work/nb")
  awk -v na="$na" -v nb="$nb" -v ta=$((a1 - a0)) -v tb=$((b1 - b0)) -v hz="$(getconf CLK_TCK)" -v r="$r" 'BEGIN {
    ca = ta / hz * 1e6 / na; cb = tb / hz * 1e6 / nb
    printf "round %d: base %d requests, %.1f µs/request; variant %d requests, %.1f µs/request; variant/base CPU %.3f\n", r, na, ca, nb, cb, cb / ca
  }' | tee -a "$work/ratios"
done
awk '{print $NF}' "$work/ratios" | sort -n | awk '{v[NR] = $1} END {
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "variant/base CPU per request (%s): median %.3f (%.3f-%.3f) over %d rounds\n", "'"$MODE"'", m, v[1], v[NR], NR
}'
