#!/usr/bin/env bash
# ironsan on Ceph RBD, end to end: starts a one-node Ceph on loopback
# (scripts/ceph-cluster.sh, installing it when missing), creates images, and
#   1. runs the backend's live test (crates/storage, IRONSAN_RBD_TEST),
#   2. runs libiscsi's iscsi-test-cu on an RBD LUN (scripts/conformance.py
#      --lun rbd:..., expectations tests/conformance/expected-pass-rbd.txt),
#   3. writes a 64 MiB image through the LUN with qemu-img and reads it
#      back, and writes/reads all of a 256 MiB LUN with ironsan bench --verify,
#      and serves a namespace image and a read-only snapshot (3b),
#   4b. pauses the OSD for 15 s under a bench: retried NOT READY 04/01, no
#      error, logged once per burst and counted in /metrics,
#   4c. starts serve with the monitor down: it listens, reports the LU
#      becoming ready, and serves it once the monitor is back,
#   4. compares 4K random reads at depth 32: rbd bench (librbd directly) and
#      ironsan bench through the target, on the same image, same run,
#   5. runs two gateways on one image and kills the owner under a multipath
#      --verify bench, then under a plain client (scripts/gateways.sh),
#   6. does it again under a Linux kernel in qemu: dm-multipath over both
#      gateways, ext4 and fio --verify (scripts/guest/run.py gateways),
# then stops everything by PID. Prints pass/skip/fail per step; exits
# non-zero when a step failed.
#
# Environment: IRONSAN_CEPH_DIR (cluster directory, default a fresh one in
# /tmp), IRONSAN_RBD_PORT (target portal, default 17262), CEPH_MON_PORT.
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$SECONDS
dir=${IRONSAN_CEPH_DIR:-/tmp/ironsan-rbd.$$}
port=${IRONSAN_RBD_PORT:-17262}
iqn=iqn.2026-11.io.ironsan:rbd
url=iscsi://127.0.0.1:$port/$iqn/0
work=$(mktemp -d)
srv=
results=()
failed=0

now=setup
say() { echo "rbd.sh: $*" >&2; }
part() { # TITLE: a numbered part starts
  now=$1
  say "$1"
}
step() { # NAME STATE
  results+=("$(printf '%-28s %s' "$1" "$2")")
  [ "$2" != fail ] || failed=1
}
report() {
  echo
  echo "ironsan on RBD ($((SECONDS - t_start)) s):"
  printf '  %s\n' "${results[@]}"
}
# No cluster command may hang the run: against a cluster that stopped
# serving they fail after a while, and the cluster's state is printed.
rbd() { timeout 120 rbd "$@"; }
cluster_state() {
  say "cluster state:"
  timeout 15 ceph --connect-timeout 10 -s >&2 || true
  tail -20 "$dir/log/osd.0.log" >&2 || true
}
pgs_ready() { # SECONDS: objects in every PG written and read back within SECONDS
  # (no ceph-mgr here, so no PG states to ask; a laggy PG blocks its requests)
  local deadline=$((SECONDS + $1))
  while [ $SECONDS -lt $deadline ]; do
    if timeout 20 rados -p rbd bench 2 write -b 4096 -t 16 --no-cleanup >"$work/probe.txt" 2>&1 &&
      timeout 20 rados -p rbd bench 2 seq -t 16 >>"$work/probe.txt" 2>&1; then
      timeout 30 rados -p rbd cleanup >/dev/null 2>&1 || true
      return 0
    fi
    sleep 1
  done
  tail -5 "$work/probe.txt" >&2
  say "the pool did not serve writes and reads in $1 s"
  return 1
}

stop_serve() { # PID: SIGTERM, then 30 s to finish in-flight commands and exit
  local i
  kill "$1" 2>/dev/null || return 0
  for i in $(seq 300); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$1" 2>/dev/null; then
    say "serve (PID $1) still running 30 s after SIGTERM: killed"
    kill -9 "$1" 2>/dev/null || true
    step "serve stops on SIGTERM" fail
  fi
  wait "$1" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  if [ -n "$srv" ] && kill -0 "$srv" 2>/dev/null; then
    stop_serve "$srv"
  fi
  if [ "$interrupted" ]; then
    say "interrupted (SIG$interrupted) during: $now"
    cluster_state
    report
  fi
  scripts/ceph-cluster.sh down "$dir" || true
  rm -rf "$work"
  return "$rc"
}
interrupted=
trap cleanup EXIT
# A run stopped from outside (test.sh bounds it with timeout) says where.
trap 'interrupted=TERM; exit 124' TERM
trap 'interrupted=INT; exit 130' INT

