#!/usr/bin/env bash
# Interop with independent initiators: iscsi-ls lists the target with both
# portals; qemu-img writes a 64 MiB image through portal 1 and reads it back
# identical through portal 2; iscsi-inq reads the device identification.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
command -v iscsi-ls >/dev/null || { apt-get update -qq; apt-get install -y -qq libiscsi-bin >/dev/null; }
# qemu-img speaks iscsi:// through qemu-block-extra, whose version must match
# qemu-utils: installing it may replace a newer qemu-utils, so install the
# matching qemu-utils afterwards.
if ! ls /usr/lib/x86_64-linux-gnu/qemu/block-iscsi.so >/dev/null 2>&1 || ! command -v qemu-img >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq qemu-block-extra >/dev/null || true
  command -v qemu-img >/dev/null || apt-get install -y -qq qemu-utils >/dev/null
fi
cargo build -q -p ironsan
bin=${CARGO_TARGET_DIR:-target}/debug/ironsan
work=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
p1=$(port); p2=$(port)
iqn=iqn.2026-11.io.ironsan:interop
$bin --log warn serve --listen 127.0.0.1:$p1 --listen 127.0.0.1:$p2 --target $iqn --lun mem:64M >"$work/target.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/$p2) 2>/dev/null && break
  sleep 0.1
done
fail() { echo "interop: FAILED: $*"; cat "$work/target.log"; exit 1; }

iscsi-ls -s iscsi://127.0.0.1:$p1 | tee "$work/ls.txt"
grep -q "Target:$iqn Portal:127.0.0.1:$p1,1" "$work/ls.txt" || fail "iscsi-ls does not list portal 1"
grep -q "Target:$iqn Portal:127.0.0.1:$p2,2" "$work/ls.txt" || fail "iscsi-ls does not list portal 2"
grep -q "Lun:0" "$work/ls.txt" || fail "iscsi-ls -s shows no LUN 0"

iscsi-inq -e 1 -c 131 iscsi://127.0.0.1:$p1/$iqn/0 | tee "$work/inq.txt"
grep -qi "naa" "$work/inq.txt" || fail "no NAA designator in VPD 0x83"

head -c $((64 << 20)) /dev/urandom >"$work/src.img"
qemu-img convert -n -f raw -O raw "$work/src.img" iscsi://127.0.0.1:$p1/$iqn/0 || fail "qemu-img write"
qemu-img convert -f raw -O raw iscsi://127.0.0.1:$p2/$iqn/0 "$work/back.img" || fail "qemu-img read"
cmp "$work/src.img" "$work/back.img" || fail "image read back through portal 2 differs"
kill -0 $pid || fail "target died"
echo "interop: 3 passed, 0 failed"
