#!/usr/bin/env bash
# CHAP and ACLs against independent initiators (libiscsi tools) and our own:
#  - iscsi-inq logs in with CHAP (user%secret in the URL) and with mutual CHAP
#    (target_user/target_password URL arguments, and libiscsi's
#    LIBISCSI_CHAP_TARGET_USERNAME/PASSWORD environment variables);
#  - a wrong secret, no credentials, a wrong target secret and an initiator
#    name not on the allow-list are refused;
#  - discovery needs CHAP too and lists only the targets the initiator may
#    log in to; `ironsan inq` (our initiator) does CHAP and mutual CHAP.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
command -v iscsi-inq >/dev/null || { apt-get update -qq; apt-get install -y -qq libiscsi-bin >/dev/null; }
cargo build -q -p ironsan
bin=${CARGO_TARGET_DIR:-target}/debug/ironsan
work=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
p=$(port)
iqn=iqn.2026-11.io.ironsan:secure
ok_ini=iqn.2026-11.io.ironsan:allowed
cat >"$work/t.toml" <<EOF
listen = ["127.0.0.1:$p"]
[discovery]
chap = { user = "alice", secret = "alice-secret-1" }
mutual_chap = { user = "target", secret_file = "$work/target.secret" }
[[target]]
name = "$iqn"
allow = ["$ok_ini"]
chap = { user = "alice", secret = "alice-secret-1" }
mutual_chap = { user = "target", secret_file = "$work/target.secret" }
[[target.lun]]
backend = "mem"
size = "16M"
[[target]]
name = "iqn.2026-11.io.ironsan:hidden"
allow = ["iqn.2026-11.io.ironsan:someone-else"]
[[target.lun]]
backend = "mem"
size = "16M"
EOF
printf 'target-secret-2\n' >"$work/target.secret"
chmod 600 "$work/target.secret"
$bin --log info serve --config "$work/t.toml" >"$work/target.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break
  sleep 0.1
done
fail() { echo "security: FAILED: $*"; cat "$work/target.log"; exit 1; }
pass=0
ok() { pass=$((pass + 1)); echo "security: ok: $*"; }
url="iscsi://alice%alice-secret-1@127.0.0.1:$p/$iqn/0"

iscsi-inq -i "$ok_ini" "$url" >"$work/inq.txt" 2>&1 || fail "CHAP login: $(cat "$work/inq.txt")"
grep -q "IRONSAN" "$work/inq.txt" || grep -qi "vendor" "$work/inq.txt" || fail "no INQUIRY data"
ok "iscsi-inq with CHAP"

iscsi-inq -i "$ok_ini" "$url?target_user=target&target_password=target-secret-2" >/dev/null 2>&1 \
  || fail "mutual CHAP via URL arguments"
ok "iscsi-inq with mutual CHAP (URL arguments)"
LIBISCSI_CHAP_TARGET_USERNAME=target LIBISCSI_CHAP_TARGET_PASSWORD=target-secret-2 \
  iscsi-inq -i "$ok_ini" "$url" >/dev/null 2>&1 || fail "mutual CHAP via environment"
ok "iscsi-inq with mutual CHAP (environment)"

refused() { # what, command...
  local what=$1; shift
  if "$@" >"$work/out.txt" 2>&1; then fail "$what was accepted"; fi
  ok "$what refused"
}
refused "a wrong secret" iscsi-inq -i "$ok_ini" "iscsi://alice%wrong-secret-9@127.0.0.1:$p/$iqn/0"
refused "a wrong user" iscsi-inq -i "$ok_ini" "iscsi://mallory%alice-secret-1@127.0.0.1:$p/$iqn/0"
refused "no credentials" iscsi-inq -i "$ok_ini" "iscsi://127.0.0.1:$p/$iqn/0"
refused "a wrong target secret (mutual)" iscsi-inq -i "$ok_ini" \
  "$url?target_user=target&target_password=not-the-target-1"
