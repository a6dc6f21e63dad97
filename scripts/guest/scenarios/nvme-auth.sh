# NVMe in-band authentication (DH-HMAC-CHAP, NVMe Base 2.0 §8.13) from the
# kernel's host against a target with `dhchap` (run.py nvme-auth, on the
# backports kernel: Linux 6.1 has no NVMe authentication): refused without
# a secret and with a wrong one; admitted with the right one, the
# namespace written and read back through every I/O queue; bidirectional
# authentication admitted when the controller proves its own secret, and
# refused by the host when it expects another. The kernel's messages about
# each attempt are printed as INFO lines.
. /nvme-lib.sh
modprobe nvme-tcp
# `try NAME EXPECT(ok|refused) CONNECT-OPTIONS…`
try() {
  name=$1 want=$2; shift 2
  step "$name"
  dmesg -c >/dev/null
  out=$(connect "$NVME_ADDR0" "$NVME_PORT0" "$@" 2>&1)
  rc=$?
  got=refused
  if [ $rc -eq 0 ] && d=$(wait_ns 20); then
    got=ok
    # Every queue authenticated: a write and its read-back over all of them.
    if ! fio --eta=never --name=auth --filename="$d" --rw=randwrite --bs=4k --size=8M \
        --ioengine=libaio --iodepth=16 --direct=1 --verify=crc32c --do_verify=1 \
        --verify_fatal=1 --output=/dev/null 2>/tmp/err; then
      got="ok-but-io-failed: $(tail -2 /tmp/err | tr '\n' '|')"
    fi
  fi
  [ -n "$(nvme_ctrls)" ] && disconnect >/dev/null 2>&1
  wait_ctrls 0 20
  info "$name: $got (exit $rc: $(echo "$out" | tail -1)); kernel: $(dmesg | grep -i nvme | tail -4 | tr '\n' '|')"
  if [ "$got" = "$want" ]; then pass; else fail "wanted $want, got $got"; fi
}
info "host: $(cat /etc/nvme/hostnqn); $(nvme version 2>&1 | head -1)"
try no-secret refused
try wrong-secret refused --dhchap-secret="$DHCHAP_WRONG"
try dhchap ok --dhchap-secret="$DHCHAP_SECRET"
try bidirectional ok --dhchap-secret="$DHCHAP_SECRET" --dhchap-ctrl-secret="$DHCHAP_CTRL_SECRET"
try wrong-ctrl-secret refused --dhchap-secret="$DHCHAP_SECRET" --dhchap-ctrl-secret="$DHCHAP_WRONG"
step target-log
n=$(host log "DH-HMAC-CHAP authentication failed")
# One failure each for the wrong secret (the host's refusal of the
# controller's R2 is the host's: the target only sees it give up).
case "$n" in "OK 0"|ERR*) fail "the target logged no failed authentication ($n)";; *) pass;; esac
step kernel-clean
check kernel_clean
