# Native NVMe multipath (nvme_core multipath=Y: one head device, a hidden
# path per controller) over ironsan's two NVMe/TCP ports, iopolicy
# round-robin, fio --verify on the head's raw device (random 16 KiB writes
# over 128 MiB, each batch read back and checked: verify_backlog) while:
#  (a) ALUA group 2, and so the ANA state of the namespace through port 2,
#      is made standby with `ironsan admin set-alua` (the host gets an ANA
#      change notice, re-reads the ANA log: the path is inaccessible) and
#      then active-optimized again;
#  (b) port 1 is taken away: the harness closes its connection and closes
#      every new one at once (run.py nvme-cut), then gives it back.
# Both paths carry I/O before, only the remaining one while the other is
# inaccessible or gone, both again after; fio ends without an error;
# nothing above the paths logged an error. `nvme list-subsys` at each
# stage, the ANA states and the kernel's nvme messages are INFO lines.
. /nvme-lib.sh
# Random writes the kernel may still have in flight on a path when its
# state changes (fio's iodepth): at most this many completions are
# counted on a path after it stopped being used.
IODEPTH=8

step modprobe
check modprobe nvme-tcp
step native-multipath
mpath=$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)
info "nvme_core multipath=$mpath; host $(cat /etc/nvme/hostnqn)"
if [ "$mpath" = Y ]; then pass; else fail "nvme_core multipath=$mpath: no native multipath"; fi

step connect-both
# reconnect-delay 2 s: a path that comes back is tried again soon.
o0=$(connect "$NVME_ADDR0" "$NVME_PORT0" --reconnect-delay=2 --ctrl-loss-tmo=120 2>&1); r0=$?
o1=$(connect "$NVME_ADDR1" "$NVME_PORT1" --reconnect-delay=2 --ctrl-loss-tmo=120 2>&1); r1=$?
d=""
[ $r0 -ne 0 ] || [ $r1 -ne 0 ] || ! wait_ctrls 2 30 || d=$(wait_ns 30)
c0=$(ctrl_at "$NVME_ADDR0"); c1=$(ctrl_at "$NVME_ADDR1")
if [ -z "$d" ] || [ -z "$c0" ] || [ -z "$c1" ] || [ "$(nvme_ctrls | wc -l)" -ne 2 ]; then
  fail "exit $r0/$r1, controllers [$(nvme_ctrls | tr '\n' ' ')], head [$d]: $(echo "$o0 $o1" | tail -3 | tr '\n' '|') $(dmesg | grep -i nvme | tail -5 | tr '\n' '|')"
  nvme_dmesg
  disconnect >/dev/null 2>&1
  return 0 2>/dev/null || exit 0
fi
pass
sub=$(subsys_dir); p0=$(path_of $c0); p1=$(path_of $c1)
info "head $d; port 1 ($NVME_ADDR0) $c0 path ${p0##*/}; port 2 ($NVME_ADDR1) $c1 path ${p1##*/}; ${sub##*/}"
info "$c0: $(for k in state kato ctrl_loss_tmo reconnect_delay cntlid; do printf '%s=%s ' $k "$(cat /sys/class/nvme/$c0/$k 2>/dev/null)"; done)"

step iopolicy
echo round-robin > "$sub/iopolicy" 2>/dev/null
pol=$(cat "$sub/iopolicy")
if [ "$pol" = round-robin ]; then pass; else fail "iopolicy $pol"; fi

step ana-initial
show "list-subsys" nvme list-subsys "$d"
a0=$(ana_of $c0); a1=$(ana_of $c1)
info "ANA states: $c0 $a0 (group $(cat $p0/ana_grpid 2>/dev/null)), $c1 $a1 (group $(cat $p1/ana_grpid 2>/dev/null))"
if [ "$a0" = optimized ] && [ "$a1" = optimized ]; then pass
else fail "ANA states $a0 / $a1, want optimized / optimized"; fi

