#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit/property/end-to-end tests,
# libiscsi conformance, and interop with libiscsi tools and qemu-img.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy -q --workspace --all-targets -- -D warnings
cargo test -q --workspace
scripts/interop.sh
scripts/security.sh
scripts/conformance.sh --digest off
scripts/conformance.sh --digest required
