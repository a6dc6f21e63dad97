#!/usr/bin/env bash
# libiscsi conformance against ironsan: installs libiscsi-bin when missing,
# builds ironsan, runs iscsi-test-cu over two portals and checks the
# committed expectations (tests/conformance/expected-pass.txt).
# Extra arguments go to scripts/conformance.py (e.g. --digest required).
# With --physical-block-size 4096 (a 512e LUN) the expectations are
# tests/conformance/expected-pass-512e.txt and the known test defects
# tests/conformance/known-defects-512e.txt; an --expect or --known-defects
# given here overrides them.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v iscsi-test-cu >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq libiscsi-bin >/dev/null
fi
expect=tests/conformance/expected-pass.txt
defects=()
prev=
for arg in "$@"; do
  if [[ "$arg" == "--physical-block-size=4096" || ( "$prev" == "--physical-block-size" && "$arg" == 4096 ) ]]; then
    expect=tests/conformance/expected-pass-512e.txt
    defects=(--known-defects tests/conformance/known-defects-512e.txt)
  fi
  prev=$arg
done
cargo build -q -p ironsan
exec python3 scripts/conformance.py --ironsan "${CARGO_TARGET_DIR:-target}/debug/ironsan" \
  --expect "$expect" "${defects[@]}" "$@"