if ! command -v iscsi-test-cu >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libiscsi-bin >/dev/null
fi
say "building ironsan (release)"
cargo build -q --release -p ironsan
bin=${CARGO_TARGET_DIR:-target}/release/ironsan

t0=$SECONDS
scripts/ceph-cluster.sh up "$dir"
say "cluster ready after $((SECONDS - t0)) s"
export CEPH_CONF=$dir/ceph.conf
# Every LUN connects as client.ironsan, a non-admin client with the
# capabilities docs/GATEWAYS.md lists (scripts/ceph-cluster.sh makes it).
export IRONSAN_RBD_OPTS=",ceph_client=ironsan,ceph_keyring=$dir/client.ironsan.keyring"
rbd create --size 256M rbd/ironsan
rbd create --size 64M rbd/conformance
rbd create --size 64M rbd/scratch

part "1. backend live test"
rbd create --size 64M rbd/locktest
# The live tests are #[ignore]d without a cluster; here they run, and all
# of them must (none filtered out by a rename).
if IRONSAN_RBD_TEST=rbd/scratch IRONSAN_RBD_LOCK_TEST=rbd/locktest \
  cargo test -q -p storage --features rbd live -- --ignored >"$work/live.log" 2>&1 &&
  cargo test -q -p rbd-sys -- --ignored >>"$work/live.log" 2>&1 &&
  grep -q '^test result: ok. 3 passed' "$work/live.log" &&
  grep -q '^test result: ok. 1 passed' "$work/live.log"; then
  grep '^test result' "$work/live.log"
  step "backend live test" pass
else
  # Which test failed and why, not only the totals.
  grep -E -A3 "panicked|^test result" "$work/live.log" | head -40
  step "backend live test" fail
fi

part "2. iscsi-test-cu on rbd:rbd/conformance"
t0=$SECONDS
if python3 scripts/conformance.py --ironsan "$bin" --lun "rbd:rbd/conformance$IRONSAN_RBD_OPTS" \
  --expect tests/conformance/expected-pass-rbd.txt --log "${CARGO_TARGET_DIR:-target}/conformance-rbd.log" |
  tee "$work/conformance.out" | tail -8; then
  step "conformance" "pass ($(grep -o 'totals: .*' "$work/conformance.out"), $((SECONDS - t0)) s)"
else
  step "conformance" "fail ($(grep -o 'totals: .*' "$work/conformance.out" || echo no totals))"
fi

serve() { # [ENV=VALUE]: (re)starts the target on rbd:rbd/ironsan
  if [ -n "$srv" ]; then
    stop_serve "$srv"
  fi
  say "serving rbd:rbd/ironsan on 127.0.0.1:$port $*"
  env "$@" "$bin" --log warn serve --listen "127.0.0.1:$port" --target "$iqn" \
    --lun "rbd:rbd/ironsan$IRONSAN_RBD_OPTS" >"$work/target.log" 2>&1 &
  srv=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return
    kill -0 "$srv" 2>/dev/null || {
      cat "$work/target.log" >&2
      exit 1
    }
    sleep 0.1
  done
}
serve

part "3. data round trips"
if command -v qemu-img >/dev/null && ls /usr/lib/x86_64-linux-gnu/qemu/block-iscsi.so >/dev/null 2>&1; then
  head -c $((64 << 20)) /dev/urandom >"$work/src.img"
  if qemu-img convert -n -f raw -O raw "$work/src.img" "$url" &&
    qemu-img convert -f raw -O raw "$url" "$work/back.img" &&
    cmp -n $((64 << 20)) "$work/src.img" "$work/back.img"; then
    step "qemu-img write/read 64M" pass
  else
    step "qemu-img write/read 64M" fail
  fi
  rm -f "$work/src.img" "$work/back.img"
else
  step "qemu-img write/read 64M" "skip (no qemu-img with iscsi://; scripts/interop.sh installs it)"
