# What the kernel learned about each LU: sysfs queue limits, cache type,
# provisioning, ALUA, INQUIRY MultiP, next to the VPD pages the LU sends
# (the harness compares the FACT lines with the LUs' configuration and the
# kernel's rules for turning VPD B0 into queue limits).
step discovery
out=$(iscsiadm -m discovery -t st -p "$P0" 2>&1)
info "discovery: $(echo "$out" | tr '\n' ' ')"
if echo "$out" | grep -q "$IQN"; then pass; else fail "$out"; fi
# Discovery names the target's own (127.0.0.1) portals, which the guest
# reaches through its forwarded addresses instead.
iscsiadm -m node -o delete >/dev/null 2>&1

step login
check login "$P0"
for l in 0 1 2; do
  step "lun$l"
  d=$(wait_lun "$P0" $l 20) || { fail "no disk for LUN $l"; continue; }
  n=${d#/dev/}
  q=/sys/block/$n/queue
  sd=$(ls -d /sys/block/$n/device/scsi_disk/* | head -1)
  for k in logical_block_size physical_block_size minimum_io_size optimal_io_size \
           discard_max_hw_bytes discard_granularity write_zeroes_max_bytes rotational \
           max_hw_sectors_kb max_sectors_kb; do
    fact lun$l $k "$(cat $q/$k)"
  done
  fact lun$l size_bytes $(( $(cat /sys/block/$n/size) * 512 ))
  fact lun$l cache_type "$(cat $sd/cache_type)"
  fact lun$l fua "$(cat $sd/FUA)"
  fact lun$l provisioning_mode "$(cat $sd/provisioning_mode)"
  fact lun$l access_state "$(cat /sys/block/$n/device/access_state 2>/dev/null)"
  fact lun$l dh_state "$(cat /sys/block/$n/device/dh_state 2>/dev/null)"
  inq=$(sg_inq "$d" 2>&1)
  fact lun$l multip "$(echo "$inq" | sed -n 's/.*MultiP=\([01]\).*/\1/p' | head -1)"
  fact lun$l hisup "$(echo "$inq" | sed -n 's/.*HiSUP=\([01]\).*/\1/p' | head -1)"
  fact lun$l tpgs "$(echo "$inq" | sed -n 's/.*TPGS=\([0-3]\).*/\1/p' | head -1)"
  bl=$(sg_vpd -p bl "$d" 2>&1)
  num() { echo "$bl" | grep -i "$1" | head -1 | sed -n 's/.*: *\(-\{0,1\}[0-9][0-9]*\).*/\1/p'; }
  fact lun$l vpd_otlg "$(num 'Optimal transfer length granularity')"
  fact lun$l vpd_otl "$(num '^ *Optimal transfer length:')"
  fact lun$l vpd_max_unmap "$(num 'Maximum unmap LBA count')"
  fact lun$l vpd_max_xfer "$(num 'Maximum transfer length')"
  fact lun$l vpd_unmap_gran "$(num 'Optimal unmap granularity')"
  fact lun$l vpd_max_ws "$(num 'Maximum write same length')"
  info "lun$l sg_vpd bl: $(echo "$bl" | tr '\n' '|')"
  info "lun$l sg_vpd lbpv: $(sg_vpd -p lbpv "$d" 2>&1 | tr '\n' '|')"
  info "lun$l sg_rtpg: $(sg_rtpg -d "$d" 2>&1 | tr '\n' '|')"
  info "lun$l sg_readcap: $(sg_readcap -l "$d" 2>&1 | tr '\n' '|')"
  pass
done
step logout
check logout "$P0"
step kernel-clean
check kernel_clean
info "dmesg: $(dmesg | grep -E 'sd |scsi|alua' | tail -30 | tr '\n' '|')"
