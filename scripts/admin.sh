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
bin=${CARGO_TARGET_DIR:-$PWD/target}/debug/ironsan
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
$bin --log info serve --config "$work/t.toml" --admin "127.0.0.1:$pa" --state-dir "$work/state" >"$work/target.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/$pa) 2>/dev/null && break
  sleep 0.1
done
fail() { echo "admin: FAILED: $*"; cat "$work/target.log"; exit 1; }
pass=0
ok() { pass=$((pass + 1)); echo "admin: ok: $*"; }
for _ in $(seq 50); do [ -S "$work/state/admin.sock" ] && break; sleep 0.1; done
# `ironsan admin` talks to the server over its Unix socket (this user
# only, no token); over HTTP it needs the token.
export IRONSAN_ADMIN_SOCKET=$work/state/admin.sock

# Nobody in without credentials (docs/ADMIN.md "Trust model").
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$pa/api/targets")
[ "$code" = 401 ] || fail "unauthenticated HTTP request got $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "http://127.0.0.1:$pa/api/targets/$iqn/chap")
[ "$code" = 401 ] || fail "unauthenticated DELETE chap got $code"
token=$(cat "$work/state/admin.token")
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" \
  -H "Host: rebind.evil.example:$pa" -H 'Content-Type: application/json' \
  -d '{"addr":"0.0.0.0:0"}' "http://127.0.0.1:$pa/api/portals")
[ "$code" = 403 ] || fail "a rebinding Host got $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" \
  -H "Origin: http://evil.example" -H 'Content-Type: application/json' \
  -d '{"addr":"0.0.0.0:0"}' "http://127.0.0.1:$pa/api/portals")
[ "$code" = 403 ] || fail "a foreign Origin got $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" "http://127.0.0.1:$pa/api/targets")
[ "$code" = 200 ] || fail "the token was refused: $code"
$bin admin --url "http://127.0.0.1:$pa" --state-dir "$work/state" list >/dev/null || fail "admin over HTTP with the token"
ok "HTTP: 401 without the token, 403 for a rebinding Host or a foreign Origin, 200 with the token"
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  # Another user (nobody) with a copy of the binary it may run, and the
  # directories opened so that only the socket's own mode stands between.
  cp "$bin" "$work/ironsan-copy"; chmod 755 "$work" "$work/state" "$work/ironsan-copy"
  as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$work/ironsan-copy" admin --socket "$work/state/admin.sock" list; }
  if as_nobody >"$work/other.txt" 2>&1; then fail "another user got in through the socket: $(cat "$work/other.txt")"; fi
  grep -q "admin socket" "$work/other.txt" && grep -qi "permission denied" "$work/other.txt" \
    || fail "another user: $(cat "$work/other.txt")"
  # Even with the socket opened to everyone, the peer's user id is checked.
  chmod 666 "$work/state/admin.sock"
  if as_nobody >"$work/other2.txt" 2>&1; then fail "another user got in through an open socket: $(cat "$work/other2.txt")"; fi
  grep -q "another user refused" "$work/target.log" || fail "no peer check logged: $(cat "$work/other2.txt")"
  chmod 600 "$work/state/admin.sock"; chmod 700 "$work/state"
  ok "the admin socket refuses another user (nobody): by its mode, and by SO_PEERCRED when opened"
else
  echo "admin: SKIPPED: the socket as another user (needs root and setpriv)"
fi
# LUN paths through the API: under lun_roots only, never onto a file the
# server did not create; the command line is trusted.
printf 'root only\n' >"$work/private"; chmod 600 "$work/private"
if $bin admin add-lun "$iqn" "file:$work/private:4K" >"$work/out.txt" 2>&1; then fail "a LUN on a file outside lun_roots was added"; fi
grep -q "lun_roots" "$work/out.txt" || fail "refusal does not name the rule: $(cat "$work/out.txt")"
ln -s "$work/private" "$work/state/luns/link.img"
if $bin admin add-lun "$iqn" "file:$work/state/luns/link.img:4K" >/dev/null 2>&1; then fail "a symlink into lun_roots was followed"; fi
[ "$(cat "$work/private")" = "root only" ] || fail "the private file changed"
$bin admin add-lun "$iqn" "file:$work/state/luns/new.img:8M" >/dev/null || fail "a new file under lun_roots"
$bin admin remove-lun "$iqn" 1 >/dev/null || fail "remove-lun"
ok "LUN paths: outside lun_roots and through a symlink refused, a new file under them created"
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
grep -q "$token" "$work/target.log" && fail "the admin token was logged"
curl -s -H "Authorization: Bearer $token" "http://127.0.0.1:$pa/metrics" | grep -q "$token" && fail "the token in /metrics"
ok "configuration file in step, no secret logged"
echo "admin: $pass passed, 0 failed"
