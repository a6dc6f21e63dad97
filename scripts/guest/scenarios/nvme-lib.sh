# Helpers of the NVMe/TCP scenarios against ironsan (nvme-multipath.sh,
# nvme-restart.sh): run.py puts this file in the guest as /nvme-lib.sh for
# every scenario with nvme=True. The subsystem is $NVME_NQN, the namespace
# $NVME_NSID, the ports $NVME_ADDRn:$NVME_PORTn (scripts/guest/run.py).
# sh has no local variables: the helpers' own start with an underscore,
# so that a scenario's are never overwritten.

# The controllers (nvmeN) of $NVME_NQN.
nvme_ctrls() {
  for _c in /sys/class/nvme/nvme*; do
    [ "$(cat "$_c/subsysnqn" 2>/dev/null)" = "$NVME_NQN" ] && echo "${_c##*/}"
  done
}
# `ctrl_at ADDR`: the controller of $NVME_NQN connected to ADDR.
ctrl_at() {
  for _c in $(nvme_ctrls); do
    grep -q "traddr=$1," "/sys/class/nvme/$_c/address" 2>/dev/null && { echo "$_c"; return 0; }
  done
  return 1
}
# `ctrl_state CTRL`: live, connecting, resetting, deleting…
ctrl_state() { cat "/sys/class/nvme/$1/state" 2>/dev/null || echo gone; }
# `path_of CTRL`: the sysfs directory of namespace $NVME_NSID's path
# (nvmeXcYnZ, hidden) through CTRL.
path_of() {
  for _p in /sys/class/nvme/$1/nvme*c*n*; do
    [ "$(cat "$_p/nsid" 2>/dev/null)" = "$NVME_NSID" ] && { echo "$_p"; return 0; }
  done
  return 1
}
# `ana_of CTRL`: the kernel's ANA state of the path through CTRL.
ana_of() { cat "$(path_of "$1")/ana_state" 2>/dev/null || echo none; }
# `ios_of CTRL`: reads + writes completed on the path through CTRL.
ios_of() { awk '{print $1 + $5}' "$(path_of "$1")/stat" 2>/dev/null || echo 0; }
# The block device of namespace $NVME_NSID of $NVME_NQN: the subsystem's
# head (one device however many paths).
ns_dev() {
  for _s in /sys/class/nvme-subsystem/*; do
    [ "$(cat "$_s/subsysnqn" 2>/dev/null)" = "$NVME_NQN" ] || continue
    for _n in "$_s"/nvme*n*; do
      [ "$(cat "$_n/nsid" 2>/dev/null)" = "$NVME_NSID" ] && [ -b "/dev/${_n##*/}" ] &&
        { echo "/dev/${_n##*/}"; return 0; }
    done
  done
  return 1
}
# The sysfs directory of $NVME_NQN's subsystem.
subsys_dir() {
  for _s in /sys/class/nvme-subsystem/*; do
    [ "$(cat "$_s/subsysnqn" 2>/dev/null)" = "$NVME_NQN" ] && { echo "$_s"; return 0; }
  done
  return 1
}
# `wait_ns SECS`: waits for ns_dev, prints it.
wait_ns() {
  _wi=0
  while [ $_wi -lt $(( $1 * 10 )) ]; do
    ns_dev && return 0
    sleep 0.1; _wi=$((_wi + 1))
  done
  return 1
}
# `wait_ctrls N SECS`: waits until $NVME_NQN has N live controllers.
wait_ctrls() {
  _wi=0
  while [ $_wi -lt $(( $2 * 10 )) ]; do
    _live=0
    for _c in $(nvme_ctrls); do
      [ "$(ctrl_state $_c)" = live ] && _live=$((_live + 1))
    done
    [ $_live -eq $1 ] && [ "$(nvme_ctrls | wc -l)" -eq $1 ] && return 0
    sleep 0.1; _wi=$((_wi + 1))
  done
  return 1
}
# `wait_until SECS CMD…`: runs CMD every 0.1 s until it succeeds (0) or
# SECS have passed (1); $waited is the time it took, in ms. (Its own
# variables start with _wu_: sh has no locals.)
wait_until() {
  _wu_secs=$1; shift
  _wu_t0=$(now_ms)
  while ! "$@"; do
    [ $(( $(now_ms) - _wu_t0 )) -ge $(( _wu_secs * 1000 )) ] && { waited=$(( $(now_ms) - _wu_t0 )); return 1; }
    sleep 0.1
  done
  waited=$(( $(now_ms) - _wu_t0 ))
  return 0
}
# `connect ADDR PORT [OPTION…]`: nvme connect, bounded in time.
connect() {
  _ca=$1 _cp=$2; shift 2
  timeout 60 nvme connect -t tcp -a "$_ca" -s "$_cp" -n "$NVME_NQN" "$@"
}
disconnect() { timeout 60 nvme disconnect -n "$NVME_NQN"; }
# `show LABEL CMD…`: CMD's output on one INFO line.
show() {
  _sl=$1; shift
  info "$_sl: $("$@" 2>&1 | tr -s ' \t' ' ' | tr '\n' '|')"
}
# `fio_wait PID SECS`: waits for fio to end, at most SECS (then kills it);
# its exit status, 124 when it had to be killed.
fio_wait() {
  _fi=0
  while kill -0 "$1" 2>/dev/null && [ $_fi -lt $(( $2 * 10 )) ]; do sleep 0.1; _fi=$((_fi + 1)); done
  if kill -0 "$1" 2>/dev/null; then kill -9 "$1" 2>/dev/null; wait "$1" 2>/dev/null; return 124; fi
  wait "$1"
}
# `fio_summary FILE`: fio's error and I/O lines, one line.
fio_summary() {
  grep -E "err=|verify|READ:|WRITE:|bad|error" "$1" 2>/dev/null | tr -s ' \t' ' ' | tr '\n' '|'
}
# The kernel's nvme messages (without the keep-alive timer's debug
# messages), one INFO line each.
nvme_dmesg() {
  dmesg | grep -i nvme | grep -v "keep-alive timer$" | while read -r _l; do info "dmesg: $_l"; done
}
# No I/O error above the paths (on the head nvmeXnY, the file system),
# no warning, no oops: what multipath must hide.
nvme_clean_above_paths() {
  _bad=$(dmesg | grep -E "I/O error, dev nvme[0-9]+n[0-9]+|Buffer I/O error|WARNING:|BUG:|Oops|Call Trace|general protection|digest error|identifiers changed|Removing ctrl|ctrl_loss_tmo|Deleting" | head -5)
  [ -z "$_bad" ] || { echo "$_bad"; return 1; }
}
# The host's failed commands and asynchronous events (trace events
# nvme_complete_rq with a status other than 0, nvme_async_event) from
# trace_errors_on to `trace_errors_dump LABEL`: one INFO line each, at most
# 20 (the rest counted). Status 0x302 is ANA Inaccessible (SCT 3, SC 02h),
# 0x371 the host's own abort of a command on a connection it gave up.
TR=/sys/kernel/tracing
trace_errors_on() {
  [ -d $TR/events/nvme/nvme_complete_rq ] || return 0
  echo > $TR/trace
  echo 'status != 0' > $TR/events/nvme/nvme_complete_rq/filter
  echo 1 > $TR/events/nvme/nvme_complete_rq/enable
  [ -d $TR/events/nvme/nvme_async_event ] && echo 1 > $TR/events/nvme/nvme_async_event/enable
}
trace_errors_dump() {
  [ -d $TR/events/nvme/nvme_complete_rq ] || return 0
  grep -v '^#' $TR/trace | sed -E 's/^.*\[[0-9]+\] [^ ]+ +//' > /tmp/trace.txt
  echo > $TR/trace
  _tn=$(wc -l < /tmp/trace.txt)
  head -20 /tmp/trace.txt | while read -r _l; do info "$1 trace: $_l"; done
  [ "$_tn" -le 20 ] || info "$1 trace: … $((_tn - 20)) more: $(grep -o 'status=0x[0-9a-f]*' /tmp/trace.txt | sort | uniq -c | tr -s ' \n' ' ')"
  [ "$_tn" -gt 0 ] || info "$1 trace: no failed command, no asynchronous event"
}
trace_errors_off() {
  [ -d $TR/events/nvme/nvme_complete_rq ] || return 0
  echo 0 > $TR/events/nvme/nvme_complete_rq/enable
  echo 0 > $TR/events/nvme/nvme_complete_rq/filter
  [ -d $TR/events/nvme/nvme_async_event ] && echo 0 > $TR/events/nvme/nvme_async_event/enable
}
