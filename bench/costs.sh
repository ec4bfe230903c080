#!/usr/bin/env bash
# What a cost settled from the response costs the proxy (issues 24, 38):
# one leasegate on one core (workers = 1, pinned to CPU 0, no access log)
# in front of an nginx upstream and under wrk -t1 (both on CPU 1), on one
# Redis, one key for the route (a limit no request reaches), six targets
# alternated in each round, every request a POST of a chat completion's
# JSON body (as an SDK sends it):
#
#   plain-json   token bucket, each request 1 token,  JSON body with usage
#   cost-json    cost = { reserve = 10, settle = "json:usage.total_tokens" }
#   preset-json  cost = { api = "openai" }: the body read and priced
#   plain-sse    token bucket, each request 1 token,  event stream with usage
#   cost-sse     the same cost, read from the stream's last usage event
#   preset-sse   cost = { api = "openai" }: the request streams without
#                include_usage, so it is forwarded asking for it and the
#                usage chunk is removed from the client's stream
#
# The upstream answers the same bytes to every target of a kind; its usage
# says 12, so every request settled by a rule is charged 2 above its
# reserve of 10, and every preset's is refunded most of its reserve.
#
#   bench/costs.sh [seconds per run] [rounds] [connections]
#
# Reports, per target, requests/s (median, min-max over the rounds) and the
# gateway's store calls per request (leasegate_store_calls_total), and per
# pair cost ÷ plain (each round's ratio: median, min-max). Installs wrk,
# nginx and redis-server from the system packages if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

DURATION=${1:-8}
ROUNDS=${2:-5}
CONNS=${3:-32}
UP_PORT=18281
REDIS_PORT=18290
declare -A PORT=([plain-json]=18282 [cost-json]=18283 [plain-sse]=18284 [cost-sse]=18285 [preset-json]=18286 [preset-sse]=18287)
declare -A ADMIN=([plain-json]=18382 [cost-json]=18383 [plain-sse]=18384 [cost-sse]=18385 [preset-json]=18386 [preset-sse]=18387)
TARGETS=(plain-json cost-json preset-json plain-sse cost-sse preset-sse)
path_of() { echo "/v1/${1#*-}/chat/completions"; }

need_tools wrk:wrk nginx:nginx curl:curl redis-server:redis-server redis-cli:redis-tools taskset:util-linux
if [ "$(nproc)" -lt 2 ]; then
  echo "bench/costs.sh needs at least 2 CPUs (the gateway on one, load and upstream on the other)" >&2
  exit 1
fi
cargo build --release --quiet --bin leasegate

bench_work
taskset -c 1 redis-server --port $REDIS_PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null & pids+=($!)
for _ in $(seq 50); do redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && break; sleep 0.1; done

JSON='{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how can I help?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}'
SSE='data: {"choices":[{"delta":{"content":"Hello"}}]}\n\ndata: {"choices":[{"delta":{"content":" there"}}]}\n\ndata: {"choices":[{"delta":{"content":", how can I help?"}}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}\n\ndata: [DONE]\n\n'
nginx_conf upstream "server { listen 127.0.0.1:$UP_PORT;
    location /v1/json { default_type application/json; return 200 '$JSON'; }
    location /v1/sse { default_type text/event-stream; return 200 '$SSE'; } }"
taskset -c 1 nginx -p "$work/upstream" -c "$work/upstream/nginx.conf" & pids+=($!)

# The request bodies: a completion, streamed or not.
MESSAGES='"messages":[{"role":"user","content":"Say hello in a short sentence, please."}]'
for kind in json sse; do
  stream=false; [ $kind = sse ] && stream=true
  cat > "$work/$kind.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"gpt-4o","stream":$stream,$MESSAGES}'
LUA
done

for t in "${TARGETS[@]}"; do
  case $t in
    cost-*) cost='cost = { reserve = 10, settle = "json:usage.total_tokens" }' ;;
    preset-*) cost='cost = { api = "openai" }' ;;
    *) cost='' ;;
  esac
  cat > "$work/$t.toml" <<CONF
