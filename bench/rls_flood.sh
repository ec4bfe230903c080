#!/usr/bin/env bash
# Does a flood of Envoy RLS calls slow down the admin listener and the HTTP
# listener? RLS runs on its own runtime ([rls] workers threads), apart from
# the control thread (admin, region link, lease sweeps, reloads) and the
# HTTP workers: this measures what that buys.
#
#   bench/rls_flood.sh [seconds per phase] [rounds]
#   LEASEGATE=target/release/leasegate BEFORE=/tmp/leasegate-before bench/rls_flood.sh 8 5
#
# One leasegate at a time ([gateway] workers = 1, memory store): an http
# listener with one direct-response route and one limit no load reaches,
# an admin listener, and [rls] with a one-rule YAML. Each round starts it
# afresh and measures, with paced load (h2load --rps, one request in flight
# per connection, every request's time logged with --log-file), the p99 of
# `GET /` on the http listener and `GET /healthz` on the admin listener:
# first with RLS idle, then during a flood of ShouldRateLimit calls (h2load
# over h2c: POST /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit,
# content-type application/grpc, a RateLimitRequest encoded below). Prints
# each round's p99s and their ratio (flood / idle), the RLS calls/s the
# flood achieved (leasegate_rls_requests_total over the measured seconds),
# then the medians with min-max over the rounds.
#
# Binaries: LEASEGATE (default target/release/leasegate, built with cargo
# first only when LEASEGATE is unset), and optionally BEFORE, another build
# (e.g. the one before RLS got its own runtime) run alternately with it in
# every round, on the same ports and CPUs. Both are copied away first, so a
# rebuild during the run does not touch them. RLS_WORKERS sets
# [rls] workers for LEASEGATE (unset: the default, 1; BEFORE never gets the
# key, which an older build would refuse).
#
# Pinning (taskset): leasegate on GW_CPUS (0), the two probes on PROBE_CPUS
# (1), the flood on FLOOD_CPUS (2, or 1 on a machine with 2 CPUs, where the
# flood's client then competes with the probes).
# Load: HTTP_CLIENTS (4) x HTTP_RPS (250/s each) on the http listener,
# ADMIN_CLIENTS (2) x ADMIN_RPS (100/s each) on the admin listener,
# FLOOD_CONNS (16) HTTP/2 connections x FLOOD_STREAMS (32) calls in flight,
# DESCRIPTORS (1) descriptors per call.
# Installs h2load (nghttp2-client), curl and taskset (util-linux) if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

DURATION=${1:-8}
ROUNDS=${2:-3}
HTTP_CLIENTS=${HTTP_CLIENTS:-4}
HTTP_RPS=${HTTP_RPS:-250}
ADMIN_CLIENTS=${ADMIN_CLIENTS:-2}
ADMIN_RPS=${ADMIN_RPS:-100}
FLOOD_CONNS=${FLOOD_CONNS:-16}
FLOOD_STREAMS=${FLOOD_STREAMS:-32}
DESCRIPTORS=${DESCRIPTORS:-1}
RLS_WORKERS=${RLS_WORKERS:-}
HTTP_PORT=18880 ADMIN_PORT=18881 RLS_PORT=18882

need_tools h2load:nghttp2-client curl:curl taskset:util-linux
NCPU=$(nproc)
if [ "$NCPU" -lt 2 ]; then
  echo "bench/rls_flood.sh needs at least 2 CPUs (leasegate on one, the load on the other)" >&2
  exit 1
fi
GW_CPUS=${GW_CPUS:-0}
PROBE_CPUS=${PROBE_CPUS:-1}
FLOOD_CPUS=${FLOOD_CPUS:-$([ "$NCPU" -ge 3 ] && echo 2 || echo 1)}
if [ "$DESCRIPTORS" -lt 1 ] || [ "$DESCRIPTORS" -gt 64 ]; then
  echo "DESCRIPTORS: 1 to 64 (leasegate refuses more in one call)" >&2
  exit 1
fi
for p in $HTTP_PORT $ADMIN_PORT $RLS_PORT; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "port $p is in use: another rls_flood running?" >&2
    exit 1
  fi
