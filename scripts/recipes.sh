#!/usr/bin/env bash
# `ironsan tune linux|windows|esxi` recipes against the parsers that will
# read them, from a target with two portals:
#  - Linux: the multipath configuration file the recipe writes is read by
#    multipath-tools' own parser (`multipath -T`, Debian's multipath-tools),
#    with /etc overlaid in a private mount namespace so the host's
#    configuration is untouched; no parser warning. A control run with the
#    one-line entries of the old recipe must draw warnings, so the check
#    can fail.
#  - Windows: every -TargetPortalPortNumber is an integer (the cmdlets'
#    parameter is a UInt16) and no address carries the SendTargets ",TPGT".
#  - ESXi: every --address is HOST:PORT (esxcli iscsi adapter discovery
#    sendtarget add --address=<ip/dns[:port]>).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
cargo build -q -p ironsan
bin=${CARGO_TARGET_DIR:-$PWD/target}/debug/ironsan
work=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
p1=$(port) p2=$(port)
iqn=iqn.2026-12.io.ironsan:recipes
$bin --log warn serve --listen "127.0.0.1:$p1" --listen "127.0.0.1:$p2" --target "$iqn" \
  --lun mem:16M --lun null:16M >"$work/target.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/$p1) 2>/dev/null && break
  sleep 0.1
done
fail() { echo "recipes: FAILED: $*"; exit 1; }
pass=0
ok() { pass=$((pass + 1)); echo "recipes: ok: $*"; }
for os in linux windows esxi; do
  $bin tune "$os" "iscsi://127.0.0.1:$p1/$iqn" >"$work/$os.txt" 2>"$work/$os.err" \
    || fail "tune $os: $(cat "$work/$os.err")"
done

# Windows.
n=0
while read -r v; do
  [[ $v =~ ^[0-9]+$ ]] && [ "$v" -le 65535 ] || fail "-TargetPortalPortNumber $v is not a UInt16"
  n=$((n + 1))
done < <(grep -o -- '-TargetPortalPortNumber [^ ]*' "$work/windows.txt" | cut -d' ' -f2)
[ "$n" = 4 ] || fail "expected 2 portals x 2 cmdlets, found $n port numbers"
if grep -- '-TargetPortalAddress' "$work/windows.txt" | grep -q ','; then fail "a portal address with a ,TPGT"; fi
ok "Windows: $n -TargetPortalPortNumber values, all UInt16; addresses without ,TPGT"

# ESXi.
n=0
while read -r v; do
  [[ $v =~ ^(\[[0-9a-fA-F:]+\]|[^:,]+):[0-9]+$ ]] || fail "--address=$v is not HOST:PORT"
  n=$((n + 1))
done < <(grep -o -- '--address=[^ ]*' "$work/esxi.txt" | cut -d= -f2)
[ "$n" = 2 ] || fail "expected 2 sendtarget addresses, found $n"
ok "ESXi: $n sendtarget --address values, all HOST:PORT"

# Linux.
sed -n "/<<'EOF'/,/^EOF\$/p" "$work/linux.txt" | sed '1d;$d' >"$work/ironsan.conf"
grep -q "alias ironsan_lun1" "$work/ironsan.conf" || fail "no multipaths entry for LUN 1: $(cat "$work/ironsan.conf")"
overlay_ok() { # a private mount namespace with /etc overlaid works here
  local d
  d=$(mktemp -d "$work/probe.XXXX")
  mkdir "$d/up" "$d/wk"
  unshare -m sh -c "mount -t overlay overlay -o lowerdir=/etc,upperdir=$d/up,workdir=$d/wk /etc" 2>/dev/null
}
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! overlay_ok; then
  echo "recipes: SKIPPED: multipath-tools' parser (needs root, unshare and an overlay mount over /etc in a private namespace)"
else
  command -v multipath >/dev/null || { apt-get update -qq; apt-get install -y -qq multipath-tools >/dev/null; }
  # multipath -T with FILE as /etc/multipath/conf.d/ironsan.conf; prints
  # the parser's complaints about the file.
  parse() {
    local d
    d=$(mktemp -d "$work/ovl.XXXX")
    mkdir "$d/up" "$d/wk"
    unshare -m sh -c "mount -t overlay overlay -o lowerdir=/etc,upperdir=$d/up,workdir=$d/wk /etc \
      && mkdir -p /etc/multipath/conf.d && cp '$1' /etc/multipath/conf.d/ironsan.conf \
      && multipath -v3 -T" >"$d/out" 2>"$d/err" || true
    # Its complaints name the file, or say what they ignored or missed;
    # device-mapper's absence (no dm driver here) is not the file's fault.
    grep -i "ironsan.conf\|ignoring\|invalid keyword\|missing '\|config section" "$d/err" || true
  }
  # The control: the old recipe's one-line entries draw warnings (which
  # also shows that the conf.d file is read).
  printf 'multipaths {\n    multipath { wwid 36abc  alias ironsan_lun0 }   # naa.6abc\n}\n' >"$work/old.conf"
  [ -n "$(parse "$work/old.conf" | grep -i 'ignoring\|missing')" ] \
    || fail "the parser check cannot fail: no warning for one-line entries ($(parse "$work/old.conf"))"
  complaints=$(parse "$work/ironsan.conf")
  [ -z "$complaints" ] || fail "multipath-tools complains about the recipe's file: $complaints"
  ok "Linux: multipath-tools $(multipath -h 2>&1 | head -1 | cut -d' ' -f2) parses the recipe's conf.d file without a warning (one-line entries draw them)"
fi
echo "recipes: $pass passed, 0 failed"
