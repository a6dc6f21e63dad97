# Every header x data digest combination, then the login parameters
# initiators vary (InitialR2T x ImmediateData, small and large bursts and
# segment lengths): each logs in with those node settings, checks what was
# negotiated, writes 8 MiB of random-sized direct I/O (512 B to 1 MiB) at
# depth 8 with a checksum in every block and reads it back checked (1 MiB
# of 512 B to 64 KiB with 512-byte bursts and segments: each burst is a
# round trip, and the guest runs emulated).
n=0
run_combo() { # NAME EXPECT(grep pattern of -P2 output) NODE-SETTINGS...
  name=$1 expect=$2; shift 2
  n=$((n + 1))
  step "$name"
  if ! out=$(login "$P0" "$@" 2>&1); then fail "login: $(echo "$out" | tail -2 | tr '\n' '|')"; forget "$P0"; return; fi
  d=$(wait_lun "$P0" 0 20) || { fail "no disk"; logout "$P0"; forget "$P0"; return; }
  neg=$(iscsiadm -m session -P2 2>&1 | sed -n '/Negotiated iSCSI params/,$p' | tr -s ' \t' ' ' | tr '\n' '|')
  info "$name: $neg"
  bad=""
  for e in $expect; do
    echo "$neg" | grep -q "$(echo "$e" | tr '=' ':' | sed 's/:/: /')" || bad="$bad $e"
  done
  if [ -n "$bad" ]; then
    fail "negotiated otherwise than asked:$bad ($neg)"
  elif fio --eta=never --name=v --filename="$d" --rw=randwrite --bsrange=512-${MAXBS:-1m} --size=${SIZE:-8M} --direct=1 \
        --ioengine=libaio --iodepth=8 --verify=crc32c --do_verify=1 --randseed=$n \
        --output=/dev/null 2>/tmp/err; then
    pass
  else
    fail "data: $(tail -3 /tmp/err | tr '\n' '|')"
  fi
  logout "$P0" >/dev/null
  forget "$P0" >/dev/null
}
for hd in None CRC32C; do
  for dd in None CRC32C; do
    run_combo "digest-h$hd-d$dd" "HeaderDigest=$hd DataDigest=$dd" \
      node.conn[0].iscsi.HeaderDigest $hd node.conn[0].iscsi.DataDigest $dd
  done
done
for ir in Yes No; do
  for im in Yes No; do
    run_combo "r2t$ir-imm$im" "InitialR2T=$ir ImmediateData=$im" \
      node.session.iscsi.InitialR2T $ir node.session.iscsi.ImmediateData $im \
      node.conn[0].iscsi.HeaderDigest CRC32C node.conn[0].iscsi.DataDigest CRC32C
  done
done
SIZE=1M MAXBS=64k run_combo small "FirstBurstLength=512 MaxBurstLength=512 MaxRecvDataSegmentLength=512" \
  node.session.iscsi.InitialR2T No node.session.iscsi.ImmediateData Yes \
  node.session.iscsi.FirstBurstLength 512 node.session.iscsi.MaxBurstLength 512 \
  node.conn[0].iscsi.MaxRecvDataSegmentLength 512 \
  node.conn[0].iscsi.HeaderDigest CRC32C node.conn[0].iscsi.DataDigest CRC32C
# The target offers 16 MiB bursts and segments in this scenario.
run_combo large "FirstBurstLength=16776192 MaxBurstLength=16776192 MaxXmitDataSegmentLength=16777215" \
  node.session.iscsi.InitialR2T No node.session.iscsi.ImmediateData Yes \
  node.session.iscsi.FirstBurstLength 16776192 node.session.iscsi.MaxBurstLength 16776192 \
  node.conn[0].iscsi.MaxRecvDataSegmentLength 16776192
step kernel-clean
check kernel_clean
