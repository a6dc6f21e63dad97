#!/usr/bin/env python3
"""Scale and cost checks of `ironsan serve` (docs/PERFORMANCE.md):

1. 64 sessions x queue depth 32 at once: no errors, aggregate IOPS not below
   one session's.
2. One session with a command window of 8192 and 8192 commands in flight.
3. Target RSS with 64 idle sessions (logged in, no I/O): under 64 MiB
   beyond LUN memory (null LUN: no LUN memory at all); and their CPU:
   under 2 % of a core (connections busy-poll only right after work).
4. Rounds of 1000 sessions logged in at once and then closed (--rounds,
   default 5): target RSS after the last round within 10 % (+4 MiB) of
   after the first; memory freed at teardown goes back to the system.
5. With --soak SECONDS: RSS sampled every 10 s under full load; the last
   samples must not exceed the first by more than 10 %.

Usage: scale.py --ironsan target/release/ironsan [--secs 5] [--rounds 5] [--soak 600]
"""

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

IQN = "iqn.2026-11.io.ironsan:scale"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_secs(pid):
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def login(port, isid):
    """A minimal login (operational stage straight to full feature phase)."""
    s = socket.create_connection(("127.0.0.1", port))
    text = b"".join(k + b"=" + v + b"\0" for k, v in [
        (b"InitiatorName", b"iqn.2026-11.io.ironsan:scale-probe"), (b"TargetName", IQN.encode()),
        (b"SessionType", b"Normal"), (b"HeaderDigest", b"None"), (b"DataDigest", b"None"),
        (b"MaxRecvDataSegmentLength", b"262144")])
    bhs = bytearray(48)
    bhs[0] = 0x43
    bhs[1] = 0x87  # T, CSG=1, NSG=3
    bhs[5:8] = len(text).to_bytes(3, "big")
    bhs[8:14] = b"\x80" + isid.to_bytes(5, "big")
    struct.pack_into(">I", bhs, 16, isid)
    struct.pack_into(">I", bhs, 24, 1)
    pad = (4 - len(text) % 4) % 4
    s.sendall(bytes(bhs) + text + b"\0" * pad)
    hdr = b""
    while len(hdr) < 48:
        chunk = s.recv(48 - len(hdr))
        if not chunk:
            raise RuntimeError("login refused (connection closed)")
        hdr += chunk
    if hdr[36] != 0:
        raise RuntimeError(f"login refused: {hdr[36]:#x}/{hdr[37]:#x}")
    dlen = int.from_bytes(hdr[5:8], "big")
    need = dlen + (4 - dlen % 4) % 4
    while need > 0:
        need -= len(s.recv(need))
    return s


def session_rounds(pid, port, rounds, n=1000):
    """RSS (KiB) after each round of `n` sessions logged in at once (from 8
    threads) and then closed."""
    after = []
    for r in range(rounds):
        socks = [None] * n

        def work(lo, hi):
            for i in range(lo, hi):
                socks[i] = login(port, 0x100000 + i)

        ts = [threading.Thread(target=work, args=(k * n // 8, (k + 1) * n // 8)) for k in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if any(s is None for s in socks):
            raise RuntimeError(f"round {r + 1}: not every session logged in")
        peak = rss_kib(pid)
        for s in socks:
            s.close()
        time.sleep(3)
        after.append(rss_kib(pid))
        print(f"  round {r + 1}: {n} sessions, RSS {peak / 1024:.1f} MiB logged in, {after[-1] / 1024:.1f} MiB after")
    return after


def bench(a, port, lun, jobs, depth, secs):
    url = f"iscsi://127.0.0.1:{port}/{IQN}/{lun}"
    r = subprocess.run([a.ironsan, "bench", "--json", "--runtime", f"{secs}s", "--numjobs", str(jobs), "--iodepth",
                        str(depth), url], capture_output=True, text=True, timeout=secs + 120)
    if r.returncode != 0:
        return None, r.stderr.strip() or r.stdout.strip()
    j = json.loads(r.stdout)["jobs"][0]["read"]
    return j, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ironsan", required=True)
    ap.add_argument("--secs", type=int, default=5)
    ap.add_argument("--soak", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    port = free_port()
    srv = subprocess.Popen([a.ironsan, "--log", "warn", "serve", "--listen", f"127.0.0.1:{port}", "--target", IQN,
                            "--lun", "null:1G", "--lun", "mem:256M", "--queue-depth", "8192"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ok = True
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        base = rss_kib(srv.pid)
        one, err = bench(a, port, 0, 1, 32, a.secs)
        many, err2 = bench(a, port, 0, 64, 32, a.secs)
        if one is None or many is None:
            print(f"FAILED: bench error: {err or err2}")
            ok = False
        else:
            good = many["errors"] == 0 and many["iops"] >= one["iops"]
            ok &= good
            print(f"64 sessions x QD32: {many['iops'] / 1e3:.0f}K IOPS, {many['errors']} errors; "
                  f"1 session x QD32: {one['iops'] / 1e3:.0f}K IOPS -> {'met' if good else 'MISSED'}")
        deep, err = bench(a, port, 0, 1, 8192, a.secs)
        good = deep is not None and deep["errors"] == 0 and deep["total_ios"] > 8192
        ok &= good
        print(f"1 session, window 8192, 8192 in flight: "
              f"{(deep or {}).get('iops', 0) / 1e3:.0f}K IOPS, {(deep or {}).get('errors', err)} errors -> {'met' if good else 'MISSED'}")
        socks = [login(port, 0x1000 + i) for i in range(64)]
        time.sleep(1)
        idle = rss_kib(srv.pid)
        good = idle < 64 * 1024
        ok &= good
        print(f"RSS with 64 idle sessions: {idle / 1024:.1f} MiB (at start {base / 1024:.1f} MiB) -> {'met' if good else 'MISSED'}")
        c0, t0 = cpu_secs(srv.pid), time.time()
        time.sleep(3)
        busy = (cpu_secs(srv.pid) - c0) / (time.time() - t0)
        good = busy < 0.02
        ok &= good
        print(f"CPU with 64 idle sessions: {busy * 100:.2f} % of a core -> {'met' if good else 'MISSED'}")
        for s in socks:
            s.close()
        if a.rounds:
            after = session_rounds(srv.pid, port, a.rounds)
            good = after[-1] <= after[0] * 1.1 + 4096
            ok &= good
            print(f"RSS over {a.rounds} rounds of 1000 concurrent sessions: {after[0] / 1024:.1f} MiB after the first, "
                  f"{after[-1] / 1024:.1f} MiB after the last -> {'met' if good else 'MISSED'}")
        if a.soak:
            samples = []
            url = f"iscsi://127.0.0.1:{port}/{IQN}/1"
            load = subprocess.Popen([a.ironsan, "bench", "--runtime", f"{a.soak}s", "--numjobs", "4", "--iodepth", "32",
                                     "--rw", "randrw", url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            t0 = time.time()
            while load.poll() is None:
                samples.append(rss_kib(srv.pid))
                time.sleep(10)
            first = max(samples[1:4]) if len(samples) > 4 else samples[0]
            last = max(samples[-3:])
            good = last <= first * 1.1 + 1024
            ok &= good
            print(f"soak {time.time() - t0:.0f}s under load: RSS {first / 1024:.1f} MiB early, {last / 1024:.1f} MiB late "
                  f"(max {max(samples) / 1024:.1f}) -> {'met' if good else 'MISSED'}")
    finally:
        srv.terminate()
        srv.wait(15)
    print("scale: all bars met" if ok else "scale: some bars MISSED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
