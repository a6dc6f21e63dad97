#!/usr/bin/env bash
# Side-by-side performance: installs the peers, builds ironsan in release
# mode and runs scripts/sidebyside.py (see docs/PERFORMANCE.md).
# Arguments go to sidebyside.py (e.g. --secs 5 --rounds 2 --digests).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
need=()
command -v tgtd >/dev/null || need+=(tgt)
command -v iscsi-perf >/dev/null || need+=(libiscsi-bin)
command -v gcc >/dev/null || need+=(gcc)
if [ ${#need[@]} -gt 0 ]; then apt-get update -qq; apt-get install -y -qq "${need[@]}" >/dev/null; fi
# qemu-img speaks iscsi:// through qemu-block-extra, which must match qemu-utils.
if ! ls /usr/lib/x86_64-linux-gnu/qemu/block-iscsi.so >/dev/null 2>&1 || ! command -v qemu-img >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq qemu-block-extra >/dev/null || true
  command -v qemu-img >/dev/null || apt-get install -y -qq qemu-utils >/dev/null
fi
cargo build -q --release -p ironsan
exec python3 scripts/sidebyside.py --ironsan "${CARGO_TARGET_DIR:-target}/release/ironsan" "$@"
