# NVMe/TCP from the kernel's host (nvme-tcp, nvme-cli) against subsystem
# $NVME_NQN at $NVME_ADDR0:$NVME_PORT0: ironsan's nvme_listen, forwarded
# (scripts/guest/run.py nvme), or with NVME_TARGET=nvmet the kernel's own
# target, set up here through configfs with a file on xfs on a RAM disk as
# namespace $NVME_NSID, for reference (run.py nvme-nvmet). discover lists
# the subsystem; connect; the namespace's size and identity (id-ctrl,
# id-ns, ns-descs, sysfs: printed); a namespace attached and detached
# while connected appears and goes without a rescan; ext4 with 192 MiB checked by fio's
# verify, fstrim (the backing file's allocated bytes shrink), fsck;
# disconnect; connect again with header and data digests: the files verify,
# xfs likewise; a second controller through $NVME_ADDR1:$NVME_PORT1 joins
# the subsystem (native multipath) and both carry I/O; disconnect; the
# kernel logged no error. The host's commands while discovering and
# connecting (trace events) and the kernel's nvme messages are printed as
# INFO lines. A step that cannot succeed fails within its timeout.
NVMET_FILE=/tmp/nvmet/ns$NVME_NSID.img
T=/sys/kernel/tracing

# nvme_ctrls, ns_dev, wait_ns, wait_ctrls, connect, disconnect.
. /nvme-lib.sh
# Bytes allocated to the namespace's backing file: ironsan's LUN 0, asked
# of the host, or nvmet's file in the guest.
allocated() {
  if [ "$NVME_TARGET" = nvmet ]; then echo $(( $(stat -c %b "$NVMET_FILE") * 512 ))
  else host allocated $(( NVME_NSID - 1 )) | cut -d' ' -f2; fi
}
# The host's commands (trace events nvme_setup_cmd, nvme_complete_rq) from
# trace_on to `trace_dump LABEL`, one INFO line each.
trace_on() {
  [ -d $T/events/nvme ] || return 0
  echo > $T/trace
  echo 1 > $T/events/nvme/nvme_setup_cmd/enable
  echo 1 > $T/events/nvme/nvme_complete_rq/enable
}
trace_dump() {
  [ -d $T/events/nvme ] || return 0
  echo 0 > $T/events/nvme/nvme_setup_cmd/enable
  echo 0 > $T/events/nvme/nvme_complete_rq/enable
  grep -v '^#' $T/trace | sed -E 's/^.*\[[0-9]+\] [^ ]+ +//' | while read -r l; do
    info "$1 trace: $l"
  done
  echo > $T/trace
}
# `show LABEL CMD…`: CMD's output on one INFO line.
show() {
  l=$1; shift
  info "$l: $("$@" 2>&1 | grep -v '^ps  *[0-9]' | tr -s ' \t' ' ' | tr '\n' '|')"
}
# The kernel logged no I/O error, no NVMe error or timeout, no warning.
nvme_clean() {
  kernel_clean || return 1
  bad=$(dmesg | grep -E "WARNING:|BUG:|Oops|Call Trace|general protection|queue [0-9]+: timeout|digest error|sct 0x|Reconnecting|error recovery|nvme.*failed" | head -5)
  [ -z "$bad" ] || { echo "$bad"; return 1; }
}
# The kernel's own target: subsystem $NVME_NQN, namespace $NVME_NSID on a
# file, any host, a TCP port at each address. The file is on xfs on a RAM
# disk (brd, the namespace's size and 192 MiB): nvmet's file backend
# deallocates with a punched hole and zeroes with FALLOC_FL_ZERO_RANGE,
# which tmpfs refuses (the host would log Write Zeroes failing).
nvmet_setup() (
  set -e
  modprobe nvmet-tcp
  modprobe brd rd_nr=1 rd_size=$(( NVME_SIZE / 1024 + 196608 ))
  mkfs.xfs -q -f /dev/ram0
  mkdir -p /tmp/nvmet
  mount -t xfs /dev/ram0 /tmp/nvmet
  truncate -s "$NVME_SIZE" "$NVMET_FILE"
  c=/sys/kernel/config/nvmet
  s=$c/subsystems/$NVME_NQN
  mkdir "$s"
  echo 1 > "$s/attr_allow_any_host"
  n=$s/namespaces/$NVME_NSID
  mkdir "$n"
  echo "$NVMET_FILE" > "$n/device_path"
  # An NGUID, as a target with stable identities would set.
  echo 6972-6f6e-7361-6e00-0000-0000-0000-0001 | tr -d - > "$n/device_nguid"
  echo 1 > "$n/enable"
  for i in 0 1; do
    p=$c/ports/$((i + 1))
    mkdir "$p"
    echo tcp > "$p/addr_trtype"
    echo ipv4 > "$p/addr_adrfam"
    eval "echo \$NVME_ADDR$i" > "$p/addr_traddr"
    eval "echo \$NVME_PORT$i" > "$p/addr_trsvcid"
    ln -s "$s" "$p/subsystems/$NVME_NQN"
  done
)

