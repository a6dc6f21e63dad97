# kill -9 of the target while the host writes and fsyncs files on ext4
# (a write-through file LU), restarted 2 s later: the session recovers
# within the replacement timeout, every file whose fsync returned is intact,
# fsck is clean, the kernel logged no I/O error.
step login
check login "$P0" node.session.timeo.replacement_timeout 30 \
  node.conn[0].timeo.noop_out_interval 2 node.conn[0].timeo.noop_out_timeout 2
d=$(wait_lun "$P0" 0 20) || fail "no disk"
step mkfs
mkdir -p /mnt/r
mkfs.ext4 -q -F "$d" && mount "$d" /mnt/r && pass || fail "mkfs/mount"
head -c 1048576 /dev/urandom > /tmp/one
sum=$(md5sum < /tmp/one)
step writes-across-restart
: > /tmp/acked
(
  i=0
  while [ $i -lt 80 ]; do
    i=$((i + 1))
    dd if=/tmp/one of=/mnt/r/f$i bs=1M conv=fsync 2>/dev/null || { echo "dd f$i failed" > /tmp/werr; exit 1; }
    echo "$i $(now_ms)" >> /tmp/acked
  done
) &
w=$!
sleep 3
t_kill=$(now_ms)
host kill >/dev/null
sleep 2
host start >/dev/null
t_start=$(now_ms)
wait $w
rc=$?
# The longest pause between two fsynced files is the outage the host saw.
gap=$(awk 'NR>1 && $2-p>g {g=$2-p} {p=$2} END {print g+0}' /tmp/acked)
info "target killed at ${t_kill} ms, started again at ${t_start} ms; longest pause between fsynced files ${gap} ms; $(dmesg | grep -iE 'conn error|recover' | head -3 | tr '\n' '|')"
if [ $rc -eq 0 ] && [ "$(wc -l < /tmp/acked)" -eq 80 ]; then pass; else fail "writer: $(cat /tmp/werr 2>/dev/null)"; fi
step acked-data
umount /mnt/r && mount "$d" /mnt/r
echo 3 > /proc/sys/vm/drop_caches
bad=0
for i in $(cut -d' ' -f1 /tmp/acked); do
  [ "$(md5sum < /mnt/r/f$i)" = "$sum" ] || bad=$((bad + 1))
done
if [ $bad -eq 0 ]; then pass; else fail "$bad fsynced files differ"; fi
step fsck
umount /mnt/r
check e2fsck -fn "$d"
step kernel-clean
check kernel_clean
logout "$P0" >/dev/null
