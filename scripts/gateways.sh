#!/usr/bin/env bash
# Two ironsan gateways serving one RBD image as one LU (docs/GATEWAYS.md),
# on the cluster of $CEPH_CONF (scripts/rbd.sh starts one and calls this):
#
#   1. both gateways report the same LU; the first up owns the image
#      (active/optimized), the other is standby and refuses I/O (04/0B);
#   2. explicit failover: `ironsan bench --multipath --verify` writes over
#      both paths, the owner is killed (-9) mid-run; the bench activates
#      the standby gateway (SET TARGET PORT GROUPS) and must finish with no
#      error, and every block must read back right through the survivor;
#   3. implicit failover: the killed gateway restarts (standby: the
#      survivor owns the image), the survivor is killed; a plain libiscsi
#      client (no ALUA) is served by the restarted one within seconds, and
#      the data reads back right;
#   4. a resize made elsewhere (`rbd resize`, while A owns the image and B
#      is standby) reaches both: A reports the new capacity within
#      seconds, and so does B once A is killed and B has taken over;
#   5. a hung owner: the owner is stopped (SIGSTOP) for 15 s; a plain client
#      is served by the other within 10 s (it fences the owner and takes
#      over); the hung one, resumed, steps down by itself (REPORT TARGET
#      PORT GROUPS agrees on both paths), connects to the cluster again, and
#      takes over in its turn when the other is killed; the data written
#      before reads back right.
#
# Takeovers must take under 10 s at Ceph's default osd_client_watch_timeout
# (30 s): the owner's liveness is probed, not waited out.
#
#   scripts/gateways.sh [IRONSAN_BINARY]
#
# Environment: GW_PORT (first of two loopback ports, default 17270, below
# the test cluster's OSD ports); GW_KEEP=1 keeps the gateways' logs;
# IRONSAN_RBD_OPTS (the LUN's Ceph client options, see below).
# Prints "gateways: N passed, M failed"; exits non-zero on a failure.
set -uo pipefail

bin=${1:-${CARGO_TARGET_DIR:-target}/release/ironsan}
[ -n "${CEPH_CONF:-}" ] || {
  echo "gateways: set CEPH_CONF (scripts/rbd.sh does)" >&2
  exit 1
}
port_a=${GW_PORT:-17270}
# The gateways' Ceph client: IRONSAN_RBD_OPTS (e.g. ",ceph_client=ironsan,
# ceph_keyring=K"; scripts/rbd.sh sets it), else client.ironsan when the
# cluster directory has its keyring (scripts/ceph-cluster.sh makes one).
lun_opts=${IRONSAN_RBD_OPTS-}
k=$(dirname "$CEPH_CONF")/client.ironsan.keyring
if [ -z "$lun_opts" ] && [ -e "$k" ]; then
  lun_opts=",ceph_client=ironsan,ceph_keyring=$k"
fi
port_b=$((port_a + 1))
iqn=iqn.2026-12.io.ironsan:gateways
image=rbd/gateways
work=$(mktemp -d /tmp/ironsan-gw.XXXXXX)
url_a=iscsi://127.0.0.1:$port_a/$iqn/0
url_b=iscsi://127.0.0.1:$port_b/$iqn/0
pass=0
fail=0
pid_a=
pid_b=

