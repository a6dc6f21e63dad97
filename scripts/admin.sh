#!/usr/bin/env bash
# Run-time changes through `ironsan admin`, checked with an independent
# initiator (libiscsi's tools) and no restart:
#  - CHAP set at run time: iscsi-inq without credentials is refused, with
#    them it logs in; cleared again: open;
#  - an initiator ACL: another initiator name is refused and not listed;
#  - a portal removed: iscsi-ls lists one portal, the removed one refuses;
#  - a RAM LUN grown: iscsi-readcapacity16 reports the new size;
#  - the configuration file has the changes (and no secret in the log).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
command -v iscsi-inq >/dev/null || { apt-get update -qq; apt-get install -y -qq libiscsi-bin >/dev/null; }
cargo build -q -p ironsan
bin=$PWD/target/debug/ironsan
work=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
p1=$(port) p2=$(port) pa=$(port)
iqn=iqn.2026-12.io.ironsan:admin
ini=iqn.2026-12.io.example:host1
cat >"$work/t.toml" <<EOF
listen = ["127.0.0.1:$p1", "127.0.0.1:$p2"]
[[target]]
name = "$iqn"
[[target.lun]]
backend = "mem"
size = "16M"
EOF
$bin --log info serve --config "$work/t.toml" --admin "127.0.0.1:$pa" >"$work/target.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/$pa) 2>/dev/null && break
  sleep 0.1
done
export IRONSAN_ADMIN_URL=http://127.0.0.1:$pa
fail() { echo "admin: FAILED: $*"; cat "$work/target.log"; exit 1; }
pass=0
ok() { pass=$((pass + 1)); echo "admin: ok: $*"; }
lun="127.0.0.1:$p1/$iqn/0"

iscsi-inq -i "$ini" "iscsi://$lun" >/dev/null 2>&1 || fail "open login"
echo "admin-secret-12" | $bin admin set-chap "$iqn" host1 >/dev/null || fail "set-chap"
if iscsi-inq -i "$ini" "iscsi://$lun" >/dev/null 2>&1; then fail "login without CHAP accepted"; fi
iscsi-inq -i "$ini" "iscsi://host1%admin-secret-12@$lun" >/dev/null 2>&1 || fail "login with CHAP"
ok "CHAP set at run time: iscsi-inq refused without it, admitted with it"
$bin admin clear-chap "$iqn" >/dev/null || fail "clear-chap"
iscsi-inq -i "$ini" "iscsi://$lun" >/dev/null 2>&1 || fail "login after clear-chap"
ok "CHAP cleared at run time"

$bin admin allow "$iqn" "$ini" >/dev/null || fail "allow"
if iscsi-inq -i iqn.2026-12.io.example:other "iscsi://$lun" >/dev/null 2>&1; then fail "other initiator accepted"; fi
if iscsi-ls -i iqn.2026-12.io.example:other "iscsi://127.0.0.1:$p1" | grep -q "$iqn"; then fail "other initiator sees the target"; fi
iscsi-inq -i "$ini" "iscsi://$lun" >/dev/null 2>&1 || fail "allowed initiator refused"
ok "ACL changed at run time: other initiators refused and not listed"

$bin admin remove-portal "127.0.0.1:$p2" >/dev/null || fail "remove-portal"
iscsi-ls -i "$ini" "iscsi://127.0.0.1:$p1" >"$work/ls.txt" 2>&1 || fail "iscsi-ls: $(cat "$work/ls.txt")"
grep -q ":$p2," "$work/ls.txt" && fail "SendTargets still lists the removed portal"
grep -q ":$p1," "$work/ls.txt" || fail "SendTargets lost the other portal"
if iscsi-inq -i "$ini" "iscsi://127.0.0.1:$p2/$iqn/0" >/dev/null 2>&1; then fail "the removed portal accepts logins"; fi
ok "portal removed: gone from iscsi-ls, refuses logins"

$bin admin resize-lun "$iqn" 0 32M >/dev/null || fail "resize-lun"
iscsi-readcapacity16 -i "$ini" "iscsi://$lun" >"$work/cap.txt" 2>&1 || fail "readcapacity16: $(cat "$work/cap.txt")"
grep -q "Total size:33554432" "$work/cap.txt" || fail "capacity not 32 MiB: $(cat "$work/cap.txt")"
ok "RAM LUN grown: iscsi-readcapacity16 reports 32 MiB"

grep -q "allow = \[\"$ini\"\]" "$work/t.toml" || fail "ACL not in the file: $(cat "$work/t.toml")"
grep -q "size = \"32M\"" "$work/t.toml" || fail "size not in the file"
grep -q ":$p2\"" "$work/t.toml" && fail "removed portal still in the file"
grep -q "admin-secret-12" "$work/target.log" && fail "a secret was logged"
ok "configuration file in step, no secret logged"
echo "admin: $pass passed, 0 failed"
