#!/usr/bin/env python3
"""Real hosts: Debian's Linux kernel, booted under qemu, as the iSCSI initiator
of ironsan (and, for comparison, of tgt).

Each scenario boots a fresh guest (scripts/guest/build.sh: the kernel and a
busybox initramfs with open-iscsi, multipath-tools, sg3-utils, e2fsprogs,
xfsprogs, fio) with /scenario.sh from scripts/guest/scenarios/. The guest
reaches the target only through qemu's user network with restrict=on: each
portal is a guestfwd rule (10.0.2.100:3260, 10.0.2.101:3260, …) that runs
`socat - TCP:127.0.0.1:PORT` per connection, and 10.0.2.200:9000 reaches
this harness's control channel, through which a scenario asks for host-side
actions (kill -9 the target and start it again, `ironsan admin …`, the
backing file's allocated bytes). The guest reports on its serial console:
STEP/PASS/FAIL/INFO/FACT lines (scripts/guest/init); FACT lines are
checked here against what the scenario's LUNs advertise.

NVMe/TCP scenarios (scenarios/nvme*.sh, helpers in scenarios/nvme-lib.sh)
reach ironsan's `nvme_listen` addresses the same way, at 10.0.2.100:4420
and 10.0.2.101:4420 (a small script per port, which the control channel's
`nvme-cut N` / `nvme-restore N` use to take a port away and give it back),
or the kernel's own NVMe/TCP target (nvmet) inside the guest, for reference.

/dev/kvm on these machines cannot run Debian's kernel, so the guest runs
under TCG: its figures are functional, never performance.

  scripts/guest/run.py [--target ironsan|tgt] [--binary IRONSAN] [SCENARIO ...]
"""

import argparse
import base64
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import zlib
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
IQN = "iqn.2026-12.io.ironsan:guest"
# The target's NVMe subsystem: its IQN with "iqn." made "nqn.".
NQN = "nqn." + IQN[len("iqn."):]
GUEST_PORTALS = ["10.0.2.100", "10.0.2.101"]
NVME_PORT = 4420


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, secs=20):
    end = time.time() + secs
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


class Ironsan:
    """`ironsan serve` with a scenario's configuration, restartable."""

    name = "ironsan"

    def __init__(self, binary, work, scenario):
        self.bin = binary
        self.work = work
        self.ports = [free_port() for _ in range(scenario.portals)]
        # NVMe/TCP listeners (`nvme_listen`), one per portal.
        self.nvme_ports = [free_port() for _ in range(scenario.portals)] if scenario.nvme else []
        self.admin_port = free_port()
        self.state = os.path.join(work, "state")
        self.luns = scenario.luns(work)
        self.config = os.path.join(work, "target.toml")
        with open(self.config, "w") as f:
            f.write(scenario.toml(self.ports, self.luns, self.nvme_ports))
        self.log = open(os.path.join(work, "target.log"), "ab")
        self.proc = None
        # Portals removed with `ironsan admin remove-portal`: their ports
        # are silent meanwhile (`Silence`), as a port taken off a real
        # network is, not closed right after the guestfwd accepts.
        self.silent = {}
        self.quieted = []
        # The iSCSI portals of a killed target, silent until it starts
        # again (`Silence`: a dead machine sends no RST).
        self.down = []

    def start(self, *_):
        # Back: the target takes its ports again; connections the silent
        # ports took meanwhile stay silent until the initiator gives them
        # up (its login timeout), as they would to a host that rebooted.
        for q in self.down:
            q.stop_listening()
            self.quieted.append(q)
        self.down = []
        self.proc = subprocess.Popen(
            [self.bin, "--log", "info", "serve", "--config", self.config,
             "--admin", f"127.0.0.1:{self.admin_port}", "--state-dir", self.state],
            stdout=self.log, stderr=self.log, env=dict(os.environ, RUST_BACKTRACE="0"))
        for p in self.ports + self.nvme_ports:
            if not wait_port(p):
                if self.proc.poll() is not None:
                    # Refused its configuration, say: its last words.
                    with open(os.path.join(self.work, "target.log"), errors="replace") as f:
                        last = [l.strip() for l in f.read().splitlines() if l.strip(" |^")][-4:]
                    raise RuntimeError(f"ironsan exited ({self.proc.returncode}): "
                                       + " | ".join(last))
                kind = "NVMe/TCP" if p in self.nvme_ports else "iSCSI"
                raise RuntimeError(f"ironsan did not listen on {kind} port {p}")
        sock = os.path.join(self.state, "admin.sock")
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)

    def kill(self, *_):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            # Its iSCSI portals go silent, not closed: a connection the
            # guestfwd accepted and closed at once, which no real network
            # does, sets off open-iscsi 2.1.8's bug #387 (see `Silence`):
            # iscsid then did not log in again within the session's 30 s
            # replacement timeout (the restart scenario, once in a clean
            # clone: a reconnect 70 ms before the target was back). The
            # NVMe/TCP ports stay closed: the kernel's host reconnects
            # after a refused connection by itself.
            self.down = [Silence(p) for p in self.ports]

    def stop(self):
        for q in list(self.silent.values()) + self.quieted + self.down:
            q.close()
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()

    def admin(self, args):
        if args[:1] == ["add-portal"] and args[1:2] and args[1] in self.silent:
            # The port is ironsan's again; connections taken while it was
            # away stay silent until the initiator gives them up.
            q = self.silent.pop(args[1])
            q.stop_listening()
            self.quieted.append(q)
        r = subprocess.run(
            [self.bin, "admin", "--socket", os.path.join(self.state, "admin.sock")] + args,
            capture_output=True, text=True, timeout=30,
            env=dict(os.environ, RUST_BACKTRACE="0"))
        if r.returncode == 0 and args[:1] == ["remove-portal"] and args[1:2]:
            # Closed ports set off open-iscsi's bug #387 (see `Silence`).
            try:
                self.silent[args[1]] = Silence(int(args[1].rsplit(":", 1)[1]))
            except (OSError, ValueError):
                pass
        return r.returncode == 0, (r.stdout + r.stderr).strip()