done

if [ -z "${LEASEGATE:-}" ]; then
  cargo build --release --quiet --bin leasegate
fi
LEASEGATE=${LEASEGATE:-${CARGO_TARGET_DIR:-target}/release/leasegate}
BEFORE=${BEFORE:-}
[ -x "$LEASEGATE" ] || { echo "no leasegate binary at $LEASEGATE" >&2; exit 1; }
[ -z "$BEFORE" ] || [ -x "$BEFORE" ] || { echo "no leasegate binary at BEFORE=$BEFORE" >&2; exit 1; }

work=$(mktemp -d)
gw=""
flood=""
cleanup() {
  for p in $flood $gw; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

builds=(current)
cp "$LEASEGATE" "$work/current"
if [ -n "$BEFORE" ]; then
  builds+=(before)
  cp "$BEFORE" "$work/before"
fi

cat > "$work/ratelimit.yaml" <<'YAML'
domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100000000}
YAML

# config NAME [RLS-LINE]: $work/NAME.toml.
config() {
  cat > "$work/$1.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
grace_period_ms = 1000
[listeners]
http = "127.0.0.1:$HTTP_PORT"
admin = "127.0.0.1:$ADMIN_PORT"
[store]
backend = "memory"
[rls]
listen = "127.0.0.1:$RLS_PORT"
config = "ratelimit.yaml"
${2:-}
[[routes]]
name = "all"
path_prefix = "/"
response = { status = 200, body = "ok" }
limits = ["roomy"]
[[limits]]
name = "roomy"
rate = "100000000/s"
by = ["route"]
CONF
}
config current "${RLS_WORKERS:+workers = $RLS_WORKERS}"
config before
for b in "${builds[@]}"; do
  "$work/$b" check --config "$work/$b.toml" > "$work/$b.check" 2>&1 ||
    { echo "$b: leasegate check refused the config:" >&2; cat "$work/$b.check" >&2; exit 1; }
done

# The ShouldRateLimit call, hand-encoded. Protobuf: RateLimitRequest {
# 1: domain, 2: repeated RateLimitDescriptor { 1: repeated Entry { 1: key,
# 2: value } } }, hits_addend left out (1). Every part here is under 128
# bytes, so each length is one byte. gRPC frames it: a 0 byte (not
# compressed), then the message's length, 4 bytes big-endian.
byte() { printf '%b' "\\x$(printf %02x "$1")"; }
# pb_field FIELD FILE: a length-delimited field (wire type 2) holding FILE.
pb_field() {
  local len
  len=$(wc -c < "$2")
  [ "$len" -lt 128 ] || { echo "pb_field: $2 has $len bytes, more than one length byte holds" >&2; exit 1; }
  byte $(($1 << 3 | 2))
  byte "$len"
  cat "$2"
}
# pb_string FIELD STRING
pb_string() {
  printf '%s' "$2" > "$work/pb.str"
  pb_field "$1" "$work/pb.str"
}
pb_string 1 bench > "$work/request.pb"
for i in $(seq "$DESCRIPTORS"); do
  { pb_string 1 tenant; pb_string 2 "t$i"; } > "$work/entry.pb"
  pb_field 1 "$work/entry.pb" > "$work/descriptor.pb"
  pb_field 2 "$work/descriptor.pb" >> "$work/request.pb"
done
len=$(wc -c < "$work/request.pb")
{
  byte 0
  byte $((len >> 24 & 255)); byte $((len >> 16 & 255)); byte $((len >> 8 & 255)); byte $((len & 255))
  cat "$work/request.pb"
} > "$work/should.grpc"
RLS_URL="http://127.0.0.1:$RLS_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
# load LIMIT OUT CPUS H2LOAD-ARGS...: h2load in the foreground, killed if it
# is still running LIMIT seconds later (it has hung on servers that close
# their connections), which fails the run.
load() {
  local limit=$1 out=$2 cpus=$3
  shift 3
  taskset -c "$cpus" timeout "$limit" h2load "$@" > "$out" 2>&1 ||
    { echo "h2load did not finish within ${limit}s: h2load $*" >&2; cat "$out" >&2; exit 1; }
}
# rls_load SECONDS|-nCOUNT OUT: the flood.
rls_load() {
  local amount limit=60
  case $1 in -n*) amount=$1 ;; *) amount=-D$1 limit=$(($1 + 30)) ;; esac
  load "$limit" "$2" "$FLOOD_CPUS" -t1 -c"$FLOOD_CONNS" -m"$FLOOD_STREAMS" "$amount" \
    -d "$work/should.grpc" -H 'content-type: application/grpc' -H 'te: trailers' "$RLS_URL"
}