# `fs_write FS DEV`: mkfs, mount, 12 x 16 MiB written with a checksum in
# every block and read back checked, fstrim gives back 96 MiB written and
# removed, umount, fsck clean.
fs_write() {
  fs=$1 d=$2
  case $fs in ext4) mkfs="mkfs.ext4 -q -F" fsck="e2fsck -fn" ;;
              xfs) mkfs="mkfs.xfs -q -f" fsck="xfs_repair -n" ;; esac
  step "$fs-mkfs"
  check $mkfs "$d"
  step "$fs-mount"
  mkdir -p /mnt/$fs
  check mount -t $fs "$d" /mnt/$fs
  step "$fs-files"
  check fio --eta=never --name=fill --directory=/mnt/$fs --nrfiles=12 --filesize=16M --bs=256k \
    --rw=write --ioengine=psync --verify=crc32c --do_verify=1 --fsync_on_close=1 --output=/dev/null
  step "$fs-fstrim"
  for i in 1 2 3 4 5 6 7 8 9 10 11 12; do cp /tmp/sample /mnt/$fs/junk$i; done
  sync
  before=$(allocated)
  rm -f /mnt/$fs/junk*
  sync
  out=$(fstrim -v /mnt/$fs 2>&1)
  after=$(allocated)
  info "$fs fstrim: $out; backing file allocated $before -> $after bytes; discard_max_bytes $(cat /sys/block/${d#/dev/}/queue/discard_max_bytes)"
  if [ -n "$after" ] && [ -n "$before" ] && [ "$after" -le $(( before - 64 * 1024 * 1024 )) ]; then pass
  else fail "allocated $before -> $after after removing 96 MiB ($out)"; fi
  step "$fs-umount"
  check umount /mnt/$fs
  step "$fs-fsck"
  check $fsck "$d"
}

# `ns_present NSID`: the subsystem has a block device for namespace NSID.
ns_present() {
  for _n in "$(subsys_dir)"/nvme*n*; do
    [ "$(cat "$_n/nsid" 2>/dev/null)" = "$1" ] && [ -b "/dev/${_n##*/}" ] && return 0
  done
  return 1
}
# A namespace attached while the host is connected appears without a
# rescan (the controller's Namespace Attribute Changed notice: the host
# reads the Changed Namespace List and scans), and goes when detached:
# ironsan's admin add-lun/remove-lun (LUN 1: NSID 2), or nvmet's
# namespaces/2 enabled and disabled, for reference.
ns_hotplug() {
  step ns-attach
  if [ "$NVME_TARGET" = nvmet ]; then
    truncate -s 64M /tmp/nvmet/ns2.img
    n2=/sys/kernel/config/nvmet/subsystems/$NVME_NQN/namespaces/2
    mkdir "$n2" && echo /tmp/nvmet/ns2.img > "$n2/device_path" && echo 1 > "$n2/enable"
    ans="nvmet namespaces/2 enabled"
  else
    ans=$(host admin add-lun --number 1 "$IQN" mem:64M)
  fi
  if wait_until 15 ns_present 2; then
    pass
    info "namespace 2 appeared $waited ms after it was attached ($ans)"
  else
    fail "no namespace 2 within 15 s of $ans: $(dmesg | grep -i nvme | tail -3 | tr '\n' '|')"
  fi
  step ns-detach
  if [ "$NVME_TARGET" = nvmet ]; then
    echo 0 > "$n2/enable" && rmdir "$n2"
    ans="nvmet namespaces/2 disabled"
  else
    ans=$(host admin remove-lun "$IQN" 1)
  fi
  if wait_until 15 not_present2; then
    pass
    info "namespace 2 went $waited ms after it was detached ($ans)"
  else
    fail "namespace 2 still there 15 s after $ans"
  fi
}
not_present2() { ! ns_present 2; }