refused "an initiator not on the allow-list" iscsi-inq -i iqn.2026-11.io.ironsan:stranger "$url"
grep -q "0x0202\|Authorization failure" "$work/out.txt" || fail "allow-list refusal is not 0x0202: $(cat "$work/out.txt")"

# Discovery: CHAP required; only the allowed target is listed.
iscsi-ls -i "$ok_ini" "iscsi://alice%alice-secret-1@127.0.0.1:$p" >"$work/ls.txt" 2>&1 || fail "discovery with CHAP: $(cat "$work/ls.txt")"
grep -q "$iqn" "$work/ls.txt" || fail "discovery does not list $iqn"
if grep -q hidden "$work/ls.txt"; then fail "discovery lists a target the initiator may not use"; fi
ok "discovery with CHAP lists only permitted targets"
refused "discovery without CHAP" iscsi-ls -i "$ok_ini" "iscsi://127.0.0.1:$p"

# Our own initiator.
$bin inq --initiator "$ok_ini" "$url" >/dev/null 2>&1 || fail "ironsan inq with CHAP"
$bin inq --initiator "$ok_ini" "$url?target_user=target&target_password=target-secret-2" >/dev/null 2>&1 \
  || fail "ironsan inq with mutual CHAP"
ok "ironsan inq with CHAP and mutual CHAP"
refused "ironsan inq with a wrong target secret" $bin inq --initiator "$ok_ini" \
  "$url?target_user=target&target_password=not-the-target-1"

# Secrets never reach the log.
if grep -q "alice-secret-1\|target-secret-2" "$work/target.log"; then fail "a secret was logged"; fi
grep -q "login refused" "$work/target.log" || fail "refused logins are not logged"
ok "failed logins logged, secrets not"

# Secrets off the command line: --chap-file and IRONSAN_CHAP keep the secret
# out of ps and /proc/PID/cmdline; --chap USER:SECRET still works and warns.
printf 'bob:bob-secret-1234\n' >"$work/chap"
chmod 600 "$work/chap"
iqn2=iqn.2026-12.io.ironsan:cmdline
serve_with() { # log, extra serve arguments...
  local log=$1; shift
  local p2; p2=$(port)
  $bin --log info serve --listen "127.0.0.1:$p2" --target "$iqn2" --lun mem:16M "$@" >"$log" 2>&1 &
  extra=$!
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$p2) 2>/dev/null && break; sleep 0.1; done
  iscsi-inq "iscsi://bob%bob-secret-1234@127.0.0.1:$p2/$iqn2/0" >/dev/null 2>&1 || fail "CHAP login ($*): $(cat "$log")"
  if iscsi-inq "iscsi://127.0.0.1:$p2/$iqn2/0" >/dev/null 2>&1; then fail "no CHAP accepted ($*)"; fi
  tr '\0' ' ' </proc/$extra/cmdline >"$work/cmdline"
  kill $extra; wait $extra 2>/dev/null || true
}
serve_with "$work/t2.log" --chap-file "$work/chap"
if grep -q "bob-secret-1234" "$work/cmdline"; then fail "--chap-file: the secret is in the command line"; fi
IRONSAN_CHAP=bob:bob-secret-1234 serve_with "$work/t3.log"
if grep -q "bob-secret-1234" "$work/cmdline"; then fail "IRONSAN_CHAP: the secret is in the command line"; fi
if grep -q "bob-secret-1234" "$work/t2.log" "$work/t3.log"; then fail "a secret was logged"; fi
serve_with "$work/t4.log" --chap bob:bob-secret-1234
grep -q "use --chap-file or IRONSAN_CHAP" "$work/t4.log" || fail "--chap did not warn: $(cat "$work/t4.log")"
if grep -q "bob-secret-1234" "$work/t4.log"; then fail "--chap: the secret was logged"; fi
ok "--chap-file and IRONSAN_CHAP keep the secret out of ps; --chap warns"
echo "security: $pass passed, 0 failed"
