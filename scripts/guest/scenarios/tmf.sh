# Task management from the kernel's SCSI error handler: with a 4 s command
# timeout, a LU made slow (16 s per I/O, the test build's delay) makes a
# write time out (libiscsi gives it two more periods: one for the data it
# moved, one to ping the connection); the kernel sends ABORT TASK; ironsan
# answers once
# nothing of the aborted writes can reach the medium; the LU is fast again
# and the kernel's retries complete; again with an abort timeout shorter than
# the write, where the kernel drops the connection and logs in again with
# the aborted write still in the backend. Then sg_reset -d
# in the middle of fio with --verify. No I/O error, every block checked.
step login
check login "$P0" node.session.timeo.replacement_timeout 60 \
  node.session.err_timeo.abort_timeout 20 node.session.err_timeo.lu_reset_timeout 30
d=$(wait_lun "$P0" 0 20) || fail "no disk"
n=${d#/dev/}
echo 4 > /sys/block/$n/device/timeout
head -c 4194304 /dev/urandom > /tmp/pat
sum=$(md5sum < /tmp/pat)
# `slow_write MS MIB`: 4 MiB of /tmp/pat written at MIB MiB while the LU
# takes MS per I/O (fast again after 8 s); sets rc, took (ms) and back (the
# md5 read back).
slow_write() {
  host slow 0 "$1" >/dev/null
  t0=$(now_ms)
  dd if=/tmp/pat of="$d" bs=1M count=4 seek="$2" oflag=direct 2>/tmp/dd.err &
  w=$!
  sleep 8
  host slow 0 0 >/dev/null
  wait $w
  rc=$?
  took=$(( $(now_ms) - t0 ))
  back=$(dd if="$d" bs=1M count=4 skip="$2" iflag=direct 2>/dev/null | md5sum)
}
step abort-on-timeout
slow_write 16000 0
aborts=$(host log "function=AbortTask" | cut -d' ' -f2)
resets=$(host log "function=LogicalUnitReset" | cut -d' ' -f2)
info "slow writes took $took ms; target saw $aborts ABORT TASK, $resets LUN RESET; kernel: $(dmesg | grep -iE 'abort|reset|timing out|timed out' | tail -5 | tr '\n' '|')"
if [ $rc -ne 0 ]; then fail "the write failed: $(cat /tmp/dd.err | tr '\n' '|')"
elif [ "${aborts:-0}" -eq 0 ] && [ "${resets:-0}" -eq 0 ]; then fail "no task management reached the target"
elif [ "$back" != "$sum" ]; then fail "data read back differs"
else pass; fi
step abort-timeout-recovery
# An abort not answered within the abort timeout (3 s here, the write takes
# 24 s): Linux's iSCSI layer fails the connection and logs in again
# (session reinstatement) while the aborted write is still in ironsan's
# backend; the kernel sends the write again on the new connection, and the
# data holds.
logout "$P0" >/dev/null
iscsiadm -m node -T "$IQN" -p "$P0" -o update -n node.session.err_timeo.abort_timeout -v 3
iscsiadm -m node -T "$IQN" -p "$P0" -l >/dev/null
d=$(wait_lun "$P0" 0 20) || fail "no disk after login"
n=${d#/dev/}
echo 4 > /sys/block/$n/device/timeout
before=$(host log "function=AbortTask" | cut -d' ' -f2)
logins=$(host log "server::conn: login" | cut -d' ' -f2)
slow_write 24000 8
aborts=$(host log "function=AbortTask" | cut -d' ' -f2)
logins2=$(host log "server::conn: login" | cut -d' ' -f2)
info "abort timeout: the writes took $took ms; ABORT TASKs at the target $before -> $aborts, logins $logins -> $logins2; kernel: $(dmesg | grep -iE 'abort|reset|conn error|recover' | tail -4 | tr '\n' '|')"
if [ $rc -ne 0 ]; then fail "the write failed: $(cat /tmp/dd.err | tr '\n' '|')"
elif [ "${aborts:-0}" -le "${before:-0}" ]; then fail "no ABORT TASK reached the target"
elif [ "${logins2:-0}" -le "${logins:-0}" ]; then fail "the kernel did not log in again"
elif [ "$back" != "$sum" ]; then fail "data read back differs"
else pass; fi
step lun-reset-during-fio
fio --eta=never --name=r --filename="$d" --rw=randwrite --bs=16k --size=64M --offset=64M \
  --ioengine=libaio --iodepth=16 --direct=1 --runtime=12 --time_based --verify=crc32c \
  --do_verify=1 --verify_fatal=1 --output=/tmp/fio.out 2>/tmp/fio.err &
f=$!
sleep 3
r1=$(sg_reset -d "$d" 2>&1; echo "rc=$?")
sleep 2
r2=$(sg_reset -d "$d" 2>&1; echo "rc=$?")
wait $f
rc=$?
resets=$(host log "function=LogicalUnitReset" | cut -d' ' -f2)
info "sg_reset -d: $r1 / $r2; target saw $resets LUN RESET in all; kernel: $(dmesg | grep -iE 'reset' | tail -3 | tr '\n' '|')"
if [ $rc -ne 0 ]; then fail "fio: $(tail -5 /tmp/fio.err | tr '\n' '|')"
elif ! echo "$r1$r2" | grep -q "rc=0"; then fail "sg_reset: $r1 $r2"
else pass; fi
step kernel-clean
check kernel_clean
logout "$P0" >/dev/null
