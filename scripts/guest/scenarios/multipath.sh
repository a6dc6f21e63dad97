# dm-multipath over both portals, configured with the device section
# `ironsan tune linux` prints (/etc/multipath/conf.d/, checked by
# `multipath -t` without a warning): fio with --verify on ext4 keeps
# running while portal 2 is removed and added back; the path fails, returns
# and carries I/O again. Then explicit ALUA: sg_stpg makes group 2 the
# active/optimized one and the kernel's path priorities follow.
step config
out=$(multipath -t 2>&1 >/dev/null)
if [ -z "$out" ]; then pass; else fail "multipath -t: $(echo "$out" | tr '\n' '|')"; fi
step login
a="node.session.timeo.replacement_timeout 5 node.conn[0].timeo.noop_out_interval 1 node.conn[0].timeo.noop_out_timeout 2"
login "$P0" $a >/dev/null && login "$P1" $a >/dev/null && pass || fail "login"
d0=$(wait_lun "$P0" 0 20); d1=$(wait_lun "$P1" 0 20)
info "paths: $d0 $d1"
step map
# The map's name is the recipe's alias.
multipath_up 'active ready running'
step mkfs
mkdir -p /mnt/m
mkfs.ext4 -q -F "$mp" && mount "$mp" /mnt/m && pass || fail mkfs
step portal-removed-under-load
stats() { for d in $d0 $d1; do awk '{print $1 + $5}' /sys/block/${d#/dev/}/stat; done | tr '\n' ' '; }
fio --eta=never --name=mp --directory=/mnt/m --size=96M --rw=randrw --bs=16k --ioengine=libaio \
  --iodepth=8 --direct=1 --runtime=75 --time_based --verify=crc32c --do_verify=1 \
  --verify_fatal=1 --output=/tmp/fio.out 2>/tmp/fio.err &
fio_pid=$!
sleep 4
s0=$(stats)
p1=$(host port 1 | cut -d' ' -f2)
ans=$(host admin remove-portal "$p1")
info "remove-portal $p1: $ans"
i=0; while ! multipath -ll 2>/dev/null | grep -q 'failed' && [ $i -lt 100 ]; do sleep 0.2; i=$((i + 1)); done
info "after removal ($((i / 5)) s): $(multipath -ll 2>&1 | tr '\n' '|')"
s1=$(stats)
sleep 4
s2=$(stats)
ans=$(host admin add-portal "$p1")
info "add-portal $p1: $ans"
i=0; while [ "$(multipath -ll 2>/dev/null | grep -c 'active ready running')" != 2 ] && [ $i -lt 150 ]; do sleep 0.2; i=$((i + 1)); done
info "path back after $((i / 5)) s: $(multipath -ll 2>&1 | tr '\n' '|')"
info "sessions: $(iscsiadm -m session -P1 2>&1 | grep -E 'Portal|State' | tr '\n' '|')"
info "iscsid: $(tail -25 /tmp/iscsid.log | tr '\n' '|')"
s3=$(stats)
sleep 4
s4=$(stats)
wait $fio_pid
rc=$?
info "I/Os per path (reads+writes) at start, removed, +4 s, returned, +4 s: [$s0] [$s1] [$s2] [$s3] [$s4]"
set -- $s1; a1=$1 b1=$2; set -- $s2; a2=$1 b2=$2; set -- $s3; a3=$1 b3=$2; set -- $s4; a4=$1 b4=$2
if [ $rc -ne 0 ]; then fail "fio: $(tail -5 /tmp/fio.err /tmp/fio.out | tr '\n' '|')"
elif [ $a2 -le $a1 ]; then fail "no I/O on the remaining path while the other was gone"
elif [ $(( (b4 - b3) * 4 )) -lt $(( a4 - a3 )) ]; then
  fail "the returned path carries too little I/O: $((b4 - b3)) against $((a4 - a3))"
else pass; fi
step explicit-alua
g1=$(sg_rtpg -d $d0 2>/dev/null | sed -n 's/.*target port group id : 0x\([0-9a-f]*\).*/\1/p' | head -1)
info "before: $(sg_rtpg -d $d0 2>&1 | grep -E 'group id|access state' | tr '\n' '|')"
# Group 2 active/optimized, group 1 active/non-optimized.
out=$(sg_stpg -v --tp=2,1 --state=0,1 $d0 2>&1)
info "sg_stpg: $(echo "$out" | tr '\n' '|')"
# The priority of the path group a path is in, from multipath -ll.
group_prio() {
  multipath -ll 2>/dev/null | awk -v d="$1" '
    /prio=/ { for (i = 1; i <= NF; i++) if ($i ~ /^prio=/) { p = substr($i, 6) } }
    $0 ~ (" " d " ") { print p; exit }'
}
# multipathd re-reads the priorities every polling interval and regroups.
i=0
while [ $i -lt 30 ]; do
  p0=$(group_prio ${d0#/dev/}); p1=$(group_prio ${d1#/dev/})
  [ "${p1:-0}" -gt "${p0:-0}" ] && break
  sleep 0.5; i=$((i + 1))
done
st0=$(cat /sys/block/${d0#/dev/}/device/access_state)
st1=$(cat /sys/block/${d1#/dev/}/device/access_state)
info "after sg_stpg: $d0 $st0, $d1 $st1; $(multipath -ll 2>&1 | tr '\n' '|')"
if [ "$st0" = "active/non-optimized" ] && [ "$st1" = "active/optimized" ] && [ "${p1:-0}" -gt "${p0:-0}" ]; then pass
else fail "kernel shows $d0 $st0 (group prio $p0), $d1 $st1 (group prio $p1)"; fi
step umount
check umount /mnt/m
step fsck
check e2fsck -fn "$mp"
step kernel-clean
check kernel_clean_above_paths
info "path errors (expected while a portal is gone): $(dmesg | grep -cE 'rejecting I/O|I/O error, dev sd')"