# The per-path counters: "I/Os through port 1, port 2".
ios() { echo "$(ios_of $c0) $(ios_of $c1)"; }
# `delta BEFORE AFTER N`: what path N (1 or 2) completed between them.
delta() { set -- $1 $2 $3; case $5 in 1) echo $(( $3 - $1 )) ;; 2) echo $(( $4 - $2 )) ;; esac; }

# 45 s is enough for what follows (about 30 s here, under TCG) with room.
fio --eta=never --name=mpath --filename="$d" --rw=randwrite --bs=16k --size=128M \
  --ioengine=libaio --iodepth=$IODEPTH --direct=1 --runtime=45 --time_based \
  --verify=crc32c --verify_backlog=256 --verify_fatal=1 --output=/tmp/fio.out 2>/tmp/fio.err &
fio_pid=$!
t_fio=$(now_ms)
s_start=$(ios)

step both-paths-carry
sleep 5
s=$(ios)
info "I/Os per path (port 1, port 2) at fio's start and 5 s later: [$s_start] [$s]"
if ! kill -0 $fio_pid 2>/dev/null; then fail "fio ended early: $(cat /tmp/fio.err /tmp/fio.out | tail -5 | tr '\n' '|')"
elif [ "$(delta "$s_start" "$s" 1)" -le 0 ] || [ "$(delta "$s_start" "$s" 2)" -le 0 ]; then
  fail "round-robin used one path only: [$s_start] [$s]"
else pass; fi

# (a) port 2's ANA group standby, then active-optimized again.
step ana-standby
trace_errors_on
ans=$(host admin set-alua 2 standby)
info "set-alua 2 standby: $ans"
p2_inaccessible() { [ "$(ana_of $c1)" = inaccessible ]; }
if wait_until 20 p2_inaccessible; then
  info "port 2's path inaccessible ${waited} ms after set-alua"
  seen=1
else seen=0; fi
show "list-subsys (group 2 standby)" nvme list-subsys "$d"
trace_errors_dump standby
sa=$(ios); sleep 5; sb=$(ios)
n1=$(delta "$sa" "$sb" 1); n2=$(delta "$sa" "$sb" 2)
info "ANA $c0 $(ana_of $c0), $c1 $(ana_of $c1); I/Os per path over 5 s while standby: port 1 $n1, port 2 $n2"
if [ $seen = 0 ]; then fail "port 2's path is $(ana_of $c1) 20 s after set-alua 2 standby ($ans)"
elif [ "$(ana_of $c0)" != optimized ]; then fail "port 1's path is $(ana_of $c0)"
elif [ "$n1" -le 0 ]; then fail "port 1 carried no I/O while port 2 was standby"
elif [ "$n2" -gt $IODEPTH ]; then fail "port 2 (inaccessible) completed $n2 I/Os"
else pass; fi

step ana-active-again
ans=$(host admin set-alua 2 active-optimized)
info "set-alua 2 active-optimized: $ans"
p2_optimized() { [ "$(ana_of $c1)" = optimized ]; }
if wait_until 20 p2_optimized; then info "port 2's path optimized ${waited} ms after set-alua"; seen=1; else seen=0; fi
trace_errors_dump active-optimized
sa=$(ios); sleep 4; sb=$(ios)
n1=$(delta "$sa" "$sb" 1); n2=$(delta "$sa" "$sb" 2)
show "list-subsys (group 2 active-optimized)" nvme list-subsys "$d"
info "I/Os per path over 4 s after: port 1 $n1, port 2 $n2"
if [ $seen = 0 ]; then fail "port 2's path is $(ana_of $c1) 20 s after set-alua 2 active-optimized ($ans)"
elif [ "$n1" -le 0 ] || [ "$n2" -le 0 ]; then fail "a path carried no I/O: port 1 $n1, port 2 $n2"
else pass; fi

