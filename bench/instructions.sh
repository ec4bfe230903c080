#!/usr/bin/env bash
# User-space instructions per request, counted by valgrind's callgrind:
# exact and repeatable whatever else the machine is doing (CPU time on this
# machine drifts by 20-30 % between runs; an instruction count does not), so
# a change of a few hundred instructions per request can be seen, where
# bench/ab.sh cannot resolve less than ~3 %. It counts user space only: the
# kernel's share (about 60 % of the CPU time on the proxy path, see
# docs/benchmarks.md) is not in it, and instructions are not cycles.
#
#   nginx        nginx reverse proxy (one worker, no master, no access log)
#   floor        hyper's floor, proxy (examples/hyper_floor.rs)
#   leasegate    leasegate proxy + a limit every request passes
#   nginx-429    nginx limit_req, limit_req_status 429
#   floor-429    hyper's floor, leasegate's 429 fixed
#   leasegate-429  leasegate, a limit that refuses every request
#   floor-h2     hyper's floor behind rustls, HTTP/2 (examples/hyper_floor.rs tls)
#   leasegate-h2 leasegate over TLS, HTTP/2, the same limit as leasegate
#
# The -h2 targets are loaded by h2load (-c8 -m10) over TLS with
# certs/dev.crt (ECDSA P-256); they are not in the default list (TARGETS=
# "floor-h2 leasegate-h2" runs them).
#
# Each runs alone under callgrind; wrk (-t1 -c8) warms it, its counters are
# zeroed, wrk runs SECS seconds, the counters are dumped and divided by the
# requests wrk completed. Then, for each leasegate target, the functions
# whose own instructions per request differ most from hyper's floor.
#
#   bench/instructions.sh [seconds] [top]
#
# TARGETS="floor leasegate" (say) runs only those; a pair is compared when
# both of it ran; LEASEGATE_BIN=path counts another build of leasegate.
# CACHE=1 also simulates the caches (callgrind --cache-sim=yes, the host's
# L1 sizes) and adds, per request, the first-level instruction-cache misses
# (I1mr) and data-cache read and write misses (D1mr, D1mw): what the same
# instruction count costs in cycles differs mostly by those.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

SECS=${1:-10}
TOP=${2:-25}
UP_PORT=18281
PORT=18282
need_tools wrk:wrk nginx:nginx valgrind:valgrind callgrind_annotate:valgrind
case " ${TARGETS:-} " in *-h2\ *) need_tools h2load:nghttp2-client ;; esac
cargo build --release --quiet --bin leasegate --example hyper_floor

bench_work
nginx_conf upstream "$(ok_server "$UP_PORT")"
nginx -p "$work/upstream" -c "$work/upstream/nginx.conf" &
pids+=($!)
mkdir -p "$work/www" && echo ok > "$work/www/index.html"
nginx_conf nginx "upstream backend { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server { listen 127.0.0.1:$PORT; location / { proxy_pass http://backend; proxy_http_version 1.1;
    proxy_set_header Connection \"\"; proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
    proxy_set_header X-Forwarded-Proto \$scheme; } }" off
nginx_conf nginx-429 "limit_req_zone \$server_name zone=one:1m rate=1r/m;
  server { listen 127.0.0.1:$PORT; server_name bench;
    location / { root $work/www; limit_req zone=one nodelay; limit_req_status 429; } }" off
leasegate_toml "http = \"127.0.0.1:$PORT\"" 18283 off "100000000/s" "$UP_PORT" > "$work/leasegate.toml"
leasegate_toml "http = \"127.0.0.1:$PORT\"" 18283 off "1/h" "$UP_PORT" > "$work/leasegate-429.toml"
leasegate_toml "https = \"127.0.0.1:$PORT\"" 18283 off "100000000/s" "$UP_PORT" "$PWD/certs" > "$work/leasegate-h2.toml"

command_of() {
  case $1 in
    nginx | nginx-429) echo "nginx -p $work/$1 -c $work/$1/nginx.conf" ;;
    floor) echo "./target/release/examples/hyper_floor proxy $PORT $UP_PORT" ;;
    floor-429) echo "./target/release/examples/hyper_floor 429 $PORT" ;;
    floor-h2) echo "./target/release/examples/hyper_floor tls $PORT $UP_PORT $PWD/certs/dev.crt $PWD/certs/dev.key" ;;
    leasegate*) echo "${LEASEGATE_BIN:-./target/release/leasegate} run --config $work/$1.toml" ;;
  esac
}

url_of() { case $1 in *-h2) echo "https://127.0.0.1:$PORT/" ;; *) echo "http://127.0.0.1:$PORT/" ;; esac; }

# load SECONDS NAME: runs the target's load, prints the requests completed.
load() {
  case $2 in
    *-h2)
      h2load -t1 -c8 -m10 -D "$1" "https://127.0.0.1:$PORT/" > "$work/$2.load"
      awk '/^requests:/ {print $8}' "$work/$2.load" ;;
    *)
      wrk -t1 -c8 -d"${1}s" "http://127.0.0.1:$PORT/" > "$work/$2.load"
      awk '/requests in/ {print $1}' "$work/$2.load" ;;
  esac
}

