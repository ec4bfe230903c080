#!/usr/bin/env bash
# Runs every test leasegate has: unit, property and integration tests against
# real processes. Checks the tools the tests start first, and says exactly
# what to install when one is missing, rather than skipping tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# tool -> Debian/Ubuntu package. promtool and amtool check and unit-test
# docs/alerts.yml and docs/alertmanager.yml (tests/it/alerts.rs); chromium
# renders the admin status page headless (tests/it/admin.rs).
tools=(
  "curl curl"
  "openssl openssl"
  "redis-server redis-server"
  "redis-cli redis-tools"
  "promtool prometheus"
  "amtool prometheus-alertmanager"
  "chromium chromium"
)
absent() {
  missing=()
  packages=()
  command -v cargo >/dev/null 2>&1 || missing+=("cargo (https://rustup.rs)")
  for t in "${tools[@]}"; do
    set -- $t
    if ! command -v "$1" >/dev/null 2>&1; then
      missing+=("$1 (Debian/Ubuntu: apt-get install -y $2)")
      packages+=("$2")
    fi
  done
}
absent

# On CI, as root with apt-get, install what is missing instead of stopping.
if [ ${#packages[@]} -gt 0 ] && [ "${CI:-}" = "true" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "scripts/test.sh: CI: installing ${packages[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
  absent
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "scripts/test.sh: missing tools the tests need:" >&2
  for m in "${missing[@]}"; do echo "  - $m" >&2; done
  exit 1
fi
if ! curl --version | grep -qi 'http2'; then
  echo "scripts/test.sh: this curl lacks HTTP/2; install a curl built with nghttp2 (apt-get install -y curl)" >&2
  exit 1
fi

exec cargo test --all-targets --locked "$@"
