#!/usr/bin/env bash
# libiscsi conformance against ironsan: installs libiscsi-bin when missing,
# builds ironsan, runs iscsi-test-cu over two portals and checks the
# committed expectations (tests/conformance/expected-pass.txt).
# Extra arguments go to scripts/conformance.py (e.g. --digest required).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v iscsi-test-cu >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq libiscsi-bin >/dev/null
fi
cargo build -q -p ironsan
exec python3 scripts/conformance.py --ironsan target/debug/ironsan \
  --expect tests/conformance/expected-pass.txt "$@"