fi
if "$bin" bench --rw write --bs 1m --iodepth 8 --verify "$url" >"$work/w.txt" 2>&1 &&
  id=$(grep -oE 'verify-id 0x[0-9a-f]+' "$work/w.txt" | head -1 | cut -d' ' -f2) &&
  [ -n "$id" ] &&
  "$bin" bench --rw read --bs 1m --iodepth 8 --verify --verify-id "$id" "$url" >"$work/r.txt" 2>&1; then
  step "bench --verify 256M" pass
else
  cat "$work/w.txt" "$work/r.txt" 2>/dev/null | tail -20 >&2
  step "bench --verify 256M" fail
fi

part "3b. a namespace LUN and a snapshot LUN, as client.ironsan"
# A second target on its own port, so the main one keeps serving.
nsurl=iscsi://127.0.0.1:$((port + 1))/$iqn:more
ns_ok=
nssrv=
if rbd namespace create rbd/tenant1 && rbd create --size 32M rbd/tenant1/vol &&
  rbd create --size 32M rbd/snapsrc; then
  "$bin" --log info serve --listen "127.0.0.1:$((port + 1))" --target "$iqn:more" \
    --lun "rbd:rbd/tenant1/vol$IRONSAN_RBD_OPTS" --lun "rbd:rbd/snapsrc$IRONSAN_RBD_OPTS" \
    >"$work/ns.log" 2>&1 &
  nssrv=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null && break
    sleep 0.1
  done
  # Data written to the namespace image reads back; data written to the
  # image before its snapshot reads back from the snapshot after the image
  # is overwritten, and the snapshot refuses writes (WRITE PROTECTED).
  if "$bin" bench --rw write --bs 64k --size 32M --verify "$nsurl/0" >"$work/ns.txt" 2>&1 &&
    nsid=$(grep -oE 'verify-id 0x[0-9a-f]+' "$work/ns.txt" | head -1 | cut -d' ' -f2) &&
    "$bin" bench --rw read --bs 64k --size 32M --verify --verify-id "$nsid" "$nsurl/0" \
      >>"$work/ns.txt" 2>&1 &&
    "$bin" bench --rw write --bs 64k --size 32M --verify "$nsurl/1" >"$work/snap.txt" 2>&1 &&
    snid=$(grep -oE 'verify-id 0x[0-9a-f]+' "$work/snap.txt" | head -1 | cut -d' ' -f2); then
    stop_serve "$nssrv"
    rbd snap create rbd/snapsrc@monday >/dev/null &&
      rbd bench --io-type write --io-size 64K --io-total 32M rbd/snapsrc >/dev/null 2>&1
    "$bin" --log info serve --listen "127.0.0.1:$((port + 1))" --target "$iqn:more" \
      --lun "rbd:rbd/snapsrc@monday$IRONSAN_RBD_OPTS" >>"$work/ns.log" 2>&1 &
    nssrv=$!
    for _ in $(seq 100); do
      (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null && break
      sleep 0.1
    done
    if "$bin" bench --rw read --bs 64k --size 32M --verify --verify-id "$snid" "$nsurl/0" \
      >>"$work/snap.txt" 2>&1 &&
      ! "$bin" bench --rw write --bs 4k --size 1M --runtime 1 "$nsurl/0" >"$work/snapw.txt" 2>&1 &&
      grep -q 'WRITE PROTECTED' "$work/snapw.txt" &&
      grep -q 'image=rbd/tenant1/vol client="client.ironsan"' "$work/ns.log"; then
      ns_ok=1
    fi
  fi
fi
if [ -n "$nssrv" ]; then
  stop_serve "$nssrv"
fi
if [ -n "$ns_ok" ]; then
  step "namespace and snapshot" pass
else
  cat "$work/ns.txt" "$work/snap.txt" "$work/snapw.txt" 2>/dev/null | tail -12 >&2
  tail -5 "$work/ns.log" >&2
  step "namespace and snapshot" fail
fi

part "4. 4K random reads, depth 32, 256 MiB: rbd bench vs ironsan bench"
# The `rbd` tool links tcmalloc and librbd allocates on every request:
# serve with the same allocator (docs/CONFIG.md recommends it for rbd LUNs),
# so the comparison is of the data paths, not of malloc implementations.
tcmalloc=$(ls /usr/lib/*-linux-gnu/libtcmalloc.so.4 2>/dev/null | head -1 || true)
alloc=()
allocator="glibc malloc"
if [ -n "$tcmalloc" ]; then
  alloc=("LD_PRELOAD=$tcmalloc")
  allocator=tcmalloc
  serve "${alloc[@]}"
fi
rbd bench --io-type read --io-pattern rand --io-size 4K --io-threads 32 --io-total 256M rbd/ironsan \
  >"$work/rbdbench.txt" 2>&1 || step "rbd bench" fail
rbd_iops=$(awk '/^elapsed:/ { for (i = 1; i <= NF; i++) if ($i == "ops/sec:") print $(i + 1) }' "$work/rbdbench.txt")
"$bin" bench --rw randread --bs 4k --iodepth 32 --size 256M "$url" >"$work/isb.txt" 2>&1 ||
  step "ironsan bench" fail
isb_iops=$(grep -oE 'IOPS=[0-9.]+k?' "$work/isb.txt" | head -1 | cut -d= -f2)
# The same through the I/O pool (each command waits on a pool thread)
# instead of completions delivered to the event loop.
serve IRONSAN_RBD_WAIT=1 "${alloc[@]}"
"$bin" bench --rw randread --bs 4k --iodepth 32 --size 256M "$url" >"$work/isbw.txt" 2>&1 ||
  step "ironsan bench (pool)" fail
wait_iops=$(grep -oE 'IOPS=[0-9.]+k?' "$work/isbw.txt" | head -1 | cut -d= -f2)
say "rbd bench:            $(grep '^elapsed:' "$work/rbdbench.txt" || echo '?')"
say "ironsan bench:        $(grep -E 'IOPS=' "$work/isb.txt" | head -1 || echo '?')"
say "ironsan bench (pool): $(grep -E 'IOPS=' "$work/isbw.txt" | head -1 || echo '?')"
step "4K randread Q32 IOPS" "rbd bench ${rbd_iops:-?}, ironsan ${isb_iops:-?} (I/O pool: ${wait_iops:-?}; $allocator)"

if [ -n "$srv" ]; then
  stop_serve "$srv"
  srv=
fi
part "4b. the OSD paused 15 s under load: NOT READY 04/01, retried, logged, counted; I/O resumes"
# The requests the OSD does not answer fail after ceph_op_timeout (8 s
# here, 25 s by default) with LOGICAL UNIT IS IN PROCESS OF BECOMING READY,
# which initiators retry on the same path (not a path failure, not
# standby); the bench retries them for up to 30 s, as the kernel would, and
# must end with no error.
rbd create --size 64M rbd/osdpause
"$bin" --log info serve --listen "127.0.0.1:$((port + 2))" --target "$iqn:pause" \
  --lun "rbd:rbd/osdpause$IRONSAN_RBD_OPTS,ceph_op_timeout=8" --admin 127.0.0.1:0 --state-dir "$work" \
  >"$work/pause.log" 2>&1 &
psrv=$!
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$((port + 2))") 2>/dev/null && break
  sleep 0.1
done
timeout 150 "$bin" bench --rw randwrite --bs 4k --iodepth 4 --size 64M --runtime 30 --time_based \
  "iscsi://127.0.0.1:$((port + 2))/$iqn:pause/0" >"$work/pause.txt" 2>&1 &
pbench=$!
sleep 3
osd=$(cat "$dir/osd.0.pid")
kill -STOP "$osd"
sleep 15
kill -CONT "$osd"
prc=0
wait "$pbench" || prc=$?
faults=$("$bin" admin --state-dir "$work" metrics 2>/dev/null |
  awk '/^ironsan_storage_faults_total\{kind="unresponsive"\}/ { print $2 }')
lines=$(grep -c 'storage fault' "$work/pause.log" || true)
stop_serve "$psrv"
cat "$work/pause.txt" >&2
say "unresponsive faults counted: ${faults:-none}; storage fault log lines: $lines"
if [ "$prc" = 0 ] && grep -q ' 0 errors' "$work/pause.txt" && grep -q '2/04/01' "$work/pause.txt" &&
  [ "${faults:-0}" -gt 0 ] && [ "$lines" -ge 1 ] && [ "$lines" -lt "$faults" ]; then
  step "OSD paused 15 s" "pass ($faults requests NOT READY 04/01 and retried, $lines log lines, 0 errors)"
else
  tail -5 "$work/pause.log" >&2
  cluster_state
  step "OSD paused 15 s" fail
fi
# What follows needs a cluster that serves every PG again.
if ! pgs_ready 60; then
  cluster_state
  step "cluster after the pause" fail
fi

part "4c. the monitor down at start: serve listens, the LU is becoming ready, served once it is back"
# With no monitor, opening the image cannot finish: serve waits
# ceph_start_wait (5 s), listens, answers NOT READY 04/01 (becoming ready)
# with the LU's identity, and keeps trying in the background. A bench
# started meanwhile retries NOT READY and must end with no error; what it
# wrote reads back.
rbd create --size 64M rbd/late
mon=$(cat "$dir/mon.a.pid")
kill "$mon"
for _ in $(seq 100); do kill -0 "$mon" 2>/dev/null || break; sleep 0.1; done
lurl=iscsi://127.0.0.1:$((port + 3))/$iqn:late/0
mkdir -p "$work/late"
t0=$SECONDS
"$bin" --log info serve --listen "127.0.0.1:$((port + 3))" --target "$iqn:late" \
  --lun "rbd:rbd/late$IRONSAN_RBD_OPTS" --admin 127.0.0.1:0 --state-dir "$work/late" \
  >"$work/late.log" 2>&1 &
lsrv=$!
listening=
for _ in $(seq 300); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$((port + 3))") 2>/dev/null; then
    listening=$((SECONDS - t0))
    break
  fi
  kill -0 "$lsrv" 2>/dev/null || break
  sleep 0.1
done
timeout 60 "$bin" inq "$lurl" >"$work/late-inq.txt" 2>&1 || true
timeout 60 "$bin" admin --state-dir "$work/late" list >"$work/late-list.txt" 2>&1 || true
timeout 150 "$bin" bench --rw write --bs 64k --size 64M --verify "$lurl" >"$work/late-w.txt" 2>&1 &
lbench=$!
sleep 3
t1=$SECONDS
ceph-mon -c "$dir/ceph.conf" -i a
lrc=0
wait "$lbench" || lrc=$?
lid=$(grep -oE 'verify-id 0x[0-9a-f]+' "$work/late-w.txt" | head -1 | cut -d' ' -f2)
opened=$(grep -oE 'open after [0-9]+ attempt\(s\) in [0-9.]+ s' "$work/late.log" | head -1)
cat "$work/late-inq.txt" "$work/late-list.txt" "$work/late-w.txt" >&2
if [ -n "$listening" ] && [ "$lrc" = 0 ] && [ -n "$lid" ] && [ -n "$opened" ] &&
  grep -q 'BECOMING READY' "$work/late-inq.txt" && grep -q 'Device identifier: naa' "$work/late-inq.txt" &&
  grep -q 'opening (NOT READY' "$work/late-list.txt" && grep -q ' 0 errors' "$work/late-w.txt" &&
  timeout 150 "$bin" bench --rw read --bs 64k --size 64M --verify --verify-id "$lid" "$lurl" >"$work/late-r.txt" 2>&1; then
  step "monitor down at start" "pass (listening after ${listening} s, NOT READY 04/01 meanwhile; $opened, the monitor restarted at $((t1 - t0)) s; bench 0 errors, data read back)"
else
  tail -8 "$work/late.log" >&2
  cat "$work/late-r.txt" 2>/dev/null >&2
  step "monitor down at start" fail
fi
stop_serve "$lsrv"

part "5. two gateways, one image: failover"
if scripts/gateways.sh "$bin" 2>&1 | tee "$work/gateways.out" | grep '^gateways: '; then
  step "gateway failover" "pass ($(grep -o '[0-9]* passed, [0-9]* failed' "$work/gateways.out"))"
else
  step "gateway failover" fail
fi

# 6. The Linux kernel over both gateways (scripts/guest/run.py gateways):
#    dm-multipath, the owner killed -9 under fio --verify on ext4.
if [ "${IRONSAN_SKIP_GUEST:-0}" != 1 ]; then
  part "6. a Linux kernel over two gateways: dm-multipath failover"
  rc=0
  python3 scripts/guest/run.py gateways >"$work/guest.out" 2>&1 || rc=$?
  grep -E '^guest: ' "$work/guest.out" | tail -4 >&2
  if grep -q '^guest: gateways: SKIPPED' "$work/guest.out"; then
    step "kernel over gateways" skip
  elif [ $rc = 0 ] && grep -q '^guest: gateways: PASS' "$work/guest.out"; then
    step "kernel over gateways" pass
  else
    cat "$work/guest.out" >&2
    step "kernel over gateways" fail
  fi
fi

report
exit "$failed"