[gateway]
workers = 1
access_log = "off"
[listeners]
http = "127.0.0.1:${PORT[$t]}"
admin = "127.0.0.1:${ADMIN[$t]}"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT"
[[upstreams]]
name = "llm"
targets = ["http://127.0.0.1:$UP_PORT"]
[[routes]]
name = "$t"
path_prefix = "/"
upstream = "llm"
limits = ["tokens"]
[[limits]]
name = "tokens"
rate = "1000000000/min"
by = ["route"]
$cost
CONF
  LEASEGATE_LOG=warn taskset -c 0 target/release/leasegate run --config "$work/$t.toml" >/dev/null 2>"$work/$t.log" &
  pids+=($!)
done
for t in "${TARGETS[@]}"; do
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:${ADMIN[$t]}/healthz" >/dev/null && break; sleep 0.05; done
  # Every target answers what the upstream sent; the streaming preset
  # without the usage chunk.
  kind=${t#*-}
  stream=false; [ "$kind" = sse ] && stream=true
  answer=$(curl -sf -H 'content-type: application/json' -d "{\"model\":\"gpt-4o\",\"stream\":$stream,$MESSAGES}" "http://127.0.0.1:${PORT[$t]}$(path_of "$t")")
  if [ "$t" = preset-sse ]; then
    if grep -q total_tokens <<<"$answer"; then echo "$t: the usage chunk reached the client" >&2; exit 1; fi
    grep -q '\[DONE\]' <<<"$answer" || { echo "$t: the stream is not whole" >&2; exit 1; }
  else
    grep -q total_tokens <<<"$answer" || { echo "$t: no usage in the answer" >&2; exit 1; }
  fi
done

store_calls() { # TARGET
  curl -s "http://127.0.0.1:${ADMIN[$1]}/metrics" | awk '/^leasegate_store_calls_total/ {n += $2} END {print n + 0}'
}

: > "$work/results"
for round in $(seq "$ROUNDS"); do
  for t in "${TARGETS[@]}"; do
    c0=$(store_calls "$t")
    taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$work/${t#*-}.lua" "http://127.0.0.1:${PORT[$t]}$(path_of "$t")" > "$work/load.out"
    c1=$(store_calls "$t")
    rps=$(awk '/^Requests\/sec/ {print $2}' "$work/load.out")
    total=$(awk '/requests in/ {print $1}' "$work/load.out")
    non2xx=$(awk '/Non-2xx/ {print $NF}' "$work/load.out")
    echo "$round $t $rps $total ${non2xx:-0} $((c1 - c0))" >> "$work/results"
    echo "round $round $t: $rps req/s, ${non2xx:-0} non-2xx, $((c1 - c0)) store calls" >&2
  done
done

python3 - "$work/results" "$ROUNDS" "$DURATION" "$CONNS" <<'PY'
import collections, statistics, sys
path, rounds, duration, conns = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = [l.split() for l in open(path)]
by = collections.defaultdict(dict)
for r, t, rps, total, bad, calls in rows:
    by[t][int(r)] = (float(rps), int(total), int(bad), int(calls))
def span(vals, fmt):
    return f"{fmt.format(statistics.median(vals))} ({fmt.format(min(vals))}–{fmt.format(max(vals))})"
print("| target | requests/s | store calls per request | non-2xx |\n|---|---|---|---|")
for t in ["plain-json", "cost-json", "preset-json", "plain-sse", "cost-sse", "preset-sse"]:
    v = by[t].values()
    print(f"| {t} | {span([x[0] for x in v], '{:.0f}')} | {span([x[3] / x[1] for x in v], '{:.5f}')} | {sum(x[2] for x in v)} |")
print("\n| pair | cost ÷ plain, requests/s | preset ÷ plain, requests/s |\n|---|---|---|")
for kind in ["json", "sse"]:
    rs = [by[f"cost-{kind}"][r][0] / by[f"plain-{kind}"][r][0] for r in by[f"plain-{kind}"]]
    ps = [by[f"preset-{kind}"][r][0] / by[f"plain-{kind}"][r][0] for r in by[f"plain-{kind}"]]
    print(f"| {kind} | {span(rs, '{:.3f}')} | {span(ps, '{:.3f}')} |")
print(f"\n{rounds} rounds of {duration} s, {conns} connections, targets alternated in each round; medians with min–max over the rounds.")
PY