# rls_calls [LABEL...]: ShouldRateLimit calls answered, over the
# leasegate_rls_requests_total series that carry every LABEL (all without).
rls_calls() {
  curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v want="$*" '
    index($0, "leasegate_rls_requests_total{") != 1 {next}
    {k = split(want, w, " "); for (i = 1; i <= k; i++) if (index($0, w[i]) == 0) next; n += $NF}
    END {printf "%d\n", n}'
}
rls_ok() { rls_calls 'domain="bench"' 'code="OK"'; }

start() { # BUILD
  taskset -c "$GW_CPUS" env LEASEGATE_LOG=warn "$work/$1" run --config "$work/$1.toml" > /dev/null 2> "$work/$1.log" &
  gw=$!
  local ready=""
  for _ in $(seq 100); do
    if curl -fsS -o /dev/null "http://127.0.0.1:$ADMIN_PORT/healthz" 2>/dev/null &&
      curl -fsS -o /dev/null "http://127.0.0.1:$HTTP_PORT/" 2>/dev/null &&
      (exec 3<>"/dev/tcp/127.0.0.1/$RLS_PORT") 2>/dev/null; then
      ready=1
      break
    fi
    sleep 0.1
  done
  [ -n "$ready" ] || { echo "$1: not listening after 10 s:" >&2; cat "$work/$1.log" >&2; exit 1; }
  # The encoded call must be answered OK by the YAML's rule, not refused.
  local ok0
  ok0=$(rls_ok)
  rls_load -n1000 "$work/check.out"
  if [ $(($(rls_ok) - ok0)) -lt 1000 ]; then
    echo "$1: 1000 ShouldRateLimit calls were not all answered OK:" >&2
    cat "$work/check.out" >&2
    curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" | grep '^leasegate_rls' >&2 || true
    exit 1
  fi
}
stop() {
  kill -TERM "$gw"
  wait "$gw" 2>/dev/null || true
  gw=""
}

# probe NAME PORT PATH CLIENTS RPS: paced requests for DURATION seconds,
# one line per request in $work/NAME.log (start µs, status, µs taken).
probe() {
  rm -f "$work/$1.log"
  load $((DURATION + 30)) "$work/$1.out" "$PROBE_CPUS" --h1 -t1 -c"$4" --rps="$5" -D"$DURATION" \
    --log-file="$work/$1.log" "http://127.0.0.1:$2$3"
}
# probes: both at once.
probes() {
  probe http "$HTTP_PORT" / "$HTTP_CLIENTS" "$HTTP_RPS" &
  local a=$!
  probe admin "$ADMIN_PORT" /healthz "$ADMIN_CLIENTS" "$ADMIN_RPS" &
  local b=$!
  wait "$a"
  wait "$b"
}
# p99_ms NAME: the p99 of NAME's answered requests, in ms (failures said on stderr).
p99_ms() {
  local n bad
  bad=$(awk -F'\t' '$2 != 200' "$work/$1.log" | wc -l)
  [ "$bad" -eq 0 ] || echo "$1: $bad requests failed or did not get 200" >&2
  awk -F'\t' '$2 == 200 {print $3}' "$work/$1.log" | sort -n > "$work/$1.sorted"
  n=$(wc -l < "$work/$1.sorted")
  if [ "$n" -eq 0 ]; then
    echo "$1: no request answered:" >&2
    cat "$work/$1.out" >&2
    exit 1
  fi
  awk -v n="$n" 'NR == int((99 * n + 99) / 100) {printf "%.3f\n", $1 / 1000; exit}' "$work/$1.sorted"
}

