# ext4 on LUN 0 and xfs on LUN 1: mkfs, ~300 MiB of files checked by fio's
# verify and md5, fstrim (the backing file's allocated bytes shrink, asked
# of the host), umount, fsck clean, logout and login, remount, verify again.
step login
check login "$P0"
dd if=/dev/urandom of=/tmp/sample bs=1M count=8 2>/dev/null
sum0=$(md5sum < /tmp/sample)
for fs in ext4 xfs; do
  case $fs in ext4) lun=0 mkfs="mkfs.ext4 -q -F" fsck="e2fsck -fn" ;;
              xfs) lun=1 mkfs="mkfs.xfs -q -f" fsck="xfs_repair -n" ;; esac
  d=$(wait_lun "$P0" $lun 20) || { step "$fs"; fail "no disk for LUN $lun"; continue; }
  eval "dev_$fs=$d"
  step "$fs-mkfs"
  check $mkfs "$d"
  step "$fs-mount"
  mkdir -p /mnt/$fs
  check mount -t $fs "$d" /mnt/$fs
  step "$fs-files"
  # 18 x 16 MiB written with a checksum in every block, then read back and
  # checked; plus an md5-summed file.
  check fio --eta=never --name=fill --directory=/mnt/$fs --nrfiles=18 --filesize=16M --bs=256k \
    --rw=write --ioengine=psync --verify=crc32c --do_verify=1 --fsync_on_close=1 --output=/dev/null
  step "$fs-md5"
  cp /tmp/sample /mnt/$fs/sample && sync
  echo 3 > /proc/sys/vm/drop_caches
  if [ "$(md5sum < /mnt/$fs/sample)" = "$sum0" ]; then pass; else fail "md5 differs"; fi
  step "$fs-fstrim"
  # 96 MiB written and removed again: fstrim must give it back.
  for i in 1 2 3 4 5 6 7 8 9 10 11 12; do cp /tmp/sample /mnt/$fs/junk$i; done
  sync
  before=$(host allocated $lun | cut -d' ' -f2)
  rm -f /mnt/$fs/junk*
  sync
  out=$(fstrim -v /mnt/$fs 2>&1)
  after=$(host allocated $lun | cut -d' ' -f2)
  info "$fs fstrim: $out; backing file allocated $before -> $after bytes"
  if [ -n "$after" ] && [ "$after" -le $(( before - 64 * 1024 * 1024 )) ]; then pass
  else fail "allocated $before -> $after after removing 96 MiB ($out)"; fi
  step "$fs-umount"
  check umount /mnt/$fs
  step "$fs-fsck"
  check $fsck "$d"
done
step relogin
logout "$P0" >/dev/null && login "$P0" >/dev/null && pass || fail "logout/login"
for fs in ext4 xfs; do
  case $fs in ext4) lun=0 ;; xfs) lun=1 ;; esac
  step "$fs-remount"
  d=$(wait_lun "$P0" $lun 20) && mount -t $fs "$d" /mnt/$fs && pass || fail "remount $d"
  step "$fs-verify"
  if [ "$(md5sum < /mnt/$fs/sample)" = "$sum0" ] && fio --eta=never --name=fill --directory=/mnt/$fs \
       --nrfiles=18 --filesize=16M --bs=256k --rw=write --ioengine=psync --verify=crc32c \
       --verify_only=1 --output=/dev/null --allow_file_create=0 2>/tmp/err; then pass
  else fail "data differs after remount: $(tail -3 /tmp/err | tr '\n' '|')"; fi
  umount /mnt/$fs
done
step kernel-clean
check kernel_clean
logout "$P0" >/dev/null