# `resv_report DEV`: nvme-cli's Reservation Report (extended data
# structure) on one line, lower case.
resv_report() { nvme resv-report "$1" --eds 2>&1 | tr -s ' \t' ' ' | tr '\n' '|' | tr 'A-F' 'a-f'; }
# Reservations (NVMe Base 2.0 §8.19) through nvme-cli: this host registers
# and takes Write Exclusive; another host (the harness's userspace
# initiator, `other-host`) may then read but not write (Reservation
# Conflict); the Reservation Report names this host's identifier as the
# holder; after a release the other host writes; unregistering leaves no
# registrant. Linux 6.1's own target serves no reservations (nvmet has
# them from Linux 6.13), so against it this part is not run.
reservations() {
  d=$1
  if [ "$NVME_TARGET" = nvmet ]; then
    info "reservations: not run against nvmet (Linux $(uname -r) serves none)"
    return
  fi
  step resv-register
  check nvme resv-register "$d" --nrkey=0xa1 --rrega=0
  step resv-acquire
  check nvme resv-acquire "$d" --crkey=0xa1 --rtype=1 --racqa=0
  step resv-report
  rep=$(resv_report "$d")
  info "resv-report: $rep"
  hostid=$(tr -d '\n-' < /etc/nvme/hostid | tr 'A-F' 'a-f')
  if echo "$rep" | grep -q "rtype *: *1|" && echo "$rep" | grep -q "regctl *: *1|" &&
     echo "$rep" | tr -d ' -' | grep -q "$hostid" && echo "$rep" | grep -q "rcsts *: *1|"; then pass
  else fail "expected rtype 1, one registrant, hostid $hostid holding: $rep"; fi
  step resv-conflict
  own=$(dd if=/tmp/sample of="$d" bs=4k count=1 seek=100 oflag=direct 2>&1) || own="FAILED $own"
  rd=$(host other-host read "$NVME_NQN")
  wr=$(host other-host write "$NVME_NQN")
  info "Write Exclusive held here: own write: $(echo "$own" | tail -1); other host read: $rd; other host write: $wr"
  if [ "${own#FAILED}" != "$own" ]; then fail "the holder's write failed: $own"
  elif [ "${rd#OK 0}" = "$rd" ]; then fail "the other host could not read: $rd"
  elif [ "${wr#OK 0}" != "$wr" ] || ! echo "$wr" | grep -q "SC 0x83"; then fail "the other host's write was not a Reservation Conflict: $wr"
  else pass; fi
  step resv-release
  if ! out=$(nvme resv-release "$d" --crkey=0xa1 --rtype=1 --rrela=0 2>&1); then fail "$out"
  else
    wr=$(host other-host write "$NVME_NQN")
    if [ "${wr#OK 0}" = "$wr" ]; then fail "released, yet the other host could not write: $wr"; else pass; fi
  fi
  step resv-unregister
  if ! out=$(nvme resv-register "$d" --crkey=0xa1 --rrega=1 2>&1); then fail "$out"
  else
    rep=$(resv_report "$d")
    info "resv-report after unregistering: $rep"
    if echo "$rep" | grep -q "regctl *: *0|"; then pass; else fail "registrants left: $rep"; fi
  fi
}

