#!/usr/bin/env bash
# A one-node Ceph cluster on loopback for tests: 1 monitor, 1 memstore OSD,
# pool size 1, cephx authentication, no systemd. Everything lives in DIR.
#
#   scripts/ceph-cluster.sh up DIR     install when missing, start, create
#                                      pool `rbd`, wait until it serves I/O
#   scripts/ceph-cluster.sh down DIR   stop the daemons by PID, remove DIR
#
# After `up`, clients use `-c DIR/ceph.conf` (or CEPH_CONF=DIR/ceph.conf):
# tools as client.admin (DIR/keyring), gateways as client.ironsan
# (DIR/client.ironsan.keyring: mon 'profile rbd', osd 'profile rbd pool=rbd').
# Environment: CEPH_AUTH (cephx, the default, or none), CEPH_MON_PORT
# (default 17300, msgr2 only), CEPH_OSD_PORTS
# (default 17310-17399), CEPH_MEMSTORE_BYTES (default 2 GiB: the OSD keeps
# every object in RAM up to this), CEPH_TIMEOUT (seconds, default 90),
# CEPH_WATCH_TIMEOUT (osd_client_watch_timeout, Ceph's default of 30 s
# unless set: how long a dead client keeps watching an image; the gateway
# tests run at the default).
#
# There is no ceph-mgr (it would pull in a Python web stack): PG states are
# then not reported, so readiness is HEALTH_OK + the OSD up and in + a
# write and read of an object in the pool, which block until its PGs are
# active.
set -euo pipefail

say() { echo "ceph-cluster: $*" >&2; }
die() {
  say "FAILED: $*"
  exit 1
}

