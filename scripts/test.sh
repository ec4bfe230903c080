#!/usr/bin/env bash
# Runs every test leasegate has: unit, property and integration tests against
# real processes. Checks the tools the tests start first, and says exactly
# what to install when one is missing, rather than skipping tests.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$1 (Debian/Ubuntu: apt-get install -y $2)"); }
need cargo "cargo, or https://rustup.rs"
need curl curl
need openssl openssl
need redis-server redis-server
need redis-cli redis-tools

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