class Silence(threading.Thread):
    """A gateway machine that died, on the port its ironsan listened on:
    connections are taken and never answered (a dead machine sends no
    RST; here the guest's connect completes anyway, as qemu's user network
    and the guestfwd's socat accept it before trying the host). Without it
    the guestfwd closes every connection the guest opens while the gateway
    is down, right after accepting it, which no real network does and which
    sets off open-iscsi 2.1.8's bug #387 (scenarios/gateways.sh): iscsid
    then cannot log in again for minutes. With it, the guest's logins time
    out and are tried again, as against a dead host."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.held = []
        self.start()

    def run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.held.append(c)

    def stop_listening(self):
        """The machine is back: the gateway takes the port; connections
        already taken stay silent until the initiator gives them up (its
        login timeout), as they would to a host that rebooted."""
        # shutdown() wakes the accept() blocked in run(): a close() alone
        # leaves the port listening until it returns.
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.join(2)

    def close(self):
        self.stop_listening()
        for c in self.held:
            c.close()


class Gateways:
    """Two ironsan gateways serving one RBD image as one LU
    (docs/GATEWAYS.md) on the Ceph cluster of $CEPH_CONF: gateway 0 is ALUA
    group 1 (portal tag 1), gateway 1 group 2 (tag 2); the first up owns the
    image. Each can be killed (-9) and started again on its own; while one is
    down its port is silent, as a dead machine is (`Silence`)."""

    name = "gateways"

    def __init__(self, binary, work, scenario):
        self.bin = binary
        self.work = work
        self.ports = [free_port(), free_port()]
        self.image = f"rbd/guest-{os.getpid()}-{scenario.name}"
        subprocess.run(["rbd", "create", "--size", "512M", self.image], check=True)
        self.luns = [{"backend": "rbd"}]
        self.procs = [None, None]
        self.silent = [None, None]
        self.log = open(os.path.join(work, "target.log"), "ab")

    def start(self, *which):
        for i in which or (0, 1):
            me, peer = i + 1, 2 - i
            if self.silent[i]:
                self.silent[i].stop_listening()
            self.procs[i] = subprocess.Popen(
                [self.bin, "--log", "info", "serve", "--listen", f"127.0.0.1:{self.ports[i]}",
                 "--target", IQN, "--lun",
                 f"rbd:{self.image}{os.environ.get('IRONSAN_RBD_OPTS', '')}",
                 "--gateway", f"{me}:{me}",
                 "--gateway-peer", f"{peer}={peer}"],
                stdout=self.log, stderr=self.log, env=dict(os.environ, RUST_BACKTRACE="0"))
            if not wait_port(self.ports[i], 60):
                raise RuntimeError(f"gateway {i} did not listen")

    def kill(self, *which):
        for i in which or (0, 1):
            p = self.procs[i]
            if p and p.poll() is None:
                p.kill()
                p.wait()
            if self.silent[i]:
                self.silent[i].close()
            self.silent[i] = Silence(self.ports[i])

    def signal(self, i, sig):
        """Sends SIGSTOP or SIGCONT to gateway i (a hung owner)."""
        p = self.procs[i]
        if not p or p.poll() is not None:
            raise RuntimeError(f"gateway {i} is not running")
        p.send_signal({"STOP": signal.SIGSTOP, "CONT": signal.SIGCONT}[sig])

    def stop(self):
        for h in self.silent:
            if h:
                h.close()
        for p in self.procs:
            if p and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        subprocess.run(["rbd", "rm", self.image], capture_output=True)

    def admin(self, args):
        return False, "the gateways run without an admin endpoint here"


class Tgt:
    """Debian's tgt (tgtd + tgtadm) serving the scenario's LUNs from files,
    for comparison: LUN numbers start at 1 (tgt's LUN 0 is its controller),
    RAM LUNs become files, and what tgt cannot do is answered ERR."""

    name = "tgt"

    def __init__(self, binary, work, scenario):
        self.bin = binary  # ironsan, for `tune linux` in the multipath scenario
        self.work = work
        self.sc = scenario
        self.ports = [free_port() for _ in range(scenario.portals)]
        self.control = 100 + free_port() % 9000
        self.luns = []
        for i, spec in enumerate(scenario.luns(work)):
            spec = dict(spec)
            spec["path"] = os.path.join(work, f"lun{i}.img")
            size = spec.get("size", "64M")
            subprocess.run(["truncate", "-s", size, spec["path"]], check=True)
            self.luns.append(spec)
        self.log = open(os.path.join(work, "target.log"), "ab")
        self.proc = None

    def adm(self, *args, check=True):
        r = subprocess.run(["tgtadm", "-C", str(self.control), "--lld", "iscsi"] + list(args),
                           capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"tgtadm {' '.join(args)}: {r.stderr.strip()}")
        return r

    def start(self, *_):
        self.proc = subprocess.Popen(
            ["tgtd", "-f", "-C", str(self.control), "--iscsi", f"portal=127.0.0.1:{self.ports[0]}"],
            stdout=self.log, stderr=self.log)
        for _ in range(100):
            if self.adm("--op", "show", "--mode", "target", check=False).returncode == 0:
                break
            time.sleep(0.05)
        self.adm("--op", "new", "--mode", "target", "--tid", "1", "-T", IQN)
        for i, spec in enumerate(self.luns):
            self.adm("--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", str(i + 1),
                     "-b", spec["path"])
            if spec.get("thin", True):
                self.adm("--op", "update", "--mode", "logicalunit", "--tid", "1", "--lun",
                         str(i + 1), "--params", "thin_provisioning=1")
        self.adm("--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL")
        for p in self.ports[1:]:
            self.adm("--op", "new", "--mode", "portal", "--param", f"portal=127.0.0.1:{p}")
        for k, v in self.sc.tgt_params:
            self.adm("--op", "update", "--mode", "target", "--tid", "1", "-n", k, "-v", v)
        chap = self.sc.env.get("CHAP_USER")
        if chap:
            self.adm("--op", "new", "--mode", "account", "--user", chap,
                     "--password", self.sc.env["CHAP_SECRET"])
            self.adm("--op", "bind", "--mode", "account", "--tid", "1", "--user", chap)
            mu = self.sc.env["MUTUAL_USER"]
            self.adm("--op", "new", "--mode", "account", "--user", mu,
                     "--password", self.sc.env["MUTUAL_SECRET"])
            self.adm("--op", "bind", "--mode", "account", "--tid", "1", "--user", mu,
                     "--outgoing")
        for p in self.ports:
            if not wait_port(p):
                raise RuntimeError(f"tgtd did not listen on {p}")

    def kill(self, *_):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.adm("--op", "delete", "--mode", "system", check=False)
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()

    def admin(self, args):
        if args[:1] == ["remove-portal"]:
            r = self.adm("--op", "delete", "--mode", "portal", "--param", f"portal={args[1]}",
                         check=False)
        elif args[:1] == ["add-portal"]:
            r = self.adm("--op", "new", "--mode", "portal", "--param", f"portal={args[1]}",
                         check=False)
        else:
            return False, f"tgt has no online equivalent of `ironsan admin {' '.join(args)}`"
        return r.returncode == 0, (r.stdout + r.stderr).strip() or "done"


def dhchap_secret(key, transform):
    """A DH-HMAC-CHAP secret as `nvme gen-dhchap-key` prints it: DHHC-1,
    the transformation hash (0 none, 1 SHA-256 …), base64 of the key and
    its CRC-32 (little-endian)."""
    raw = key + zlib.crc32(key).to_bytes(4, "little")
    return f"DHHC-1:{transform:02d}:{base64.b64encode(raw).decode()}:"


# The nvme-auth scenario's secrets: the host's (SHA-256 transformed), the
# controller's (48 bytes, SHA-384) and one nobody was given.
DHCHAP_HOST = dhchap_secret(bytes(range(32)), 1)
DHCHAP_CTRL = dhchap_secret(bytes(range(100, 148)), 2)
DHCHAP_WRONG = dhchap_secret(bytes(range(1, 33)), 1)


class Scenario:
    """What the target serves and what the guest runs."""

    def __init__(self, name, doc, luns, portals=2, timeout=240, env=None,
                 facts=None, limits="", extra="", rules=None, target_extra="", files=None,
                 tgt=True, tgt_params=(), tgt_reason="", gateways=False, nvme=False,
                 script=None, default=True, blktests=False, kernel=None):
        self.name = name
        self.doc = doc
        self._luns = luns
        self.portals = portals
        self.timeout = timeout
        self.env = env or {}
        self.facts = facts or {}
        self.limits = limits
        self.extra = extra
        self.rules = rules
        self.target_extra = target_extra
        # (target) -> {guest path: content}, made once the target runs.
        self.files = files
        # Runs against tgt too (False: it needs what only ironsan has).
        self.tgt = tgt
        # tgtadm target parameters (name, value) for the tgt run.
        self.tgt_params = list(tgt_params)
        self.tgt_reason = tgt_reason
        # Served by two RBD gateways (needs $CEPH_CONF: scripts/rbd.sh).
        self.gateways = gateways
        # ironsan listens for NVMe/TCP too (`nvme_listen`, one address per
        # portal), forwarded to the guest's 10.0.2.100:4420, 10.0.2.101:4420.
        self.nvme = nvme
        # The guest's /scenario.sh: scenarios/SCRIPT.sh (default: the name).
        self.script = script or name
        # Run when no scenario is named (False: only when named).
        self.default = default
        # Runs blktests from $IRONSAN_BLKTESTS (skipped without it).
        self.blktests = blktests
        # The guest kernel: None, this release's; "backports", its backports
        # suite's (scripts/guest/build.sh, IRONSAN_GUEST_KERNEL).
        self.kernel = kernel

    def luns(self, work):
        out = []
        for i, spec in enumerate(self._luns):
            spec = dict(spec)
            if spec["backend"] == "file":
                spec["path"] = os.path.join(work, f"lun{i}.img")
            if spec.pop("slowable", False):
                # Test builds' key (feature test-delay): the guest asks the
                # host to write milliseconds here.
                spec["test_delay_file"] = os.path.join(work, f"lun{i}.delay")
            out.append(spec)
        return out

    def toml(self, ports, luns, nvme_ports=()):
        t = "listen = [%s]\n" % ", ".join(f'"127.0.0.1:{p}"' for p in ports)
        if nvme_ports:
            t += "nvme_listen = [%s]\n" % ", ".join(f'"127.0.0.1:{p}"' for p in nvme_ports)
        if self.limits:
            t += "[limits]\n" + self.limits + "\n"
        t += self.extra
        t += f'[[target]]\nname = "{IQN}"\n' + self.target_extra
        for spec in luns:
            t += "[[target.lun]]\n"
            for k, v in spec.items():
                if isinstance(v, bool):
                    t += f"{k} = {'true' if v else 'false'}\n"
                elif isinstance(v, int):
                    t += f"{k} = {v}\n"
                else:
                    t += f'{k} = "{v}"\n'
        return t


def multipath_conf(target):
    """/etc/multipath.conf for a guest without udev, and the device section
    `ironsan tune linux` prints for this target, taken from its heredoc as a
    user would paste it."""
    lun = 1 if target.name == "tgt" else 0
    r = subprocess.run([target.bin, "tune", "linux",
                        f"iscsi://127.0.0.1:{target.ports[0]}/{IQN}/{lun}"],
                       capture_output=True, text=True, check=True,
                       env=dict(os.environ, RUST_BACKTRACE="0"))
    m = re.search(r"cat > (/etc/multipath/conf\.d/\S+) <<'EOF'\n(.*?)\nEOF\n", r.stdout, re.S)
    if not m:
        raise RuntimeError("ironsan tune linux printed no multipath conf.d heredoc")
    return {
        "/etc/multipath.conf": "defaults {\n    find_multipaths no\n    user_friendly_names no\n"
                               "    polling_interval 1\n}\n",
        m.group(1): m.group(2) + "\n",
    }


def block_limit_rules(facts):
    """The queue limits Linux's sd driver derives from what the LU sends
    (drivers/scsi/sd.c: sd_read_block_limits, sd_revalidate_disk,
    sd_config_discard): checked per LUN against the VPD B0 values the guest
    read with sg_vpd."""
    fails = []
    for lun, f in sorted(facts.items()):
        try:
            lbs = int(f["logical_block_size"])
            pbs = int(f["physical_block_size"])
            otlg = int(f["vpd_otlg"]) * lbs
            otl = int(f["vpd_otl"]) * lbs
            mx = int(f["vpd_max_xfer"]) * lbs
            # sd_validate_min_xfer_size / sd_validate_opt_xfer_size.
            otlg_ok = otlg > 0 and otlg % pbs == 0
            otl_ok = otl > 0 and otl % 4096 == 0 and otl >= pbs and (mx == 0 or otl <= mx)
            # Without a valid OPTIMAL TRANSFER LENGTH requests are cut at the
            # MAXIMUM TRANSFER LENGTH or BLK_DEF_MAX_SECTORS (1280 KiB).
            rw_max = otl if otl_ok else min(mx, 1280 << 10) if mx else 1280 << 10
            want = {
                # OPTIMAL TRANSFER LENGTH GRANULARITY, at least a physical block.
                "minimum_io_size": max(otlg if otlg_ok else 0, pbs),
                # OPTIMAL TRANSFER LENGTH.
                "optimal_io_size": otl if otl_ok else 0,
                # MAXIMUM UNMAP LBA COUNT (all ones, shown as -1: no limit),
                # at most SD_MAX_WS16_BLOCKS.
                "discard_max_hw_bytes": min(int(f["vpd_max_unmap"]) % (1 << 32), 0x7fffff) * lbs,
                # OPTIMAL UNMAP GRANULARITY, at least a physical block.
                "discard_granularity": max(int(f["vpd_unmap_gran"]) * lbs, pbs),
                # The host's limit caps it all.
                "max_sectors_kb": min(rw_max >> 10, int(f["max_hw_sectors_kb"])),
            }
        except (KeyError, ValueError) as e:
            fails.append(f"{lun}: missing or bad fact {e}")
            continue
        for k, v in want.items():
            if f.get(k) != str(v):
                fails.append(f"{lun} {k}: kernel {f.get(k)}, VPD B0 implies {v}")
        if int(f.get("write_zeroes_max_bytes", "0")) == 0:
            fails.append(f"{lun}: the kernel does not zero with WRITE SAME (write_zeroes_max_bytes 0)")
    return fails


def scenario_list():
    m64 = {"backend": "file", "size": "64M"}
    return [
        Scenario(
            "identity",
            "what the kernel learned (sysfs, sg_vpd, sg_rtpg) matches what each LU advertises: "
            "512n file LU, 512e RAM LU, write-back file LU",
            [dict(m64), {"backend": "mem", "size": "64M", "physical_block_size": 4096},
             dict(m64, write_cache="back")],
            timeout=180,
            facts={
                "lun0": {"logical_block_size": "512", "physical_block_size": "512",
                         "size_bytes": str(64 << 20), "cache_type": "write through",
                         "provisioning_mode": "unmap", "access_state": "active/optimized",
                         "dh_state": "alua", "multip": "1", "hisup": "1", "tpgs": "1"},
                # A RAM LU says WCE=1: nothing behind it is stable.
                "lun1": {"logical_block_size": "512", "physical_block_size": "4096",
                         "size_bytes": str(64 << 20), "cache_type": "write back",
                         "provisioning_mode": "unmap", "multip": "1"},
                "lun2": {"logical_block_size": "512", "physical_block_size": "512",
                         "cache_type": "write back", "multip": "1"},
            },
            rules=block_limit_rules),
        Scenario(
            "filesystems",
            "ext4 and xfs: mkfs, files, md5, fstrim shrinks the backing file, fsck clean, "
            "logout/login, remount, verify",
            [{"backend": "file", "size": "1G"}, {"backend": "file", "size": "1G"}],
            timeout=420),
        Scenario(
            "digests",
            "every header x data digest combination and the parameter space initiators use "
            "(InitialR2T x ImmediateData, small and large bursts and segments): data written "
            "and read back intact",
            [{"backend": "file", "size": "64M"}],
            limits='header_digest = "allowed"\ndata_digest = "allowed"\n'
                   'max_recv_data_segment = 16777215\nmax_burst = 16776192\n'
                   'first_burst = 16776192\n',
            tgt_params=[("HeaderDigest", "None,CRC32C"), ("DataDigest", "None,CRC32C"),
                        ("MaxRecvDataSegmentLength", "16777215"),
                        ("MaxBurstLength", "16776192"), ("FirstBurstLength", "16776192")],
            timeout=300),
        Scenario(
            "resize",
            "`ironsan admin resize-lun` during I/O reaches the host; resize2fs grows the fs",
            [{"backend": "file", "size": "256M"}],
            timeout=240),
        Scenario(
            "restart",
            "kill -9 of the target mid-write, restarted: the session recovers, no acknowledged "
            "write lost, fsck clean",
            [{"backend": "file", "size": "256M"}],
            timeout=300),
        Scenario(
            "multipath",
            "dm-multipath over two portals with the device section `ironsan tune linux` prints "
            "(ALUA, group_by_prio, round robin): fio --verify on ext4 while a portal is removed "
            "and added back; explicit ALUA with sg_stpg moves the active group and the kernel "
            "follows",
            [{"backend": "mem", "size": "512M"}],
            extra="[alua]\nexplicit = true\n",
            files=multipath_conf,
            timeout=300),
        Scenario(
            "gateways",
            "dm-multipath over two RBD gateways of one image (ALUA: the owner active/optimized, "
            "the other standby): fio --verify on ext4 while the owner is killed -9; the standby "
            "takes the image over, no error reaches the file system; the killed gateway returns "
            "as standby and its path is back; then the owner hangs (SIGSTOP 15 s), the other "
            "takes over, the resumed one steps down to standby",
            [], files=multipath_conf, gateways=True, timeout=600, tgt=False,
            tgt_reason="it is about ironsan's RBD gateways"),
        Scenario(
            "tmf",
            "task management for real: a LU made slow past the kernel's command timeout; the "
            "SCSI error handler's ABORT TASK and LUN RESET are answered, the kernel recovers, "
            "sg_reset -d during fio, no data lost",
            [{"backend": "file", "size": "256M", "slowable": True}],
            portals=1,
            timeout=300,
            tgt=False,
            tgt_reason="it needs a LU made slow on demand (ironsan's test-delay build)"),
        Scenario(
            "chap",
            "CHAP and mutual CHAP logins from the kernel; no credentials, a wrong secret and a "
            "target that cannot prove itself are refused",
            [{"backend": "mem", "size": "16M"}],
            portals=1,
            env={"CHAP_USER": "guest-host", "CHAP_SECRET": "guest-secret-0123",
                 "MUTUAL_USER": "ironsan-tgt", "MUTUAL_SECRET": "target-secret-4567"},
            target_extra='chap = { user = "guest-host", secret = "guest-secret-0123" }\n'
                         'mutual_chap = { user = "ironsan-tgt", secret = "target-secret-4567" }\n',
            timeout=120),
        Scenario(
            "nvme",
            "NVMe/TCP from the kernel's host (nvme-tcp, nvme-cli): discover lists the "
            "subsystem; connect without and with header and data digests; the namespace's "
            "size and identity (id-ctrl, id-ns, ns-descs); a LUN added and removed while "
            "connected appears and goes as namespace 2 without a rescan (Namespace Attribute "
            "Changed notices); ext4 and xfs with fio --verify, "
            "fstrim shrinks the backing file, fsck clean; a second path; disconnect",
            [{"backend": "file", "size": "512M"}],
            nvme=True,
            env={"NVME_SIZE": str(512 << 20)},
            timeout=420,
            tgt=False,
            tgt_reason="tgt has no NVMe/TCP"),
        Scenario(
            "nvme-nvmet",
            "the nvme scenario against the kernel's own NVMe/TCP target inside the guest "
            "(nvmet-tcp on 127.0.0.1:4420 and :4421, a 512 MiB file on xfs on a RAM disk), "
            "for reference",
            [{"backend": "mem", "size": "16M"}],
            portals=1,
            script="nvme",
            env={"NVME_TARGET": "nvmet", "NVME_NQN": NQN, "NVME_NSID": "1",
                 "NVME_ADDR0": "127.0.0.1", "NVME_PORT0": "4420",
                 "NVME_ADDR1": "127.0.0.1", "NVME_PORT1": "4421",
                 "NVME_SIZE": str(512 << 20)},
            timeout=420,
            tgt=False,
            tgt_reason="the guest serves itself (nvmet)"),
        Scenario(
            "nvme-multipath",
            "native NVMe multipath (nvme_core multipath=Y, iopolicy round-robin) over both "
            "NVMe/TCP ports, fio --verify on the namespace's raw device while ALUA group 2 "
            "(port 2's ANA state) goes standby (inaccessible) and back to active-optimized "
            "with `ironsan admin set-alua`, then while port 1 is taken away (its connection "
            "closed, new ones refused: the harness's nvme-cut) and given back: no I/O error, "
            "the other path carries the I/O meanwhile, both carry it before and after",
            [{"backend": "mem", "size": "256M"}],
            nvme=True,
            extra='[alua]\nexplicit = true\n'
                  '[[alua.group]]\nid = 1\nportals = [1]\nstate = "active-optimized"\n'
                  '[[alua.group]]\nid = 2\nportals = [2]\nstate = "active-optimized"\n',
            timeout=240,
            tgt=False,
            tgt_reason="tgt has no NVMe/TCP"),
        Scenario(
            "nvme-restart",
            "NVMe/TCP (one path, ctrl-loss-tmo 120 s, reconnect-delay 1 s) with fio --verify "
            "on the raw namespace while ironsan is killed -9 and started again: the kernel "
            "reconnects by itself, fio completes without an error, and data written before "
            "the kill verifies after it (a file LUN)",
            [{"backend": "file", "size": "256M"}],
            nvme=True,
            portals=1,
            timeout=240,
            tgt=False,
            tgt_reason="tgt has no NVMe/TCP"),
        Scenario(
            "nvme-auth",
            "NVMe in-band authentication (DH-HMAC-CHAP) from the kernel's host on Linux 6.12 "
            "(bookworm-backports; 6.1 has none): a target with `dhchap` refuses a connect "
            "without a secret and with a wrong one, admits the right one on every queue (I/O "
            "verified), admits bidirectional authentication when the controller proves its "
            "secret, and the host refuses a controller that proves another; the live queues "
            "re-authenticate during fio --verify without an error; the target also requires "
            "iSCSI CHAP",
            [{"backend": "mem", "size": "64M"}],
            nvme=True,
            portals=1,
            env={"DHCHAP_SECRET": DHCHAP_HOST, "DHCHAP_CTRL_SECRET": DHCHAP_CTRL,
                 "DHCHAP_WRONG": DHCHAP_WRONG},
            target_extra=f'chap = {{ user = "guest-host", secret = "guest-secret-0123" }}\n'
                         f'dhchap = {{ secret = "{DHCHAP_HOST}", ctrl_secret = "{DHCHAP_CTRL}" }}\n',
            timeout=180,
            tgt=False,
            tgt_reason="tgt has no NVMe/TCP",
            kernel="backports"),
        Scenario(
            "blktests",
            "blktests' nvme group (its source in $IRONSAN_BLKTESTS) pointed at ironsan through "
            "its NVME_TARGET_CONTROL hook: each test's subsystem is a target ironsan adds "
            "(`admin add-target`: a file LUN of blktests' NVME_IMG_SIZE with the test's UUID, the guest's host NQN "
            "allowed) and removes at the test's cleanup; every test that applies passes, those "
            "that do not say why (blktests' own 'not run' reasons); then its device tests "
            "(TEST_DEVS) on a 1 GiB RAM LUN's namespace",
            [{"backend": "mem", "size": "1G"}],
            nvme=True,
            portals=1,
            env={"BLKTESTS_TESTS": os.environ.get("BLKTESTS_TESTS", "nvme")},
            timeout=3600,
            tgt=False,
            tgt_reason="tgt has no NVMe/TCP",
            # Half an hour and more under TCG, and its source is fetched by
            # hand: run when named (scripts/test.sh says how).
            default=False,
            blktests=True,
            # IRONSAN_BLKTESTS_KERNEL=backports: on Linux 6.12, where the
            # DH-HMAC-CHAP tests (nvme/041) apply.
            kernel=os.environ.get("IRONSAN_BLKTESTS_KERNEL") or None),
    ]


def blktests_source():
    """The blktests source tree to run ($IRONSAN_BLKTESTS: a checkout, or
    a directory with its `check`), or why there is none. blktests is
    packaged in no registry this project's CI reaches."""
    d = os.environ.get("IRONSAN_BLKTESTS", "")
    if not d:
        return None, ("blktests is not packaged; fetch its source "
                      "(https://github.com/linux-blktests/blktests) and set IRONSAN_BLKTESTS=DIR")
    if not os.path.isfile(os.path.join(d, "check")):
        return None, f"IRONSAN_BLKTESTS={d} has no blktests `check` script"
    return d, None


class Control(threading.Thread):
    """The guest's line-based requests to the host (10.0.2.200:9000)."""

    def __init__(self, target, log):
        super().__init__(daemon=True)
        self.target = target
        self.log = log
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]

    def run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                line = b""
                while not line.endswith(b"\n"):
                    b = c.recv(4096)
                    if not b:
                        break
                    line += b
                req = line.decode(errors="replace").strip()
                try:
                    ans = self.handle(req)
                except Exception as e:  # reported to the guest, which fails its step
                    ans = f"ERR {e}"
                # DH-HMAC-CHAP secrets (blktests-setup) stay out of the log.
                shown = re.sub(r"DHHC-1:\d\d:[^ :]+:", "DHHC-1:…:(redacted):", req)
                self.log(f"host: {shown!r} -> {ans!r}")
                c.sendall((ans + "\n").encode())

    def handle(self, req):
        words = req.split()
        if not words:
            return "ERR empty request"
        op, args = words[0], words[1:]
        t = self.target
        if op == "ping":
            return "OK"
        if op == "kill":
            # kill [N]: kill -9 the target (gateway N of several).
            t.kill(*[int(a) for a in args])
            return "OK"
        if op == "start":
            t.start(*[int(a) for a in args])
            return "OK"
        if op == "signal":
            # signal N STOP|CONT: pause or resume gateway N.
            t.signal(int(args[0]), args[1])
            return "OK"
        if op == "port":
            return f"OK 127.0.0.1:{t.ports[int(args[0])]}"
        if op == "admin":
            ok, out = t.admin(args)
            return ("OK " if ok else "ERR ") + out.replace("\n", " | ")
        if op == "slow":
            # slow LUN MS: every read and write of LUN waits MS first.
            with open(t.luns[int(args[0])]["test_delay_file"], "w") as f:
                f.write(args[1])
            time.sleep(0.3)  # the backend re-reads the file every 100 ms
            return "OK"
        if op == "log":
            # log PATTERN…: how many lines of the target's log hold it.
            with open(os.path.join(t.work, "target.log"), errors="replace") as f:
                pattern = " ".join(args)
                n = sum(1 for line in f if pattern in line)
            return f"OK {n}"
        if op == "nvme-port":
            # nvme-port N: the address NVMe/TCP port N listens on.
            return f"OK 127.0.0.1:{t.nvme_ports[int(args[0])]}"
        if op == "nvme-cut":
            # nvme-cut N: NVMe/TCP port N gone (its connections closed, new
            # ones closed at once) until nvme-restore N.
            i = int(args[0])
            n = nvme_cut(t.work, i, t.nvme_ports[i])
            return f"OK {n} connection(s) closed"
        if op == "nvme-restore":
            i = int(args[0])
            t.nvme_ports[i]  # (an IndexError for a port that is not there)
            try:
                os.unlink(os.path.join(t.work, f"nvme-cut{i}"))
            except FileNotFoundError:
                pass
            return "OK"
        if op == "blktests-setup":
            # blktests-setup NQN UUID HOSTNQN SIZE [HOSTKEY CTRLKEY]: a target
            # whose subsystem is NQN, one file LUN of SIZE (blktests'
            # NVME_IMG_SIZE: 350m, 1G …) with namespace UUID UUID, HOSTNQN
            # allowed, DH-HMAC-CHAP secrets when the keys are not "-"
            # (scripts/guest/blktests-target-control).
            nqn, uuid, hostnqn, size = args[:4]
            keys = (args[4:6] + ["-", "-"])[:2]
            m = re.fullmatch(r"(\d+)([kmgt]?)", size.lower())
            if not m:
                return f"ERR size {size!r}"
            size = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2)]
            name = blktests_target(nqn)
            img = os.path.join(t.state, "luns", f"{name.rsplit(':', 1)[1]}.img")
            os.makedirs(os.path.dirname(img), exist_ok=True)
            auth = []
            for flag, key, suffix in zip(("--dhchap-secret-file", "--dhchap-ctrl-secret-file"),
                                         keys, ("dhchap", "dhchap-ctrl")):
                if key != "-":
                    # A file under the state directory (the admin API's
                    # secret roots), readable by its owner only.
                    path = os.path.join(t.state, f"{name.rsplit(':', 1)[1]}.{suffix}")
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    with os.fdopen(fd, "w") as f:
                        f.write(key + "\n")
                    auth += [flag, path]
            ok, out = t.admin(["add-target", name, "--nqn", nqn,
                               "--lun", f"file:{img}:{size},uuid={uuid}", "--nvme-allow", hostnqn]
                              + auth)
            return ("OK " if ok else "ERR ") + out.replace("\n", " | ")
        if op == "blktests-cleanup":
            name = blktests_target(args[0])
            ok, out = t.admin(["remove-target", name])
            img = os.path.join(t.state, "luns", f"{name.rsplit(':', 1)[1]}.img")
            if os.path.exists(img):
                os.unlink(img)
            return ("OK " if ok else "ERR ") + out.replace("\n", " | ")
        if op == "other-host":
            # other-host read|write NQN: 64 KiB of 4 KiB I/Os to namespace 1
            # of subsystem NQN through NVMe/TCP port 0 by another host
            # (ironsan bench's userspace initiator, a Host Identifier of
            # its own): "OK <exit status> <last line of its errors>".
            rw, nqn = args[0], args[1]
            if rw not in ("read", "write"):
                return f"ERR {rw!r}"
            url = f"nvme-tcp://127.0.0.1:{t.nvme_ports[0]}/{nqn}/1"
            r = subprocess.run(
                [t.bin, "bench", url, "--rw", rw, "--bs", "4k", "--size", "64k",
                 "--iodepth", "1"],
                capture_output=True, text=True, timeout=60,
                env=dict(os.environ, RUST_BACKTRACE="0"))
            lines = r.stderr.strip().splitlines() or [""]
            # The first NVMe status met, else the last line.
            last = next((l for l in lines if "NVMe status" in l), lines[-1])
            return f"OK {r.returncode} {last}"
        if op == "allocated":
            st = os.stat(t.luns[int(args[0])]["path"])
            return f"OK {st.st_blocks * 512}"
        return f"ERR unknown request {op}"