usage() { die "usage: $0 up|down DIR"; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$2
[ -n "$dir" ] && [ "$dir" != / ] || die "refusing DIR '$dir'"

mon_port=${CEPH_MON_PORT:-17300}
auth=${CEPH_AUTH:-cephx}
osd_ports=${CEPH_OSD_PORTS:-17310-17399}
memstore_bytes=${CEPH_MEMSTORE_BYTES:-$((2 << 30))}
timeout_s=${CEPH_TIMEOUT:-90}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

install_packages() {
  local need=()
  command -v ceph-mon >/dev/null || need+=(ceph-mon)
  command -v ceph-osd >/dev/null || need+=(ceph-osd)
  command -v ceph >/dev/null || need+=(ceph-common)
  [ -e /usr/include/rbd/librbd.h ] || need+=(librbd-dev)
  [ -e /usr/include/rados/librados.h ] || need+=(librados-dev)
  if [ ${#need[@]} -eq 0 ]; then
    say "packages present"
    return
  fi
  local t0
  t0=$(now)
  say "installing ${need[*]} (apt, no recommends)"
  export DEBIAN_FRONTEND=noninteractive
  # Another apt may hold the lock on a shared machine: wait for it.
  apt-get -o DPkg::Lock::Timeout=300 update -qq || die "apt-get update"
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${need[@]}" \
    >"${TMPDIR:-/tmp}/ceph-cluster-apt.log" 2>&1 ||
    {
      tail -20 "${TMPDIR:-/tmp}/ceph-cluster-apt.log" >&2
      die "apt-get install ${need[*]}"
    }
  say "installed in $(since "$t0") s"
}

# PIDs of the daemons whose pid files are in DIR and that are still the
# ceph daemon that wrote them.
daemon_pids() {
  local f pid comm
  for f in "$dir"/osd.*.pid "$dir"/mon.*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    [[ $pid =~ ^[0-9]+$ ]] || continue
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    case $comm in ceph-mon | ceph-osd) echo "$pid" ;; esac
  done
}

ceph_() { timeout 30 ceph -c "$dir/ceph.conf" --connect-timeout 10 "$@"; }

up() {
  local t_all t0
  t_all=$(now)
  install_packages
  [ ! -e "$dir/ceph.conf" ] || die "$dir already holds a cluster; run '$0 down $dir' first"
  mkdir -p "$dir"/{run,log}
  dir=$(cd "$dir" && pwd)
  if (exec 3<>"/dev/tcp/127.0.0.1/$mon_port") 2>/dev/null; then
    die "port $mon_port is already in use (set CEPH_MON_PORT)"
  fi
  t0=$(now)
  local fsid osd_uuid
  fsid=$(cat /proc/sys/kernel/random/uuid)
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  say "writing $dir/ceph.conf (fsid $fsid, mon 127.0.0.1:$mon_port, OSD ports $osd_ports)"
  cat >"$dir/ceph.conf" <<EOF
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:$mon_port]
mon_initial_members = a
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_msgr1 = false
ms_bind_port_min = ${osd_ports%-*}
ms_bind_port_max = ${osd_ports#*-}
auth_cluster_required = $auth
auth_service_required = $auth
auth_client_required = $auth
run_dir = $dir/run
admin_socket = $dir/run/\$name.asok
[client]
# One socket per client process (ironsan, rbd, ceph): with one per name,
# every client.admin process after the first said "AdminSocket ... File exists".
admin_socket = $dir/run/\$name.\$pid.asok
[global]
pid_file = $dir/\$name.pid
log_file = $dir/log/\$name.log
keyring = $dir/keyring
mon_data = $dir/\$name
osd_data = $dir/\$name
osd_objectstore = memstore
memstore_device_bytes = $memstore_bytes
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
mon_warn_on_insecure_global_id_reclaim = false
mon_warn_on_insecure_global_id_reclaim_allowed = false
mon_data_avail_warn = 2
mon_data_avail_crit = 1
# No ceph-mgr here: do not warn about it.
mon_mgr_mkfs_grace = 100000000
# A PG's read lease lasts osd_heartbeat_grace x 0.8; a lone OSD paused past
# it finds its PGs "laggy" and, with no peer to renew the lease, never
# serves them again (Real clusters have peers). The tests pause the OSD
# 15 s; a CI machine once left PGs laggy after a 35 s pause with a 48 s
# lease, and the next cluster request waited for ever: 240 s of lease.
osd_heartbeat_grace = 300
# A client that died stops watching its images after this many seconds.
osd_client_watch_timeout = ${CEPH_WATCH_TIMEOUT:-30}
EOF
  say "creating the keys (authentication: $auth)"
  # The monitor imports every key of the keyring at --mkfs: its own, the
  # admin's and the OSD's.
  ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' \
    >/dev/null || die "ceph-authtool"
  ceph-authtool "$dir/keyring" --gen-key -n client.admin --cap mon 'allow *' \
    --cap osd 'allow *' --cap mgr 'allow *' >/dev/null || die "ceph-authtool"
  ceph-authtool "$dir/keyring" --gen-key -n osd.0 --cap mon 'allow profile osd' \
    --cap osd 'allow *' --cap mgr 'allow profile osd' >/dev/null || die "ceph-authtool"
  say "creating the monitor"
  monmaptool --create --addv a "[v2:127.0.0.1:$mon_port]" --fsid "$fsid" "$dir/monmap" \
    >/dev/null || die "monmaptool"
  ceph-mon -c "$dir/ceph.conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring" \
    || die "ceph-mon --mkfs (see $dir/log/mon.a.log)"
  say "starting ceph-mon"
  ceph-mon -c "$dir/ceph.conf" -i a || die "ceph-mon (see $dir/log/mon.a.log)"
  say "creating OSD 0 (memstore, $((memstore_bytes >> 20)) MiB)"
  local id
  id=$(ceph_ osd new "$osd_uuid") || die "ceph osd new (monitor not answering? see $dir/log/mon.a.log)"
  [ "$id" = 0 ] || die "ceph osd new returned id '$id', expected 0"
  mkdir -p "$dir/osd.0"
  ceph-osd -c "$dir/ceph.conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >"$dir/log/osd.0.mkfs.log" 2>&1 \
    || die "ceph-osd --mkfs (see $dir/log/osd.0.mkfs.log)"
  say "starting ceph-osd"
  ceph-osd -c "$dir/ceph.conf" -i 0 || die "ceph-osd (see $dir/log/osd.0.log)"
  local deadline=$((SECONDS + timeout_s))
  say "waiting for OSD 0 up and in (timeout ${timeout_s} s)"
  until ceph_ osd dump 2>/dev/null | grep -qE '^osd\.0 up +in'; do
    [ $SECONDS -lt $deadline ] || die "OSD 0 not up after ${timeout_s} s (see $dir/log/osd.0.log)"
    sleep 0.5
  done
  say "creating pool rbd"
  ceph_ osd pool create rbd 8 8 >/dev/null || die "ceph osd pool create rbd"
  timeout 60 rbd -c "$dir/ceph.conf" pool init rbd || die "rbd pool init rbd"
  say "waiting for pool rbd to serve I/O"
  echo ironsan >"$dir/probe"
  until timeout 10 rados -c "$dir/ceph.conf" -p rbd put ceph-cluster-probe "$dir/probe" 2>/dev/null &&
    timeout 10 rados -c "$dir/ceph.conf" -p rbd get ceph-cluster-probe "$dir/probe.back" 2>/dev/null &&
    cmp -s "$dir/probe" "$dir/probe.back"; do
    [ $SECONDS -lt $deadline ] || die "pool rbd does not serve I/O after ${timeout_s} s"
    sleep 0.5
  done
  rados -c "$dir/ceph.conf" -p rbd rm ceph-cluster-probe || die "rados rm"
  # The client a gateway should run as: what `rbd` needs on one pool, and
  # the monitor's blocklist command that fencing (lock break) uses, which
  # `profile rbd` grants (docs/GATEWAYS.md).
  ceph_ auth get-or-create client.ironsan mon 'profile rbd' osd 'profile rbd pool=rbd' \
    -o "$dir/client.ironsan.keyring" || die "ceph auth get-or-create client.ironsan"
  rm -f "$dir/probe" "$dir/probe.back"
  say "waiting for HEALTH_OK"
  local h
  until h=$(ceph_ health 2>&1) && [ "$h" = HEALTH_OK ]; do
    [ $SECONDS -lt $deadline ] || die "no HEALTH_OK after ${timeout_s} s: $(ceph_ health detail 2>&1)"
    sleep 0.5
  done
  say "cluster up in $(since "$t0") s (total $(since "$t_all") s, with install): HEALTH_OK"
  say "use: CEPH_CONF=$dir/ceph.conf  (stop: $0 down $dir)"
}

down() {
  if [ ! -d "$dir" ]; then
    say "$dir does not exist: nothing to stop"
    return
  fi
  [ -e "$dir/ceph.conf" ] || die "$dir holds no ceph.conf: not a cluster of this script, not removing it"
  local pids
  pids=$(daemon_pids)
  if [ -n "$pids" ]; then
    say "stopping PIDs" $pids
    # shellcheck disable=SC2086
    kill $pids 2>/dev/null || true
    local i
    for i in $(seq 100); do
      pids=$(daemon_pids)
      [ -n "$pids" ] || break
      sleep 0.1
    done
    if [ -n "$pids" ]; then
      say "still running after 10 s, SIGKILL" $pids
      # shellcheck disable=SC2086
      kill -9 $pids 2>/dev/null || true
      sleep 0.5
    fi
  fi
  say "removing $dir"
  rm -rf "$dir"
}

case $cmd in
up) up ;;
down) down ;;
*) usage ;;
esac
