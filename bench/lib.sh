# Shared by the bench/ scripts: tools, and reading wrk's output.

# need_tools CMD:PACKAGE ...: installs the Debian packages of missing commands.
need_tools() {
  local missing=() t
  for t in "$@"; do command -v "${t%%:*}" >/dev/null || missing+=("${t#*:}"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}..." >&2
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# bench_work: a scratch directory $work and a list pids+=(...) of background
# processes, all stopped and removed on exit. The directory is readable by
# nginx's workers (they run as nobody; mktemp -d makes it 0700, and nginx
# would answer 403 for a file in it).
bench_work() {
  work=$(mktemp -d)
  chmod 755 "$work"
  pids=()
  trap bench_cleanup EXIT
}
bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}

# nginx_conf NAME HTTP-BODY [MASTER]: $work/NAME/nginx.conf for one worker
# in the foreground, no access log unless HTTP-BODY sets one in a server
# block, keep-alive without a request limit. MASTER off runs the worker as
# the process itself (valgrind follows no fork).
nginx_conf() {
  mkdir -p "$work/$1/logs"
  cat > "$work/$1/nginx.conf" <<CONF
worker_processes 1; daemon off; master_process ${3:-on};
pid $work/$1/nginx.pid; error_log $work/$1/logs/error.log crit;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path $work/$1/body; proxy_temp_path $work/$1/proxy;
  fastcgi_temp_path $work/$1/fastcgi; uwsgi_temp_path $work/$1/uwsgi; scgi_temp_path $work/$1/scgi;
  $2
}
CONF
}

# ok_server PORT: the benches' upstream, a fixed 200 "ok" (an nginx server block).
ok_server() { echo "server { listen 127.0.0.1:$1; location / { return 200 'ok\n'; } }"; }

# An awk function: wrk's durations (850.00us, 3.43ms, 1.02s) in milliseconds.
WRK_MS='function ms(v) {
  if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
  if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
  if (v ~ /s$/) return substr(v, 1, length(v) - 1) * 1000
  return v + 0
}'

# wrk_p99_ms FILE...: the highest p99 of wrk --latency outputs, in ms.
wrk_p99_ms() { awk "$WRK_MS"' $1 == "99%" {v = ms($2); if (v > p) p = v} END {print p + 0}' "$@"; }

# wrk_max_ms FILE: the slowest request of one wrk run, in ms.
wrk_max_ms() { awk "$WRK_MS"' $1 == "Latency" && NF >= 4 {print ms($4)}' "$1"; }

# leasegate_toml LISTENER-LINE ADMIN-PORT ACCESS-LOG RATE UPSTREAM-PORT [CERT-DIR [GATEWAY-LINES [LIMIT-LINES]]]:
# the benches' leasegate: one worker, one route to the upstream, one limit
# of RATE on it (a TLS section when CERT-DIR holds dev.crt and dev.key);
# GATEWAY-LINES and LIMIT-LINES go into [gateway] and the limit.
leasegate_toml() {
  cat <<CONF
[gateway]
workers = 1
access_log = "$3"
${7:-}
[listeners]
$1
admin = "127.0.0.1:$2"
${6:+[tls]
cert = \"$6/dev.crt\"
key = \"$6/dev.key\"}
[[upstreams]]
name = "backend"
targets = ["http://127.0.0.1:$5"]
# One load generator stands in for many clients: h2load's 32 connections x
# 10 streams would pass the default per-client share (1024 / 8 = 128) and
# get 503s that nginx and the floor, which have no such share, never give.
max_in_flight_per_client = 1024
[[routes]]
name = "all"
path_prefix = "/"
upstream = "backend"
limits = ["one"]
[[limits]]
name = "one"
rate = "$4"
by = ["route"]
${8:-}
CONF
}

# ticks PID: CPU ticks (user+system, every thread) used so far by a
# process and its children (nginx's workers); HZ ticks make a second.
ticks() {
  local t=0 q
  for q in $1 $(pgrep -P "$1" || true); do
    [ -r "/proc/$q/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$q/stat")))
  done
  echo $t
}
HZ=$(getconf CLK_TCK)

# admin_sum ADMIN-PORT SERIES: the sum of every sample of a metric whose
# name starts with SERIES on one leasegate's /metrics.
admin_sum() {
  curl -fsS "http://127.0.0.1:$1/metrics" | awk -v s="$2" 'index($1, s) == 1 {n += $2} END {printf "%d", n}'
}

# med: "median (min-max)" of the numbers on stdin, one per line.
med() {
  sort -g | awk '{v[NR] = $1} END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%g (%g-%g)", m, v[1], v[NR]
  }'
}
