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

# leasegate_toml LISTENER-LINE ADMIN-PORT ACCESS-LOG RATE UPSTREAM-PORT [CERT-DIR]:
# the benches' leasegate: one worker, one route to the upstream, one limit
# of RATE on it (a TLS section when CERT-DIR holds dev.crt and dev.key).
leasegate_toml() {
  cat <<CONF
[gateway]
workers = 1
access_log = "$3"
[listeners]
$1
admin = "127.0.0.1:$2"
${6:+[tls]
cert = \"$6/dev.crt\"
key = \"$6/dev.key\"}
[[upstreams]]
name = "backend"
targets = ["http://127.0.0.1:$5"]
[[routes]]
name = "all"
path_prefix = "/"
upstream = "backend"
limits = ["one"]
[[limits]]
name = "one"
rate = "$4"
by = ["route"]
CONF
}
