#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS each, one after another,
# and prints per target the executions, exec/s, coverage (cov), features
# (ft) and corpus size libFuzzer reports. Exits non-zero if any target
# crashed (a panic, a failed property, a sanitizer report, a timeout or an
# out-of-memory), naming the input it wrote under fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh SECONDS
#
# Environment:
#   TARGETS="a b"   run only these targets (default: all of fuzz/fuzz_targets/)
#   JOBS=N          cargo build jobs, and how many targets fuzz at the same
#                   time, each as one libFuzzer process (default 1)
#   LOG_DIR=dir     where each target's log goes, as fuzz-<target>.log
#                   (default /tmp)
#   KEEP_CORPUS=1   keep fuzz/corpus/<target>/ from earlier runs instead of
#                   starting again from the seeds
#
# Each run starts from the committed seeds (fuzz/seeds/<target>/) and the
# inputs of crashes found before (fuzz/regressions/<target>/), copied into a
# scratch corpus fuzz/corpus/<target>/ (not committed) that libFuzzer grows.
# A target runs in an empty scratch directory as its working directory, so a
# config that names relative files reads nothing of the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

die() {
  echo "scripts/fuzz.sh: $*" >&2
  exit 2
}

[ $# -eq 1 ] || die "usage: scripts/fuzz.sh SECONDS  (TARGETS=\"a b\" JOBS=1 LOG_DIR=/tmp KEEP_CORPUS=1)"
seconds=$1
[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "SECONDS must be a positive integer, not '$seconds'"
jobs=${JOBS:-1}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || die "JOBS must be a positive integer, not '$jobs'"
log_dir=${LOG_DIR:-/tmp}
mkdir -p "$log_dir"
log_dir=$(cd "$log_dir" && pwd)

all_targets=$(cd fuzz/fuzz_targets && ls -1 ./*.rs | sed 's|^\./||; s|\.rs$||' | tr '\n' ' ')
targets=${TARGETS:-$all_targets}
for t in $targets; do
  [ -f "fuzz/fuzz_targets/$t.rs" ] || die "no fuzz target '$t' (there are: $all_targets)"
done

# libFuzzer's -max_len per target: the largest input worth trying.
max_len() {
  case $1 in
    client_hello | ja) echo 16384 ;;         # a ClientHello in records (src/fingerprint)
    identity) echo 16384 ;;                  # headers; > max_token_bytes (8192)
    normalize) echo 8192 ;;                  # a request target and a few headers
    region_wire) echo 16384 ;;               # region::wire::MAX_BODY
    config | rls_yaml) echo 65536 ;;         # whole files
    *) echo 4096 ;;
  esac
}

# ---- tools: no silent skip ----
command -v cargo >/dev/null 2>&1 || die "cargo is not installed (https://rustup.rs)"
if ! cargo +nightly --version >/dev/null 2>&1; then
  die "the nightly toolchain is needed (cargo-fuzz builds with sanitizers): rustup toolchain install nightly"
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "scripts/fuzz.sh: cargo-fuzz is missing: cargo install cargo-fuzz --locked" >&2
  cargo install cargo-fuzz --locked -j "$jobs"
  cargo +nightly fuzz --version >/dev/null 2>&1 || die "cargo-fuzz did not install"
fi
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
[ -n "$triple" ] || die "cannot tell the nightly toolchain's host triple"

# ---- build every target once (release, debug assertions, AddressSanitizer) ----
echo "scripts/fuzz.sh: building the fuzz targets ($(cargo +nightly fuzz --version), $(rustc +nightly --version))" >&2
CARGO_BUILD_JOBS=$jobs cargo +nightly fuzz build --target "$triple" >&2
bin_dir=$root/fuzz/target/$triple/release

# ---- run ----
run_one() {
  local t=$1
  local corpus=$root/fuzz/corpus/$t
  local artifacts=$root/fuzz/artifacts/$t
  local log=$log_dir/fuzz-$t.log
  local scratch rc=0
  if [ "${KEEP_CORPUS:-}" != 1 ]; then
    rm -rf "$corpus"
  fi
  mkdir -p "$corpus" "$artifacts"
  cp -p "$root/fuzz/seeds/$t/." "$corpus/" -R
  if [ -d "$root/fuzz/regressions/$t" ]; then
    cp -p "$root/fuzz/regressions/$t/." "$corpus/" -R
  fi
  scratch=$(mktemp -d)
  {
    echo "# scripts/fuzz.sh $seconds: target $t, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(cargo +nightly fuzz --version), $(rustc +nightly --version)"
    echo "# seeds: $(find "$root/fuzz/seeds/$t" -type f | wc -l) files"
  } >"$log"
  (cd "$scratch" && "$bin_dir/$t" \
    -max_total_time="$seconds" \
    -rss_limit_mb=2048 \
    -max_len="$(max_len "$t")" \
    -timeout=10 \
    -print_final_stats=1 \
    -artifact_prefix="$artifacts/" \
    "$corpus") >>"$log" 2>&1 || rc=$?
  rm -rf "$scratch"
  echo "# exit $rc" >>"$log"
  return 0
}

summarise() { # target -> one line; returns 1 if the target failed
  local t=$1 log=$log_dir/fuzz-$t.log
  local last execs eps cov ft corp rc
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  [ -n "$execs" ] || execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$last")
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
  corp=$(sed -nE 's/.* corp: ([0-9]+\/[0-9A-Za-z]+).*/\1/p' <<<"$last")
  rc=$(sed -n 's/^# exit //p' "$log" | tail -n 1)
  printf '%-13s %8s %12s %8s %7s %8s %-14s %s\n' "$t" "${seconds}s" "${execs:--}" "${eps:--}" "${cov:--}" "${ft:--}" "${corp:--}" \
    "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
  if [ "$rc" != 0 ]; then
    grep -E "panicked at|^==[0-9]+==ERROR|ERROR: libFuzzer|SUMMARY:|Test unit written to|out-of-memory|timeout after" "$log" \
      | sed 's/^/    /' | head -n 20
    echo "    log: $log"
    return 1
  fi
}

pids=()
for t in $targets; do
  echo "scripts/fuzz.sh: fuzzing $t for ${seconds}s (log: $log_dir/fuzz-$t.log)" >&2
  run_one "$t" &
  pids+=($!)
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
    wait -n || true
  done
done
for p in "${pids[@]}"; do
  wait "$p" || true
done

echo
printf '%-13s %8s %12s %8s %7s %8s %-14s %s\n' target seconds executions exec/s cov ft corpus result
failed=0
for t in $targets; do
  summarise "$t" || failed=$((failed + 1))
done
if [ "$failed" -gt 0 ]; then
  echo "scripts/fuzz.sh: $failed target(s) crashed; each crashing input is under fuzz/artifacts/<target>/" >&2
  exit 1
fi
echo "scripts/fuzz.sh: no crash"
