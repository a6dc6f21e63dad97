#!/bin/bash
# A/B of two ironsan builds on an RBD LUN: 4K random reads at depth 32
# through `ironsan bench`, the two targets alternating round by round on
# the same image (and a third row: the second build with busy polling
# off), so a change's effect on the RBD data path is measured side by side.
#
#   CEPH_CONF=DIR/ceph.conf scripts/rbd-ab.sh OLD_BIN NEW_BIN
#
# Environment: ROUNDS (default 3), SECS per run (default 8), IRONSAN_RBD_OPTS
# (LUN options, e.g. ",ceph_client=ironsan,ceph_keyring=DIR/client.ironsan.keyring"),
# PORT (default 17650). The image rbd/ab (256 MiB) is created and filled
# once. Serves with tcmalloc when it is installed, as scripts/rbd.sh does.
set -u
[ $# = 2 ] || { echo "usage: CEPH_CONF=… $0 OLD_BIN NEW_BIN" >&2; exit 2; }
: "${CEPH_CONF:?set CEPH_CONF (scripts/ceph-cluster.sh up DIR)}"
old=$1 new=$2 port=${PORT:-17650}
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.ironsan:target0/0
tc=$(ls /usr/lib/*-linux-gnu/libtcmalloc.so.4 2>/dev/null | head -1 || true)
fill=
rbd info rbd/ab >/dev/null 2>&1 || { rbd create --size 256M rbd/ab && fill=1; }
run() { # BIN LABEL [serve options]
  local bin=$1 label=$2 pid r
  shift 2
  env ${tc:+LD_PRELOAD=$tc} "$bin" --log warn serve --listen "127.0.0.1:$port" \
    --lun "rbd:rbd/ab${IRONSAN_RBD_OPTS:-}" "$@" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  if [ -n "$fill" ]; then
    "$new" bench --rw write --bs 1m --iodepth 8 --size 256M "$url" >/dev/null 2>&1
    fill=
  fi
  r=$("$new" bench --rw randread --bs 4k --iodepth 32 --size 256M --runtime "${SECS:-8}" \
    --time_based "$url" 2>&1 | grep -oE 'IOPS=[0-9.]+k?' | head -1)
  kill "$pid"
  wait "$pid" 2>/dev/null
  echo "$label ${r:-IOPS=?}"
}
for _ in $(seq "${ROUNDS:-3}"); do
  run "$old" old
  run "$new" new
  run "$new" new-busy-poll-0 --busy-poll-us 0
done
