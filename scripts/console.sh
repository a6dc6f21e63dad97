#!/usr/bin/env bash
# The web console in a real headless Chromium while an independent
# initiator (libiscsi's iscsi-perf) drives I/O: the page must show live
# charts with data points, and a screenshot is saved under target/.
# Usage: scripts/console.sh [path/to/ironsan]   (default target/debug/ironsan)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-${CARGO_TARGET_DIR:-target}/debug/ironsan}
OUT=${CARGO_TARGET_DIR:-target}/console
mkdir -p "$OUT"
if ! command -v chromium >/dev/null; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
if ! command -v iscsi-perf >/dev/null; then
    apt-get update -qq && apt-get install -y -qq libiscsi-bin >/dev/null
fi
[ -x "$BIN" ] || cargo build -q -p ironsan
PORT=$((20000 + RANDOM % 10000)); APORT=$((PORT + 1))
IQN=iqn.2026-11.io.ironsan:console
STATE=$(mktemp -d)
"$BIN" serve --listen 127.0.0.1:$PORT --target $IQN --lun mem:256M --lun null:1G \
    --admin 127.0.0.1:$APORT --state-dir "$STATE" >"$OUT/serve.log" 2>&1 &
SRV=$!
PERF=()
# iscsi-perf waits for its outstanding I/O after SIGTERM, which can spin
# forever: stop it for good before the target, so `wait` cannot hang.
cleanup() {
  kill "${PERF[@]}" 2>/dev/null || true
  sleep 1
  kill -9 "${PERF[@]}" 2>/dev/null || true
  kill $SRV 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$STATE"
}
trap cleanup EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$APORT/" >/dev/null && break; sleep 0.1; done
# Without a session the page shows only its log-in form.
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$APORT/api/stats")
[ "$code" = 401 ] || { echo "console: FAILED: /api/stats without a session: $code"; exit 1; }
# Reads on LUN 0, writes on LUN 1, for longer than the page is watched.
iscsi-perf -t 40 -b 8 iscsi://127.0.0.1:$PORT/$IQN/0 >"$OUT/perf0.log" 2>&1 &
PERF+=($!)
qemu-img bench -w -c 100000000 -d 16 -s 65536 -f raw "iscsi://127.0.0.1:$PORT/$IQN/1" >"$OUT/perf1.log" 2>&1 &
PERF+=($!)
sleep 6   # let the history fill
# Logged in the way an administrator would: a one-time link from
# `ironsan admin console` (over the admin socket), which sets the session
# cookie and redirects to the console. One link per browser start.
link() { "$BIN" admin --state-dir "$STATE" console; }
CHROME=(chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,900)
# The page fetches every second; the virtual time budget lets it run its timers.
"${CHROME[@]}" --virtual-time-budget=6000 --dump-dom "$(link)" >"$OUT/dom.html" 2>"$OUT/chromium.log"
"${CHROME[@]}" --virtual-time-budget=6000 --screenshot="$OUT/console.png" "$(link)" >>"$OUT/chromium.log" 2>&1
python3 - "$OUT/dom.html" <<'PY'
import re, sys
dom = open(sys.argv[1]).read()
charts = re.findall(r'<canvas class="chart (c-\w+)"[^>]*data-points="(\d+)"[^>]*data-max="([\d.e+-]+)"', dom)
updates = int(re.search(r'id="status" data-updates="(\d+)"', dom).group(1))
print(f"console: {len(charts)} charts, {updates} updates")
assert updates >= 2, "the page did not update"
assert len(charts) >= 6, f"expected 3 charts for each of 2 LUNs, got {charts}"
assert all(int(n) >= 3 for _, n, _ in charts), f"charts without data points: {charts}"
iops = [float(m) for k, _, m in charts if k == "c-iops"]
assert all(v > 0 for v in iops), f"IOPS charts are flat: {charts}"
assert "iscsi-perf" in dom or "iqn." in dom
print("console: ok, IOPS chart maxima", iops)
PY
test -s "$OUT/console.png"
echo "console: screenshot $OUT/console.png"
