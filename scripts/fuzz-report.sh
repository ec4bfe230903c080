#!/usr/bin/env bash
# Prints, as a Markdown table for docs/robustness.md, what the logs of a
# scripts/fuzz.sh run say: per target the seconds, executions, exec/s,
# coverage (cov), features (ft), corpus size and the result.
#
#   scripts/fuzz-report.sh [LOG_DIR]     (default /tmp: its fuzz-<target>.log)
set -euo pipefail
log_dir=${1:-/tmp}
shopt -s nullglob
logs=("$log_dir"/fuzz-*.log)
[ ${#logs[@]} -gt 0 ] || {
  echo "scripts/fuzz-report.sh: no fuzz-*.log in $log_dir" >&2
  exit 2
}

echo "| target | seconds | executions | exec/s | cov | ft | corpus (inputs/bytes) | result |"
echo "|---|---:|---:|---:|---:|---:|---:|---|"
for log in "${logs[@]}"; do
  t=$(basename "$log" .log)
  t=${t#fuzz-}
  head=$(head -n 1 "$log")
  [[ $head == "# scripts/fuzz.sh "* ]] || continue # not a run's log
  # "# scripts/fuzz.sh 600: target ja, 2026-...": the seconds asked for.
  seconds=$(sed -nE 's/^# scripts\/fuzz\.sh ([0-9]+):.*/\1/p' <<<"$head")
  # The last status line (#N ... cov: X ft: Y corp: N/size ...) and the
  # final stats (-print_final_stats=1).
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  [ -n "$execs" ] || execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$last")
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
  corp=$(sed -nE 's/.* corp: ([0-9]+\/[0-9A-Za-z]+).*/\1/p' <<<"$last")
  rc=$(sed -n 's/^# exit //p' "$log" | tail -n 1)
  case $rc in
    0) result="no crash" ;;
    "") result="still running (or killed)" ;;
    *)
      what=$(grep -m1 -E "panicked at|ERROR: libFuzzer: [a-z-]+|ERROR: AddressSanitizer" "$log" | sed 's/|/\\|/g' || true)
      unit=$(grep -m1 -oE "Test unit written to [^ ]+" "$log" | sed 's/Test unit written to //' || true)
      result="CRASH (exit $rc): ${what:-see log}; input ${unit:-?}"
      ;;
  esac
  printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$t" "${seconds:--}" "${execs:--}" "${eps:--}" "${cov:--}" "${ft:--}" "${corp:--}" "$result"
done