# (b) port 1 taken away: `ironsan admin` cannot remove an NVMe/TCP port
# (remove-portal knows iSCSI portals only), so the harness does it.
a=$(host nvme-port 0 | cut -d' ' -f2)
info "ironsan admin remove-portal $a (NVMe/TCP port 1), for the record: $(host admin remove-portal "$a")"
step port1-gone
inf="$(cat $p0/inflight | tr -s ' ')"
ans=$(host nvme-cut 0)
info "nvme-cut 0: $ans; in flight on port 1's path (reads, writes) just before: $inf"
p1_down() { [ "$(ctrl_state $c0)" != live ]; }
if wait_until 20 p1_down; then info "$c0 $(ctrl_state $c0) ${waited} ms after the cut"; seen=1; else seen=0; fi
sa=$(ios); sleep 6; sb=$(ios)
n1=$(delta "$sa" "$sb" 1); n2=$(delta "$sa" "$sb" 2)
show "list-subsys (port 1 gone)" nvme list-subsys "$d"
trace_errors_dump port-1-gone
info "$c0 $(ctrl_state $c0), $c1 $(ctrl_state $c1); I/Os per path over 6 s: port 1 $n1, port 2 $n2"
if [ $seen = 0 ]; then fail "$c0 still $(ctrl_state $c0) 20 s after port 1 was cut ($ans)"
elif [ "$n2" -le 0 ]; then fail "port 2 carried no I/O while port 1 was gone"
elif [ "$n1" -gt $IODEPTH ]; then fail "port 1 (gone) completed $n1 I/Os"
elif ! kill -0 $fio_pid 2>/dev/null; then fail "fio ended while port 1 was gone: $(tail -5 /tmp/fio.err | tr '\n' '|')"
else pass; fi

step port1-back
ans=$(host nvme-restore 0)
p1_back() { [ "$(ctrl_state $c0)" = live ] && [ "$(ana_of $c0)" = optimized ]; }
if wait_until 30 p1_back; then info "$c0 live and optimized ${waited} ms after port 1 was given back"; seen=1; else seen=0; fi
sa=$(ios); sleep 4; sb=$(ios)
n1=$(delta "$sa" "$sb" 1); n2=$(delta "$sa" "$sb" 2)
show "list-subsys (port 1 back)" nvme list-subsys "$d"
trace_errors_dump port-1-back
trace_errors_off
info "I/Os per path over 4 s after: port 1 $n1, port 2 $n2; fio at $(( ($(now_ms) - t_fio) / 1000 )) s of 45"
if [ $seen = 0 ]; then fail "$c0 $(ctrl_state $c0) / $(ana_of $c0) 30 s after port 1 was given back"
elif [ "$n1" -le 0 ] || [ "$n2" -le 0 ]; then fail "a path carried no I/O: port 1 $n1, port 2 $n2"
else pass; fi

step fio-verify
fio_wait $fio_pid 120
rc=$?
info "fio: $(fio_summary /tmp/fio.out)"
reads=$(sed -n 's/.*READ:.*io=\([0-9.]*[KMG]i*B\).*/\1/p' /tmp/fio.out | head -1)
if [ $rc -ne 0 ]; then fail "fio exit $rc: $(cat /tmp/fio.err | tail -5 | tr '\n' '|') $(fio_summary /tmp/fio.out)"
elif grep -qiE "verify: bad|bad magic|crc32c: verify failed|err= *[1-9]" /tmp/fio.out /tmp/fio.err; then
  fail "verify errors: $(fio_summary /tmp/fio.out)"
elif [ -z "$reads" ]; then fail "fio read nothing back (no verification): $(fio_summary /tmp/fio.out)"
else pass; fi

step kernel-clean
check nvme_clean_above_paths
info "path-level messages (expected while a port is gone): $(dmesg | grep -cE 'nvme[0-9]+: (Reconnecting|failed to connect|Failed reconnect|starting error recovery)')"

step disconnect
out=$(disconnect 2>&1)
if wait_ctrls 0 20; then pass; else fail "$out; left: $(nvme_ctrls | tr '\n' ' ')"; fi
nvme_dmesg