read -r -a names <<< "${TARGETS:-nginx floor leasegate nginx-429 floor-429 leasegate-429}"
: > "$work/counts"
for name in "${names[@]}"; do
  # shellcheck disable=SC2046
  LEASEGATE_LOG=warn valgrind --tool=callgrind $([ "${CACHE:-0}" != 0 ] && echo --cache-sim=yes) --callgrind-out-file="$work/$name.cg.%p" \
    $(command_of "$name") > "$work/$name.out" 2>&1 &
  vpid=$!
  up=""
  for _ in $(seq 300); do
    curl -sk -o /dev/null "$(url_of "$name")" 2>/dev/null && { up=1; break; }
    kill -0 "$vpid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$up" ] || { echo "$name did not start under valgrind" >&2; cat "$work/$name.out" >&2; exit 1; }
  want=200
  case $name in *-429) want=429 ;; esac
  got=$(curl -sk -o /dev/null -w '%{http_code}' "$(url_of "$name")")
  [ "$got" = "$want" ] || { echo "$name answered $got, expected $want" >&2; exit 1; }
  load 2 "$name" > /dev/null
  callgrind_control -z "$vpid" > /dev/null
  reqs=$(load "$SECS" "$name")
  callgrind_control -d "$vpid" > /dev/null
  kill "$vpid"
  wait "$vpid" 2>/dev/null || true
  [ "${reqs:-0}" -gt 0 ] || { echo "$name: no request completed" >&2; cat "$work/$name.load" >&2; exit 1; }
  dump=$(ls "$work/$name".cg.*.1 2>/dev/null | head -1)
  [ -n "$dump" ] || { echo "$name: no callgrind dump" >&2; exit 1; }
  # KEEP=dir keeps each target's dump there, for callgrind_annotate.
  [ -z "${KEEP:-}" ] || { mkdir -p "$KEEP" && cp "$dump" "$KEEP/$name.cg"; }
  callgrind_annotate --inclusive=no --auto=no --threshold=100 --show=Ir "$dump" > "$work/$name.flat" 2>/dev/null
  total=$(awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}' "$work/$name.flat")
  misses="- - -"
  if [ "${CACHE:-0}" != 0 ]; then
    # A total of zero prints without its "(100.0%)": drop the shares first.
    misses=$(callgrind_annotate --inclusive=no --auto=no --show=I1mr,D1mr,D1mw "$dump" 2>/dev/null |
      awk '/PROGRAM TOTALS/ {gsub(/,|\([^)]*\)/, ""); print $1, $2, $3}')
    [ "$(wc -w <<< "$misses")" -eq 3 ] || { echo "$name: no cache totals in $dump" >&2; exit 1; }
  fi
  echo "$name $reqs $total $misses" | tee -a "$work/counts" >&2
done

python3 - "$work" "$TOP" <<'PY'
import collections, re, sys
work, top = sys.argv[1], int(sys.argv[2])
counts = {}
misses = {}
for line in open(f"{work}/counts"):
    name, reqs, total, *cache = line.split()
    counts[name] = (int(reqs), int(total))
    if len(cache) == 3 and "-" not in cache:
        misses[name] = [int(m) / int(reqs) for m in cache]
per = {n: t / r for n, (r, t) in counts.items()}
if misses:
    print("\n| target | requests counted | user-space instructions per request | I1 misses | D1 read misses | D1 write misses |\n|---|---|---|---|---|---|")
else:
    print("\n| target | requests counted | user-space instructions per request |\n|---|---|---|")
for n, (r, t) in counts.items():
    extra = "".join(f" {m:,.1f} |" for m in misses[n]) if n in misses else ""
    print(f"| {n} | {r} | {per[n]:,.0f} |{extra}")
print("\n| pair | ratio |\n|---|---|")
for a, b in [("leasegate-h2", "floor-h2"), ("floor", "nginx"), ("leasegate", "floor"), ("leasegate", "nginx"),
             ("floor-429", "nginx-429"), ("leasegate-429", "floor-429"), ("leasegate-429", "nginx-429")]:
    if a in per and b in per:
        print(f"| {a} ÷ {b} | {per[a] / per[b]:.2f} |")

def own(name):
    """Each function's own instructions per request. callgrind_annotate also
    lists a few roots (clone, start_thread, main, the worker loop) with
    nearly the whole program's count: no function's own count comes near a
    quarter of the total, so those are left out."""
    reqs, total = counts[name]
    out = collections.Counter()
    for line in open(f"{work}/{name}.flat"):
        m = re.match(r"\s*([\d,]+) \([ \d.]+%\)  (.*)", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        where = re.sub(r" \[[^\]]*\]$", "", m.group(2))
        fn = where.split(".rs:", 1)[1] if ".rs:" in where else where.split(":", 1)[-1]
        out[fn] += int(m.group(1).replace(",", "")) / reqs
    return collections.Counter({k: v for k, v in out.items() if v < total / reqs / 4})

for lg, fl in [("leasegate", "floor"), ("leasegate-429", "floor-429"), ("leasegate-h2", "floor-h2")]:
    if top == 0 or lg not in counts or fl not in counts:
        continue
    a, b = own(lg), own(fl)
    rows = sorted(((a[k] - b[k], a[k], b[k], k) for k in set(a) | set(b)), reverse=True)
    print(f"\n{lg} against {fl}: own instructions per request, the {top} largest differences\n")
    print(f"| {lg} − {fl} | {lg} | {fl} | function |\n|---|---|---|---|")
    for d, x, y, k in rows[:top]:
        print(f"| {d:+,.0f} | {x:,.0f} | {y:,.0f} | `{k[:110]}` |")
PY
