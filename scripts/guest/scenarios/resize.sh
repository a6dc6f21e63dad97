# `ironsan admin resize-lun` while the host writes: the kernel hears
# CAPACITY DATA HAS CHANGED, sees the new size after a session rescan
# (`iscsiadm -m session -R`, what udev-less hosts and ESXi's rescan do),
# resize2fs grows the mounted file system, no I/O fails.
step login
check login "$P0"
d=$(wait_lun "$P0" 0 20) || { fail "no disk"; }
n=${d#/dev/}
step mkfs
mkdir -p /mnt/r
mkfs.ext4 -q -F "$d" && mount "$d" /mnt/r && pass || fail "mkfs/mount"
step resize-during-io
fio --eta=never --name=bg --directory=/mnt/r --size=64M --rw=randwrite --bs=16k --ioengine=psync \
  --runtime=12 --time_based --verify=crc32c --do_verify=1 --output=/tmp/fio.out 2>/tmp/fio.err &
bg=$!
sleep 3
ans=$(host admin resize-lun "$IQN" 0 512M)
info "resize-lun: $ans"
i=0
while ! dmesg | grep -qi "capacity data has changed" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
info "kernel: $(dmesg | grep -i 'capacity' | tail -3 | tr '\n' '|')"
iscsiadm -m session -R >/dev/null
wait $bg
fio_rc=$?
size=$(( $(cat /sys/block/$n/size) * 512 ))
info "size after rescan: $size bytes; $(dmesg | grep -i 'detected capacity change' | tail -1)"
if [ $fio_rc -ne 0 ]; then fail "I/O during the resize failed: $(tail -3 /tmp/fio.err | tr '\n' '|')"
elif [ "$size" != $((512 * 1024 * 1024)) ]; then fail "the kernel sees $size bytes, not 512 MiB"
elif ! echo "$ans" | grep -q '^OK'; then fail "resize-lun: $ans"
else pass; fi
step resize2fs
before=$(df -k /mnt/r | awk 'NR==2{print $2}')
out=$(resize2fs "$d" 2>&1)
after=$(df -k /mnt/r | awk 'NR==2{print $2}')
info "resize2fs: ${before} -> ${after} KiB"
if [ "$after" -gt $(( before + 200000 )) ]; then pass; else fail "$before -> $after KiB: $out"; fi
step fsck
umount /mnt/r
check e2fsck -fn "$d"
step kernel-clean
check kernel_clean
logout "$P0" >/dev/null