# run BUILD: appends "build listener idle flood ratio" to $work/rows
# and "build calls_per_sec" to $work/calls.
run() {
  local b=$1 idle_http idle_admin flood_http flood_admin t0 t1 c0 c1
  start "$b"
  probes
  idle_http=$(p99_ms http)
  idle_admin=$(p99_ms admin)
  rls_load $((DURATION + 3)) "$work/flood.out" &
  flood=$!
  sleep 1
  c0=$(rls_calls)
  t0=$(date +%s.%N)
  probes
  c1=$(rls_calls)
  t1=$(date +%s.%N)
  wait "$flood" || { echo "$b: the flood's h2load failed" >&2; exit 1; }
  flood=""
  if [ "$c1" -le "$c0" ]; then
    echo "$b: no ShouldRateLimit call answered during the flood:" >&2
    cat "$work/flood.out" >&2
    exit 1
  fi
  stop
  flood_http=$(p99_ms http)
  flood_admin=$(p99_ms admin)
  awk -v b="$b" -v i="$idle_http" -v f="$flood_http" 'BEGIN {printf "%s http %s %s %.2f\n", b, i, f, f / i}' >> "$work/rows"
  awk -v b="$b" -v i="$idle_admin" -v f="$flood_admin" 'BEGIN {printf "%s admin %s %s %.2f\n", b, i, f, f / i}' >> "$work/rows"
  awk -v b="$b" -v n=$((c1 - c0)) -v t0="$t0" -v t1="$t1" 'BEGIN {printf "%s %.0f\n", b, n / (t1 - t0)}' >> "$work/calls"
}

: > "$work/rows"
: > "$work/calls"
for r in $(seq "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  # Alternate which build goes first.
  order=("${builds[@]}")
  if [ $((r % 2)) -eq 0 ] && [ ${#builds[@]} -eq 2 ]; then order=("${builds[1]}" "${builds[0]}"); fi
  for b in "${order[@]}"; do run "$b"; done
  n=$((${#builds[@]} * 2))
  echo
  echo "Round $r:"
  echo
  echo "| build | listener | p99 RLS idle, ms | p99 during the RLS flood, ms | flood / idle |"
  echo "|---|---|---|---|---|"
  tail -n "$n" "$work/rows" | sort -k1,1 -k2,2 -s | awk '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5}'
  echo
  tail -n "${#builds[@]}" "$work/calls" | sort -k1,1 | awk '{printf "RLS calls/s during the flood, %s: %s\n", $1, $2}'
done

echo
echo "Over $ROUNDS rounds, median (min-max):"
echo
echo "| build | listener | p99 RLS idle, ms | p99 during the RLS flood, ms | flood / idle |"
echo "|---|---|---|---|---|"
for b in "${builds[@]}"; do
  for l in http admin; do
    col() { awk -v b="$b" -v l="$l" -v c="$1" '$1 == b && $2 == l {print $c}' "$work/rows" | med; }
    echo "| $b | $l | $(col 3) | $(col 4) | $(col 5) |"
  done
done
echo
echo "| build | RLS calls/s during the flood |"
echo "|---|---|"
for b in "${builds[@]}"; do
  echo "| $b | $(awk -v b="$b" '$1 == b {print $2}' "$work/calls" | med) |"
done
echo
echo "current: $LEASEGATE${RLS_WORKERS:+ ([rls] workers = $RLS_WORKERS)}${BEFORE:+; before: $BEFORE}"
echo "${DURATION}s per phase; http: $HTTP_CLIENTS x $HTTP_RPS/s, admin: $ADMIN_CLIENTS x $ADMIN_RPS/s (h2load --h1 --rps, CPUs $PROBE_CPUS);" \
  "flood: h2load -c$FLOOD_CONNS -m$FLOOD_STREAMS, $DESCRIPTORS descriptor(s) per call (CPUs $FLOOD_CPUS); leasegate on CPUs $GW_CPUS"
echo "$NCPU CPUs, $(uname -r), $(h2load --version 2>/dev/null | head -1)"