say() { echo "gateways: $*" >&2; }
# No cluster command may hang the run (a cluster that stopped serving).
rbd() { timeout 120 rbd "$@"; }
step() { # NAME RESULT
  say "$1: $2"
  case $2 in
  pass*) pass=$((pass + 1)) ;;
  *) fail=$((fail + 1)) ;;
  esac
}
stop() { # PID...: SIGTERM, then 30 s to exit
  local i
  for p in "$@"; do
    [ -n "$p" ] || continue
    kill "$p" 2>/dev/null || continue
    for i in $(seq 300); do
      kill -0 "$p" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$p" 2>/dev/null; then
      kill -9 "$p" 2>/dev/null || true
      step "serve (PID $p) stops on SIGTERM" "fail (still running after 30 s: killed)"
    fi
    wait "$p" 2>/dev/null || true
  done
}
cleanup() {
  kill -CONT "$pid_a" "$pid_b" 2>/dev/null || true
  stop "$pid_a" "$pid_b"
  rbd rm "$image" >/dev/null 2>&1 || true
  if [ -n "${GW_KEEP:-}" ]; then
    say "logs kept in $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

# gateway NAME PORT GROUP FIRST_TAG PEER_GROUP PEER_TAG: starts one gateway,
# sets pid_NAME.
gateway() {
  local name=$1 port=$2
  "$bin" --log info serve --listen "127.0.0.1:$port" --target "$iqn" --lun "rbd:$image$lun_opts" \
    --gateway "$3:$4" --gateway-peer "$5=$6" >>"$work/$name.log" 2>&1 &
  local pid=$!
  eval "pid_$name=$pid"
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  tail -5 "$work/$name.log" >&2
  return 1
}

# served URL: whether a plain libiscsi client can use the LU through URL.
served() { iscsi-readcapacity16 "$1" >"$work/rc.txt" 2>&1; }

# since T0: seconds since T0 (date +%s.%N), one decimal.
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
# within10 SECONDS: whether a takeover took under 10 s.
within10() { awk -v t="$1" 'BEGIN { exit !(t < 10) }'; }

# wait_served URL: polls URL with a plain client (at most 30 s); sets took.
wait_served() {
  local t0 ok=
  t0=$(date +%s.%N)
  for _ in $(seq 120); do
    if served "$1"; then
      ok=1
      break
    fi
    sleep 0.25
  done
  took=$(since "$t0")
  [ -n "$ok" ]
}

# rtpg URL: the target port groups as REPORT TARGET PORT GROUPS through URL
# gives them (`ironsan inq`).
rtpg() { "$bin" inq "$1" 2>/dev/null | grep '^  group'; }

rbd create --size 256M "$image" || exit 1
gateway a "$port_a" 1 1 2 17 || exit 1
gateway b "$port_b" 2 17 1 1 || exit 1

say "1. one LU, A owns it"
"$bin" inq "$url_a" >"$work/inq_a.txt" 2>&1
"$bin" inq "$url_b" >"$work/inq_b.txt" 2>&1
naa_a=$(awk '/Device identifier/ { print $3 }' "$work/inq_a.txt")
naa_b=$(awk '/Device identifier/ { print $3 }' "$work/inq_b.txt")
# REPORT TARGET PORT GROUPS, as `ironsan inq` prints it, through each path.
grep '^  group' "$work/inq_a.txt" >"$work/rtpg_a.txt"
grep '^  group' "$work/inq_b.txt" >"$work/rtpg_b.txt"
cat "$work/inq_b.txt" >&2
if [ -n "$naa_a" ] && [ "$naa_a" = "$naa_b" ] && cmp -s "$work/rtpg_a.txt" "$work/rtpg_b.txt" &&
  grep -q 'group 1: active/optimized' "$work/rtpg_a.txt" &&
  grep -q 'group 2: standby' "$work/rtpg_a.txt" &&
  served "$url_a" && ! served "$url_b" && grep -q 0x040b "$work/rc.txt"; then
  step "same LU ($naa_a) and ALUA states on both paths, A active, B standby (04/0B)" pass
else
  cat "$work/inq_a.txt" "$work/rc.txt" >&2
  step "same LU, A active, B standby" "fail (NAA '$naa_a' vs '$naa_b')"
fi

say "2. explicit failover under a multipath --verify bench"
# Time-based, so the bench is still writing when the owner dies however fast
# this machine is (sequential writes wrap around the image); it must still
# have written every block once, for the read-back to check them all.
blocks=$((256 * 1024 / 16))
"$bin" --log warn bench --multipath lqd --rw write --bs 16k --iodepth 16 --verify --runtime 10 \
  "$url_a" "$url_b" >"$work/bench.txt" 2>&1 &
bench=$!
# Kill the owner once the bench has been writing for a while.
sleep 1.5
kill -9 "$pid_a"
wait "$pid_a" 2>/dev/null
pid_a=
if wait "$bench"; then
  id=$(grep -oE 'verify-id 0x[0-9a-f]+' "$work/bench.txt" | head -1 | cut -d' ' -f2)
  ios=$(grep -oE '[0-9]+ I/Os in' "$work/bench.txt" | head -1 | cut -d' ' -f1)
  cat "$work/bench.txt" >&2
  if [ "${ios:-0}" -lt "$blocks" ]; then
    step "bench across the owner's death" "fail (${ios:-no} I/Os, fewer than the image's $blocks blocks)"
    id=
  elif ! grep -qE 'failed: .*\[group 2 active/optimized\] \[retries [0-9]+, failovers [1-9]' \
    "$work/bench.txt"; then
    step "bench across the owner's death" "fail (no failover from A to B in the path stats)"
    id=
  elif [ -n "$id" ] &&
    "$bin" --log warn bench --rw read --bs 1m --iodepth 8 --verify --verify-id "$id" "$url_b" \
      >"$work/read.txt" 2>&1; then
    # The longest an I/O waited: the failover as the application saw it.
    stall=$(grep -oE 'clat \(usec\): .*max=[0-9.]+' "$work/bench.txt" | grep -oE 'max=[0-9.]+' |
      head -1 | cut -d= -f2)
    step "bench survived killing the owner (longest I/O $(awk -v u="${stall:-0}" 'BEGIN { printf "%.1f", u / 1e6 }') s), all blocks good through B" pass
  else
    tail -5 "$work/read.txt" >&2
    step "read back after explicit failover" fail
  fi
else
  tail -20 "$work/bench.txt" >&2
  step "bench across the owner's death" fail
  id=
fi

say "3. implicit failover (no ALUA in the client)"
gateway a "$port_a" 1 1 2 17 || exit 1
if served "$url_a"; then
  step "restarted A is standby while B owns the image" "fail (A served I/O)"
else
  step "restarted A is standby while B owns the image" pass
fi
kill -9 "$pid_b"
wait "$pid_b" 2>/dev/null
pid_b=
t0=$(date +%s.%N)
ok=
for _ in $(seq 60); do
  if served "$url_a"; then
    ok=1
    break
  fi
  sleep 0.25
done
took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if [ -n "$ok" ] && [ -n "$id" ] && within10 "$took" &&
  "$bin" --log warn bench --rw read --bs 1m --iodepth 8 --verify --verify-id "$id" "$url_a" \
    >"$work/read2.txt" 2>&1; then
  step "A took over ${took} s after B died (kill -9), all blocks good" pass
else
  cat "$work/rc.txt" "$work/read2.txt" 2>/dev/null | tail -5 >&2
  step "implicit take-over" "fail (after ${took} s)"
fi

say "4. a resize made elsewhere reaches every gateway"
gateway b "$port_b" 2 17 1 1 || exit 1
# capacity URL: the bytes READ CAPACITY reports (a standby gateway answers
# it too, as hosts size every path; `ironsan inq`'s TEST UNIT READYs, refused
# there, start B's take-over once A is gone).
capacity() { "$bin" inq "$1" 2>/dev/null | awk '/^Capacity:/ { print $2 }'; }
want=$((512 * 1024 * 1024))
if rbd resize --size 512M "$image" >"$work/resize.txt" 2>&1; then
  seen_a=
  for _ in $(seq 40); do
    seen_a=$(capacity "$url_a")
    [ "$seen_a" = "$want" ] && break
    sleep 0.25
  done
  kill -9 "$pid_a"
  wait "$pid_a" 2>/dev/null
  pid_a=
  seen_b=
  for _ in $(seq 80); do
    seen_b=$(capacity "$url_b")
    [ "$seen_b" = "$want" ] && break
    sleep 0.25
  done
  if [ "$seen_a" = "$want" ] && [ "$seen_b" = "$want" ]; then
    step "rbd resize to 512 MiB seen by the owner A, and by B after taking over" pass
  else
    step "resize made elsewhere" "fail (A reported ${seen_a:-nothing}, B after take-over ${seen_b:-nothing}; want $want)"
  fi
else
  cat "$work/resize.txt" >&2
  step "rbd resize" fail
fi

say "5. a hung owner (SIGSTOP) is fenced and taken over; resumed, it steps down"
gateway a "$port_a" 1 1 2 17 || exit 1
# One of them owns the image now (A, restarted, takes its dead former self's
# lock over at start); x is the owner, y the other.
x=
for _ in $(seq 120); do
  if served "$url_a"; then x=a; elif served "$url_b"; then x=b; fi
  [ -n "$x" ] && break
  sleep 0.25
done
if [ "$x" = a ]; then
  y=b url_x=$url_a url_y=$url_b pid_x=$pid_a grp_x=1 grp_y=2
else
  x=b y=a url_x=$url_b url_y=$url_a pid_x=$pid_b grp_x=2 grp_y=1
fi
id5=
if "$bin" --log warn bench --rw write --bs 64k --iodepth 8 --size 64M --verify "$url_x" \
  >"$work/write5.txt" 2>&1; then
  id5=$(grep -oE 'verify-id 0x[0-9a-f]+' "$work/write5.txt" | head -1 | cut -d' ' -f2)
fi
[ -n "$id5" ] || {
  tail -5 "$work/write5.txt" >&2
  step "write through the owner ${x^^}" fail
}
kill -STOP "$pid_x"
stopped=$(date +%s.%N)
if wait_served "$url_y" && within10 "$took"; then
  step "${y^^} took over ${took} s after ${x^^} hung (SIGSTOP)" pass
else
  cat "$work/rc.txt" >&2
  tail -5 "$work/$y.log" >&2
  step "take-over from a hung owner" "fail (${y^^} not serving after ${took} s)"
fi
# The owner stays stopped for 15 s in all.
rest=$(awk -v s="$(since "$stopped")" 'BEGIN { r = 15 - s; print (r > 0 ? r : 0) }')
sleep "$rest"
kill -CONT "$pid_x"
resumed=$(date +%s.%N)
agreed=
for _ in $(seq 40); do
  rx=$(rtpg "$url_x")
  ry=$(rtpg "$url_y")
  if [ -n "$rx" ] && [ "$rx" = "$ry" ] &&
    grep -q "group $grp_y: active/optimized" <<<"$rx" && grep -q "group $grp_x: standby" <<<"$rx"; then
    agreed=1
    break
  fi
  sleep 0.25
done
took=$(since "$resumed")
if [ -n "$agreed" ] && ! served "$url_x" && grep -q 'connected to the cluster again' "$work/$x.log"; then
  step "resumed ${x^^} stepped down and reconnected within ${took} s; both paths agree (${y^^} active/optimized, ${x^^} standby)" pass
else
  printf 'through %s:\n%s\nthrough %s:\n%s\n' "${x^^}" "$rx" "${y^^}" "$ry" >&2
  tail -8 "$work/$x.log" >&2
  step "resumed ${x^^} steps down" fail
fi
if [ "$y" = a ]; then kill -9 "$pid_a"; wait "$pid_a" 2>/dev/null; pid_a=; else kill -9 "$pid_b"; wait "$pid_b" 2>/dev/null; pid_b=; fi
if wait_served "$url_x" && within10 "$took" && [ -n "$id5" ] &&
  "$bin" --log warn bench --rw read --bs 1m --iodepth 8 --size 64M --verify --verify-id "$id5" \
    "$url_x" >"$work/read5.txt" 2>&1; then
  step "${x^^} took over again ${took} s after ${y^^} died, the data written before reads back right" pass
else
  cat "$work/rc.txt" "$work/read5.txt" 2>/dev/null | tail -5 >&2
  step "take-over by the resumed ${x^^}" "fail (after ${took} s)"
fi

say "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