nvme_run() {
  step modprobe
  check modprobe nvme-tcp
  # The host's debug messages (connect, queues, identify) into dmesg.
  for m in nvme_core nvme_fabrics nvme_tcp; do
    echo "module $m +p" > /proc/dynamic_debug/control 2>/dev/null
  done
  info "host: $(cat /etc/nvme/hostnqn) hostid $(cat /etc/nvme/hostid); $(nvme version 2>&1 | tr '\n' ' ')"
  if [ "$NVME_TARGET" = nvmet ]; then
    step nvmet
    check nvmet_setup
    for m in nvmet nvmet_tcp; do echo "module $m +p" > /proc/dynamic_debug/control 2>/dev/null; done
  fi
  dd if=/dev/urandom of=/tmp/sample bs=1M count=8 2>/dev/null

  step discover
  trace_on
  out=$(timeout 60 nvme discover -t tcp -a "$NVME_ADDR0" -s "$NVME_PORT0" 2>&1)
  rc=$?
  trace_dump discover
  info "discover: $(echo "$out" | tr -s ' ' | tr '\n' '|')"
  if [ $rc -eq 0 ] && echo "$out" | grep -q "subnqn: *$NVME_NQN\$"; then pass
  else fail "exit $rc, $NVME_NQN not listed: $(echo "$out" | tail -5 | tr '\n' '|') $(dmesg | grep -i nvme | tail -3 | tr '\n' '|')"; fi

  step connect
  trace_on
  out=$(connect "$NVME_ADDR0" "$NVME_PORT0" 2>&1)
  rc=$?
  d=""; [ $rc -ne 0 ] || d=$(wait_ns 30)
  trace_dump connect
  [ -z "$out" ] || info "connect: $out"
  if [ $rc -ne 0 ] || [ -z "$d" ]; then
    fail "exit $rc, no namespace $NVME_NSID: $(echo "$out" | tail -3 | tr '\n' '|') $(dmesg | grep -i nvme | tail -5 | tr '\n' '|')"
    return
  fi
  pass
  ctrl=$(nvme_ctrls | head -1)
  n=${d#/dev/}

  step size
  size=$(blockdev --getsize64 "$d")
  info "$d: $size bytes; $(for k in logical_block_size physical_block_size minimum_io_size optimal_io_size \
    discard_granularity discard_max_hw_bytes write_zeroes_max_bytes max_hw_sectors_kb max_sectors_kb \
    max_segments nr_requests write_cache fua rotational; do printf '%s=%s ' $k "$(cat /sys/block/$n/queue/$k)"; done)"
  if [ "$size" = "$NVME_SIZE" ]; then pass; else fail "$size bytes, the namespace has $NVME_SIZE"; fi

  step identity
  c=/sys/class/nvme/$ctrl
  info "$ctrl: $(for k in transport address state subsysnqn serial model firmware_rev cntlid \
    queue_count sqsize kato ctrl_loss_tmo reconnect_delay hostnqn hostid numa_node; do
    printf '%s=%s ' $k "$(cat $c/$k 2>/dev/null)"; done)"
  info "$n: $(for k in nsid wwid uuid nguid eui; do printf '%s=%s ' $k "$(cat /sys/block/$n/$k 2>/dev/null)"; done)"
  show "id-ctrl" nvme id-ctrl /dev/$ctrl
  show "id-ns" nvme id-ns "$d"
  show "ns-descs" nvme ns-descs "$d"
  show "list-subsys" nvme list-subsys
  # id-ns: NSZE blocks of the LBA format in use.
  nsze=$(nvme id-ns "$d" 2>/dev/null | awk '/^nsze/ {print $3}')
  lbads=$(nvme id-ns "$d" 2>/dev/null | sed -n 's/.*lbads:\([0-9]*\).*(in use).*/\1/p')
  subnqn=$(nvme id-ctrl /dev/$ctrl 2>/dev/null | awk '/^subnqn/ {print $3}')
  if [ -n "$nsze" ] && [ -n "$lbads" ] && [ $(( nsze << lbads )) = "$size" ] &&
     [ "$subnqn" = "$NVME_NQN" ] && nvme ns-descs "$d" >/dev/null 2>&1; then pass
  else fail "id-ns nsze $nsze lbads $lbads (device $size bytes), id-ctrl subnqn $subnqn"; fi

  reservations "$d"

  ns_hotplug

  fs_write ext4 "$d"

  step disconnect
  out=$(disconnect 2>&1)
  if wait_ctrls 0 20 && echo "$out" | grep -q "disconnected 1 controller"; then pass
  else fail "$out; left: $(nvme_ctrls | tr '\n' ' ')"; fi

  # The kernel's host refuses an ICResp without the digests it asked for:
  # a connection is proof enough that both are on.
  step connect-digests
  out=$(connect "$NVME_ADDR0" "$NVME_PORT0" --hdr-digest --data-digest 2>&1)
  rc=$?
  d=""; [ $rc -ne 0 ] || d=$(wait_ns 30)
  [ -z "$out" ] || info "connect --hdr-digest --data-digest: $out"
  if [ $rc -eq 0 ] && [ -n "$d" ]; then pass
  else
    fail "exit $rc, no namespace: $(echo "$out" | tail -3 | tr '\n' '|') $(dmesg | grep -i nvme | tail -5 | tr '\n' '|')"
    # The rest without digests, to learn what else holds.
    disconnect >/dev/null 2>&1
    wait_ctrls 0 20
    connect "$NVME_ADDR0" "$NVME_PORT0" >/dev/null 2>&1
    d=$(wait_ns 30) || return
    info "continuing without digests"
  fi

  step ext4-verify
  if mount -t ext4 "$d" /mnt/ext4 && fio --eta=never --name=fill --directory=/mnt/ext4 --nrfiles=12 \
       --filesize=16M --bs=256k --rw=write --ioengine=psync --verify=crc32c --verify_only=1 \
       --output=/dev/null --allow_file_create=0 2>/tmp/err && umount /mnt/ext4; then pass
  else fail "data differs after reconnecting: $(tail -3 /tmp/err | tr '\n' '|')"; umount /mnt/ext4 2>/dev/null; fi

  fs_write xfs "$d"

  step second-path
  out=$(connect "$NVME_ADDR1" "$NVME_PORT1" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! wait_ctrls 2 30; then
    fail "exit $rc, $(nvme_ctrls | wc -l) controllers: $(echo "$out" | tail -3 | tr '\n' '|') $(dmesg | grep -i nvme | tail -5 | tr '\n' '|')"
  else
    show "list-subsys" nvme list-subsys
    subsys=$(for s in /sys/class/nvme-subsystem/*; do [ "$(cat $s/subsysnqn)" = "$NVME_NQN" ] && echo $s; done)
    echo round-robin > "$subsys/iopolicy" 2>/dev/null
    # I/Os per path (reads + writes of each controller's hidden path device).
    paths() { for p in /sys/class/nvme/$(nvme_ctrls | head -1)/nvme*c*n* /sys/class/nvme/$(nvme_ctrls | tail -1)/nvme*c*n*; do
      awk '{printf "%d ", $1 + $5}' "$p/stat" 2>/dev/null; done; }
    s0=$(paths)
    fio --eta=never --name=mp --filename="$d" --rw=randwrite --bs=16k --size=32M --ioengine=libaio \
      --iodepth=8 --direct=1 --verify=crc32c --do_verify=1 --verify_fatal=1 --output=/dev/null 2>/tmp/err
    rc=$?
    s1=$(paths)
    info "iopolicy $(cat $subsys/iopolicy); I/Os per path before and after: [$s0] [$s1]"
    set -- $s0; a0=${1:-0} b0=${2:-0}; set -- $s1; a1=${1:-0} b1=${2:-0}
    if [ $rc -ne 0 ]; then fail "fio: $(tail -3 /tmp/err | tr '\n' '|')"
    elif [ -n "$s1" ] && { [ $a1 -le $a0 ] || [ $b1 -le $b0 ]; }; then fail "a path carried no I/O: [$s0] [$s1]"
    else pass; fi
  fi

  step disconnect-all
  out=$(disconnect 2>&1)
  if wait_ctrls 0 20 && [ ! -e "$d" ]; then pass
  else fail "$out; left: $(nvme_ctrls | tr '\n' ' ')"; fi
}

nvme_run
# Whatever happened: no controller stays behind.
[ -z "$(nvme_ctrls)" ] || disconnect >/dev/null 2>&1
step kernel-clean
check nvme_clean
# (Without the keep-alive timer's debug messages, one a second.)
dmesg | grep -i nvme | grep -v "keep-alive timer$" | while read -r l; do info "dmesg: $l"; done
