#!/usr/bin/env bash
# Holds a refactor to "no behaviour change" on what clients and operators
# see: runs two leasegate binaries (OLD and NEW) on the shipped
# gateway.toml (ports moved to free ones) and compares, byte for byte,
#  - `leasegate explain` (text and --json) for a set of requests, and
#  - the status line and headers of a run of requests to the demo route
#    (200s, then the 429s of a drained per_client bucket), Date and
#    X-Request-Id aside and the seconds to reset or retry (they tick with
#    the clock) as N, in the four rate_limit_headers styles.
# Prints "same" and exits 0, or shows the first differences and exits 1.
#
#   scripts/surface-diff.sh OLD_BINARY NEW_BINARY
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?old binary}
new=${2:?new binary}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The shipped config, on free ports, without TLS (the headers are the same
# on both listeners) and with one rate_limit_headers style. Its rates go
# from per minute to per day, so that no token refills during a run and
# every remaining count is the same whatever the machine's speed.
config() { # style http admin
  sed -e "s/^http  = .*/http = \"127.0.0.1:$2\"/" \
      -e "s/^https = .*//" \
      -e "s/^admin = .*/admin = \"127.0.0.1:$3\"/" \
      -e '/^\[tls\]/,/^client_hello_timeout_ms/d' \
      -e 's#^rate = "\([0-9]*\)/min"#rate = "\1/day"#' \
      gateway.toml > "$work/gateway.toml"
  sed -i "s/^\[gateway\]/[gateway]\nrate_limit_headers = \"$1\"\naccess_log = \"off\"/" "$work/gateway.toml"
  cp -r certs "$work/" 2>/dev/null || true
}

explain_all() { # binary
  local b=$1
  for args in \
    "GET /v1/orders" \
    "POST /v1/orders?x=1" \
    "GET /" \
    "GET //v1//orders/../orders" \
    "GET /v1/%2e%2e/x" \
    "GET /v1/a%2Fb" \
    "--ip 198.51.100.7 GET /v1/orders" \
    "--ip 2001:db8::1 GET /v1/orders" \
    "-H X-API-Key:nope GET /v1/orders" \
    "-H Authorization:Bearer.x.y GET /v1/orders" \
    "-H Host:API.example.com. GET /v1/orders" \
    "-H X-Forwarded-For:203.0.113.9 GET /v1/orders"; do
    # shellcheck disable=SC2086
    set -- $args
    local a=()
    while [ $# -gt 2 ]; do
      case $1 in
        -H) a+=(--header "${2/:/: }"); shift 2 ;;
        *) a+=("$1" "$2"); shift 2 ;;
      esac
    done
    echo "## explain ${a[*]} $*"
    "$b" explain --config "$work/gateway.toml" "${a[@]}" "$@" 2>&1 || echo "exit $?"
    "$b" explain --config "$work/gateway.toml" --json "${a[@]}" "$@" 2>&1 || echo "exit $?"
  done
}

headers_run() { # binary style
  local b=$1 style=$2 http admin
  http=$(free_port); admin=$(free_port)
  config "$style" "$http" "$admin"
  "$b" run --config "$work/gateway.toml" >"$work/run.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break; sleep 0.05; done
  echo "## headers $style"
  # 103 requests from one client: 100 admitted (burst 100), then 429s.
  for i in $(seq 103); do
    curl -s -D - -o "$work/body" "http://127.0.0.1:$http/hello" \
      | tr -d '\r' | grep -vi '^date:\|^x-request-id:' \
      | sed -E 's/(ratelimit-reset|x-ratelimit-reset|retry-after): [0-9]+/\1: N/I; s/(ratelimit: .*t=)[0-9]+/\1N/I; s/(;t=)[0-9]+/\1N/g'
    # The body's retry time is the header's, and ticks like it.
    if [ "$i" -gt 100 ]; then sed -E 's/retry in [0-9]+ s/retry in N s/; s/"retry_after":[0-9]+/"retry_after":N/' "$work/body"; echo; fi
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

surface() { # binary
  config all 1 2
  explain_all "$1"
  for style in all ietf legacy none; do headers_run "$1" "$style"; done
}

surface "$old" > "$work/old.txt"
surface "$new" > "$work/new.txt"
if cmp -s "$work/old.txt" "$work/new.txt"; then
  echo "same ($(wc -l < "$work/new.txt") lines: $(grep -c '^## explain' "$work/new.txt") explained requests, text and JSON; 4 header styles x 103 requests)"
else
  diff -u "$work/old.txt" "$work/new.txt" | head -80
  exit 1
fi