def blktests_target(nqn):
    """The iSCSI name of the target serving blktests' subsystem NQN."""
    tail = re.sub(r"[^a-z0-9.-]", "-", nqn.lower())[:200]
    return f"iqn.2026-12.io.ironsan:bt-{tail}"


def nvme_forward(work, i, port):
    """The guestfwd command of NVMe/TCP port i: a script (slirp splits the
    command at spaces and runs no shell) that records its PID and becomes
    `socat - TCP:127.0.0.1:PORT`, or, while the port is cut (`nvme-cut`
    from the guest), ends at once: the guest's connection is accepted and
    closed, the nearest a user network comes to a port that is gone."""
    path = os.path.join(work, f"nvme-fwd{i}.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                f"[ -e {work}/nvme-cut{i} ] && exit 0\n"
                f"echo $$ >> {work}/nvme-fwd{i}.pids\n"
                f"exec socat -lf /dev/null - TCP:127.0.0.1:{port},nodelay\n")
    os.chmod(path, 0o755)
    return path


def nvme_cut(work, i, port):
    """NVMe/TCP port i taken away: new connections through it are closed
    at once and the live ones end (their socat killed, by the PIDs the
    forward recorded; a PID is killed only while it is still that socat)."""
    open(os.path.join(work, f"nvme-cut{i}"), "w").close()
    killed = 0
    try:
        with open(os.path.join(work, f"nvme-fwd{i}.pids")) as f:
            pids = [int(l) for l in f if l.strip()]
    except FileNotFoundError:
        pids = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if f"TCP:127.0.0.1:{port}," in cmd:
                os.kill(pid, signal.SIGKILL)
                killed += 1
        except (FileNotFoundError, ProcessLookupError):
            pass
    return killed


