# NVMe in-band authentication (DH-HMAC-CHAP, NVMe Base 2.0 §8.13) from the
# kernel's host against a target with `dhchap` (run.py nvme-auth, on the
# backports kernel: Linux 6.1 has no NVMe authentication): refused without
# a secret and with a wrong one; admitted with the right one, the
# namespace written and read back through every I/O queue; bidirectional
# authentication admitted when the controller proves its own secret, and
# refused by the host when it expects another; re-authentication of the
# live queues (the secret rewritten in sysfs) during fio --verify. The
# kernel's messages about each attempt are printed as INFO lines.
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
# Re-authentication on live queues (the host's secret rewritten through
# sysfs: Linux runs a new transaction on the admin and every I/O queue)
# while fio --verify runs: no I/O error, the controller stays live.
step reauth
for m in nvme_core nvme_auth; do echo "module $m +p" > /proc/dynamic_debug/control 2>/dev/null; done
dmesg -c >/dev/null
if connect "$NVME_ADDR0" "$NVME_PORT0" --dhchap-secret="$DHCHAP_SECRET" >/dev/null 2>&1 && d=$(wait_ns 20); then
  c=$(nvme_ctrls | head -1)
  fio --eta=never --name=reauth --filename="$d" --rw=randrw --bs=4k --size=16M --time_based \
    --runtime=8 --ioengine=libaio --iodepth=8 --direct=1 --verify=crc32c --verify_fatal=1 \
    --output=/dev/null 2>/tmp/err &
  fp=$!
  sleep 2
  echo "$DHCHAP_SECRET" > /sys/class/nvme/$c/dhchap_secret
  sleep 2
  echo "$DHCHAP_SECRET" > /sys/class/nvme/$c/dhchap_secret
  wait $fp; frc=$?
  st=$(ctrl_state "$c")
  info "reauth: fio exit $frc, controller $st; kernel: $(dmesg | grep -i "auth" | tail -6 | tr '\n' '|')"
  disconnect >/dev/null 2>&1; wait_ctrls 0 20
  if [ $frc -ne 0 ]; then fail "fio: $(tail -3 /tmp/err | tr '\n' '|')"
  elif [ "$st" != live ]; then fail "controller $st after re-authenticating"
  else pass; fi
else
  fail "could not connect"
fi
for m in nvme_core nvme_auth; do echo "module $m -p" > /proc/dynamic_debug/control 2>/dev/null; done
step target-log
n=$(host log "DH-HMAC-CHAP authentication failed")
# One failure each for the wrong secret (the host's refusal of the
# controller's R2 is the host's: the target only sees it give up).
case "$n" in "OK 0"|ERR*) fail "the target logged no failed authentication ($n)";; *) pass;; esac
step kernel-clean
check kernel_clean
