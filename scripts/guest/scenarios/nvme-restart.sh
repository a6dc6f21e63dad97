# kill -9 of ironsan under NVMe/TCP I/O, started again 3 s later: the
# kernel's host (one path, ctrl-loss-tmo 120 s, reconnect-delay 1 s) holds
# the I/O (native multipath: the head queues while its only controller
# reconnects), reconnects by itself, and fio --verify (random 16 KiB
# writes over 128 MiB of the raw namespace, each batch read back and
# checked) ends without an error. 32 MiB written and verified before the
# kill verify again after it: the file LUN kept them. The kernel's nvme
# messages (error recovery, reconnect attempts) are INFO lines.
. /nvme-lib.sh

step modprobe
check modprobe nvme-tcp
step connect
out=$(connect "$NVME_ADDR0" "$NVME_PORT0" --ctrl-loss-tmo=120 --reconnect-delay=1 2>&1); rc=$?
d=""; [ $rc -ne 0 ] || d=$(wait_ns 30)
c=$(nvme_ctrls | head -1)
if [ -z "$d" ] || [ -z "$c" ]; then
  fail "exit $rc, no namespace $NVME_NSID: $(echo "$out" | tail -3 | tr '\n' '|') $(dmesg | grep -i nvme | tail -5 | tr '\n' '|')"
  nvme_dmesg
  return 0 2>/dev/null || exit 0
fi
pass
info "$d through $c: $(for k in state kato ctrl_loss_tmo reconnect_delay fast_io_fail_tmo cntlid; do printf '%s=%s ' $k "$(cat /sys/class/nvme/$c/$k 2>/dev/null)"; done); multipath=$(cat /sys/module/nvme_core/parameters/multipath)"
info "identity before: $(for k in nguid eui wwid; do printf '%s=%s ' $k "$(cat /sys/block/${d#/dev/}/$k 2>/dev/null)"; done)"

# The region written before the kill and checked after: the same job
# (name, offsets, sizes, seed) with --verify_only reads and checks it.
before() {
  fio --eta=never --name=before --filename="$d" --rw=write --bs=64k --offset=0 --size=32M \
    --ioengine=libaio --iodepth=4 --direct=1 --verify=crc32c --verify_fatal=1 "$@" \
    --output=/tmp/before.out 2>/tmp/before.err
}
step write-before
if before --do_verify=1; then pass; else fail "$(tail -3 /tmp/before.err | tr '\n' '|') $(fio_summary /tmp/before.out)"; fi

step restart-under-io
fio --eta=never --name=across --filename="$d" --rw=randwrite --bs=16k --offset=32M --size=128M \
  --ioengine=libaio --iodepth=8 --direct=1 --runtime=30 --time_based \
  --verify=crc32c --verify_backlog=256 --verify_fatal=1 --output=/tmp/fio.out 2>/tmp/fio.err &
fio_pid=$!
sleep 6
w0=$(ios_of $c)
trace_errors_on
t_kill=$(now_ms)
k=$(host kill)
# The kernel sees the connection end (ironsan's sockets closed by its
# death): error recovery, reconnect attempts every second, refused.
down() { [ "$(ctrl_state $c)" != live ]; }
wait_until 10 down && st_down="$(ctrl_state $c) after ${waited} ms" || st_down="still $(ctrl_state $c) after ${waited} ms"
wd=$(ios_of $c)
sleep 3
t_start=$(now_ms)
s=$(host start)
up() { [ "$(ctrl_state $c)" = live ]; }
if wait_until 60 up; then back=$(( $(now_ms) - t_start )); else back=""; fi
w1=$(ios_of $c)
trace_errors_dump restart
trace_errors_off
sleep 3
w2=$(ios_of $c)
info "kill: $k at ${t_kill} ms; $c $st_down; start: $s at ${t_start} ms; $c live again ${back:-never (within 60 s)} ms after the start; I/Os completed on the path before the kill, when it was down, live again, 3 s later: $w0 $wd $w1 $w2"
fio_wait $fio_pid 120
rc=$?
info "fio: $(fio_summary /tmp/fio.out)"
reads=$(sed -n 's/.*READ:.*io=\([0-9.]*[KMG]i*B\).*/\1/p' /tmp/fio.out | head -1)
if [ $rc -ne 0 ]; then fail "fio exit $rc: $(tail -5 /tmp/fio.err | tr '\n' '|') $(fio_summary /tmp/fio.out)"
elif grep -qiE "verify: bad|bad magic|crc32c: verify failed|err= *[1-9]" /tmp/fio.out /tmp/fio.err; then
  fail "verify errors: $(fio_summary /tmp/fio.out)"
elif [ -z "$reads" ]; then fail "fio read nothing back (no verification): $(fio_summary /tmp/fio.out)"
elif [ -z "$back" ]; then fail "$c not live within 60 s of the restart ($(ctrl_state $c))"
elif [ "$w2" -le "$w1" ]; then fail "no I/O on the path after the reconnect: $w1 -> $w2"
else pass; fi

step reconnected
rec=$(dmesg | grep -E "nvme[0-9]+: (starting error recovery|Reconnecting|Failed reconnect|Successfully reconnected)")
info "identity after: $(for k in nguid eui wwid; do printf '%s=%s ' $k "$(cat /sys/block/${d#/dev/}/$k 2>/dev/null)"; done); $c: $(for k in state cntlid; do printf '%s=%s ' $k "$(cat /sys/class/nvme/$c/$k 2>/dev/null)"; done)"
if echo "$rec" | grep -q "Successfully reconnected" && echo "$rec" | grep -q "starting error recovery"; then pass
else fail "the kernel logged no error recovery and reconnect: $(echo "$rec" | tr '\n' '|')"; fi

step data-before-kill
if before --verify_only=1; then
  info "verify_only of the 32 MiB written before the kill: $(fio_summary /tmp/before.out)"; pass
else fail "$(tail -3 /tmp/before.err | tr '\n' '|') $(fio_summary /tmp/before.out)"; fi

step kernel-clean
check nvme_clean_above_paths
step disconnect
out=$(disconnect 2>&1)
if wait_ctrls 0 20; then pass; else fail "$out; left: $(nvme_ctrls | tr '\n' ' ')"; fi
nvme_dmesg