def run_scenario(sc, args, image, binary, keep):
    work = tempfile.mkdtemp(prefix=f"ironsan-guest-{sc.name}-")
    serial_path = os.path.join(work, "serial.log")
    serial = open(serial_path, "w")
    lines = []

    def log(msg):
        serial.write(msg + "\n")
        serial.flush()

    kind = Tgt if args.target == "tgt" else Gateways if sc.gateways else Ironsan
    target = kind(binary, work, sc)
    try:
        target.start()
    except RuntimeError as e:
        # Nothing for the guest to do: the scenario fails with the reason.
        target.stop()
        log(f"host: the target did not start: {e}")
        return {"name": sc.name, "ok": False, "elapsed": 0, "boot": None,
                "steps": [("target", "FAIL", str(e))], "fails": [f"target did not start: {e}"],
                "facts": {}, "infos": [], "work": work, "kept": work}
    ctl = Control(target, log)
    ctl.start()

    env = {"IQN": IQN, "NPORTALS": str(sc.portals),
           "LUNBASE": "1" if args.target == "tgt" else "0"}
    for i in range(sc.portals):
        env[f"P{i}"] = f"{GUEST_PORTALS[i]}:3260"
    if sc.nvme:
        # NVMe/TCP: the subsystem and LUN 0's namespace (NSID = LUN + 1)
        # at each forwarded address.
        env.update({"NVME_TARGET": "ironsan", "NVME_NQN": NQN, "NVME_NSID": "1"})
        for i in range(sc.portals):
            env[f"NVME_ADDR{i}"] = GUEST_PORTALS[i]
            env[f"NVME_PORT{i}"] = str(NVME_PORT)
    env.update(sc.env)
    scen = os.path.join(HERE, "scenarios", sc.script + ".sh")
    tree = os.path.join(work, "cpio")
    os.makedirs(tree)
    shutil.copy(scen, os.path.join(tree, "scenario.sh"))
    if sc.blktests:
        src, _ = blktests_source()
        shutil.copytree(src, os.path.join(tree, "blktests"), symlinks=True,
                        ignore=shutil.ignore_patterns(".git", "results"))
        dst = os.path.join(tree, "blktests-target-control")
        shutil.copy(os.path.join(HERE, "blktests-target-control"), dst)
        os.chmod(dst, 0o755)
        rev = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        with open(os.path.join(tree, "blktests", "REVISION"), "w") as f:
            f.write(rev or "unknown")
    if sc.nvme or sc.script.startswith("nvme"):
        # Helpers the NVMe/TCP scenarios share (scenarios/nvme-lib.sh).
        shutil.copy(os.path.join(HERE, "scenarios", "nvme-lib.sh"),
                    os.path.join(tree, "nvme-lib.sh"))
    for path, content in (sc.files(target) if sc.files else {}).items():
        dst = os.path.join(tree, path.lstrip("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "w") as f:
            f.write(content)
    with open(os.path.join(tree, "scenario.env"), "w") as f:
        for k, v in env.items():
            f.write(f"{k}='{v}'\n")
    initrd = os.path.join(work, "initrd.img")
    with open(initrd, "wb") as out:
        with open(os.path.join(image, "base.cpio.gz"), "rb") as base:
            shutil.copyfileobj(base, out)
        if sc.blktests:
            with open(os.path.join(image, "tools.cpio.gz"), "rb") as tools:
                shutil.copyfileobj(tools, out)
        cp = subprocess.run("find . | cpio -o -H newc --quiet | gzip -1", shell=True,
                            cwd=tree, capture_output=True, check=True)
        out.write(cp.stdout)

    # slirp runs the command with the guest's connection as stdin, stdout
    # and stderr: socat must log elsewhere, or its "connection refused"
    # (a portal that is down) reaches the initiator as a PDU.
    socat = "socat -lf /dev/null -"
    fwd = ",".join(
        f"guestfwd=tcp:{GUEST_PORTALS[i]}:3260-cmd:{socat} TCP:127.0.0.1:{p},,nodelay"
        for i, p in enumerate(target.ports))
    fwd += "".join(
        f",guestfwd=tcp:{GUEST_PORTALS[i]}:{NVME_PORT}-cmd:{nvme_forward(work, i, p)}"
        for i, p in enumerate(getattr(target, "nvme_ports", [])))
    fwd += f",guestfwd=tcp:10.0.2.200:9000-cmd:{socat} TCP:127.0.0.1:{ctl.port}"
    cmd = [args.qemu, "-accel", "tcg", "-cpu", "max", "-m", "2048", "-smp", "1",
           "-kernel", os.path.join(image, "vmlinuz"), "-initrd", initrd,
           "-append", "console=ttyS0 panic=-1 quiet loglevel=4",
           "-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
           "-netdev", f"user,id=n0,restrict=on,{fwd}", "-device", "virtio-net-pci,netdev=n0"]
    t0 = time.time()
    q = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)
    timer = threading.Timer(sc.timeout, lambda: q.kill())
    timer.start()
    steps, fails, facts, infos = [], [], {}, []
    done = None
    booted = None
    for raw in q.stdout:
        line = raw.decode(errors="replace").rstrip("\r\n")
        log(line)
        m = re.search(r"GUEST (STEP|PASS|FAIL|INFO|FACT|DONE|BOOTED) ?(.*)", line)
        if not m:
            continue
        kind, rest = m.groups()
        if kind == "PASS":
            name, ms = (rest.split() + ["0"])[:2]
            steps.append((name, "PASS", int(ms)))
            if args.verbose:
                print(f"    {name}: PASS ({int(ms) / 1000:.1f} s)", flush=True)
        elif kind == "FAIL":
            name, _, why = rest.partition(" ")
            steps.append((name, "FAIL", why))
            fails.append(f"{name}: {why}")
            print(f"    {name}: FAIL {why}", flush=True)
        elif kind == "FACT":
            parts = rest.split(" ", 2)
            if len(parts) == 3:
                facts.setdefault(parts[0], {})[parts[1]] = parts[2]
        elif kind == "INFO":
            infos.append(rest)
        elif kind == "BOOTED":
            booted = time.time() - t0
        elif kind == "DONE":
            done = rest
    q.wait()
    timer.cancel()
    elapsed = time.time() - t0
    target.stop()
    ctl.sock.close()
    if booted is None and q.returncode not in (0, None) and elapsed < 30 and not steps:
        # qemu itself could not start (no TCG, a missing ROM, …): nothing
        # was tested, and that is said, not passed.
        with open(serial_path) as f:
            why = " | ".join(l.strip() for l in f.read().splitlines()[-3:] if l.strip())
        return {"name": sc.name, "skipped": f"qemu could not start (exit {q.returncode}): {why}",
                "ok": True, "elapsed": elapsed, "boot": None, "steps": [], "fails": [],
                "facts": {}, "infos": [], "work": work}
    # The facts the scenario expects of the kernel's view.
    for lun, want in sc.facts.items():
        got = facts.get(lun, {})
        for k, v in want.items():
            if got.get(k) != v:
                fails.append(f"fact {lun} {k}: kernel shows {got.get(k)!r}, LU advertises {v!r}")
                steps.append((f"fact-{lun}-{k}", "FAIL", got.get(k)))
    if sc.rules:
        for f in sc.rules(facts):
            fails.append(f)
            steps.append(("rules", "FAIL", f))
    if done is None:
        fails.append(f"the guest did not finish (timeout {sc.timeout} s or crash)")
    ok = not fails
    result = {
        "name": sc.name, "ok": ok, "elapsed": elapsed, "boot": booted, "steps": steps,
        "fails": fails, "facts": facts, "infos": infos, "work": work,
    }
    if ok and not keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        result["kept"] = work
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="*",
                    help="scenarios to run (default: all but those run only when named)")
    ap.add_argument("--target", default="ironsan", choices=["ironsan", "tgt"],
                    help="tgt: the same scenarios against Debian's tgt, for comparison "
                         "(reports where it fails; exits 0)")
    ap.add_argument("--cache", default=None, help="guest image cache (scripts/guest/build.sh)")
    ap.add_argument("--keep", action="store_true", help="keep every run's logs, not only failures'")
    ap.add_argument("--list", action="store_true", help="list the scenarios")
    ap.add_argument("--verbose", "-v", action="store_true", help="print every step")
    ap.add_argument("--qemu", default="qemu-system-x86_64")
    ap.add_argument("--binary", default=None,
                    help="an ironsan binary to serve with, instead of building the test build "
                         "(the tmf scenario needs the test-delay feature)")
    args = ap.parse_args()
    all_sc = scenario_list()
    if args.list:
        for s in all_sc:
            print(f"{s.name}: {s.doc}" + ("" if s.default else " (run only when named)"))
        return 0
    chosen = [s for s in all_sc if s.name in args.scenarios or not args.scenarios and s.default]
    unknown = set(args.scenarios) - {s.name for s in all_sc}
    if unknown:
        print(f"guest: unknown scenarios {sorted(unknown)}; --list lists them", file=sys.stderr)
        return 2
    build = [os.path.join(HERE, "build.sh")] + ([args.cache] if args.cache else [])
    b = subprocess.run(build, stdout=subprocess.PIPE, text=True)
    if b.returncode != 0:
        print("guest: SKIPPED: the guest image could not be built (see above)")
        return 0 if os.environ.get("IRONSAN_GUEST_REQUIRED") != "1" else 1
    image = b.stdout.strip().splitlines()[-1]
    images = {}
    if not shutil.which(args.qemu):
        print(f"guest: SKIPPED: {args.qemu} not found")
        return 0 if os.environ.get("IRONSAN_GUEST_REQUIRED") != "1" else 1
    if args.binary:
        binary = os.path.abspath(args.binary)
    else:
        target_dir = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
        # The test-delay feature adds only the LUN key the task management
        # scenario uses to make a LU slow on demand.
        subprocess.run(["cargo", "build", "-q", "-p", "ironsan", "--features", "test-delay"],
                       cwd=ROOT, check=True)
        binary = os.path.join(target_dir, "debug", "ironsan")
    kver = open(os.path.join(image, "kernel-version")).read().strip()
    print(f"guest: Linux {kver} under qemu TCG (functional figures, not performance); "
          f"target {args.target}")
    results = []
    skipped = 0
    if args.target == "tgt" and not shutil.which("tgtd"):
        print("guest: SKIPPED: tgtd not found (Debian package tgt)")
        return 0
    for sc in chosen:
        if sc.gateways and not os.environ.get("CEPH_CONF"):
            print(f"guest: {sc.name}: SKIPPED: needs a Ceph cluster ($CEPH_CONF); "
                  "scripts/rbd.sh runs it on its own, by hand: CEPH_CONF=… "
                  f"scripts/guest/run.py {sc.name} (scripts/ceph-cluster.sh up DIR)", flush=True)
            skipped += 1
            continue
        if args.target == "tgt" and not sc.tgt:
            print(f"guest: {sc.name}: not run against tgt: {sc.tgt_reason}", flush=True)
            continue
        if sc.blktests and blktests_source()[1]:
            print(f"guest: {sc.name}: SKIPPED: {blktests_source()[1]}", flush=True)
            skipped += 1
            continue
        sc_image = image
        if sc.kernel:
            if sc.kernel not in images:
                env = dict(os.environ, IRONSAN_GUEST_KERNEL=sc.kernel)
                b = subprocess.run(build, stdout=subprocess.PIPE, text=True, env=env)
                images[sc.kernel] = b.stdout.strip().splitlines()[-1] if b.returncode == 0 else None
            sc_image = images[sc.kernel]
            if sc_image is None:
                print(f"guest: {sc.name}: SKIPPED: the {sc.kernel} kernel's image could not be "
                      "built (see above)", flush=True)
                if os.environ.get("IRONSAN_GUEST_REQUIRED") == "1":
                    results.append({"name": sc.name, "ok": False, "steps": [], "boot": None})
                skipped += 1
                continue
            kv = open(os.path.join(sc_image, "kernel-version")).read().strip()
            print(f"guest: {sc.name}: on Linux {kv} ({sc.kernel})", flush=True)
        print(f"guest: {sc.name}: {sc.doc}", flush=True)
        r = run_scenario(sc, args, sc_image, binary, args.keep)
        if "skipped" in r:
            print(f"guest: {sc.name}: SKIPPED: {r['skipped']}", flush=True)
            skipped += 1
            continue
        results.append(r)
        passed = sum(1 for s in r["steps"] if s[1] == "PASS")
        boot = f", booted in {r['boot']:.1f} s" if r["boot"] else ""
        print(f"guest: {sc.name}: {'PASS' if r['ok'] else 'FAIL'} "
              f"({passed} steps passed, {len(r['fails'])} failed, {r['elapsed']:.0f} s{boot})",
              flush=True)
        for f in r["fails"]:
            print(f"guest:   {f}")
        if "kept" in r:
            print(f"guest:   logs: {r['kept']} (serial.log, target.log)")
    failed = [r["name"] for r in results if not r["ok"]]
    print(f"guest: {len(results) - len(failed)}/{len(results)} scenarios passed"
          + (f", {skipped} skipped" if skipped else "")
          + (f"; failed: {' '.join(failed)}" if failed else ""))
    if args.target == "tgt":
        return 0
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
