#!/usr/bin/env python3
"""Runs libiscsi's iscsi-test-cu against ironsan and judges the result.

Starts `ironsan serve` with a 64 MiB RAM LUN on two loopback portals, runs
`iscsi-test-cu -d -t ALL URL1 URL2` (both URLs reach the same LU, so
MultipathIO runs), prints every test as passed / skipped / failed with
per-suite and overall totals (a skip is not a pass), and exits non-zero
when a test listed in the expectations file did not pass.

--physical-block-size BYTES gives the LUN larger physical blocks (4096:
a 512e LUN, 8 logical blocks per physical block), which the tests that
need LBPPB >= 2 require. --known-defects FILE lists tests whose own
expectations contradict the standard for this configuration, one per line
as `Suite.Test  reason`: they are reported on their own with the reason,
whatever their result, and counted neither as passes nor as failures.

Usage: conformance.py --ironsan PATH [--expect FILE] [--digest off|required]
                      [--physical-block-size BYTES] [--known-defects FILE]
                      [--tests PATTERN] [--log FILE] [--update FILE]
                      [--lun SPEC]   (another LU, e.g. rbd:rbd/ironsan; default mem:SIZE)
"""

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import OrderedDict


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_listening(port, proc, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"ironsan exited early with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"ironsan is not listening on {port}")


def parse(output, reasons=None):
    """CUnit 'basic' verbose output -> OrderedDict[(suite, test)] = state.

    The result word (passed / FAILED) follows '...' on the Test line or starts
    a later line at column 0; log lines in between start with spaces. A skip
    is a pass with a '[SKIPPED]' log line in between; its text goes into
    `reasons[(suite, test)]` when a dict is given.
    """
    results = OrderedDict()
    suite = None
    current = None
    skipped = False
    if reasons is None:
        reasons = {}
    for line in output.splitlines():
        m = re.match(r"^Suite: (.*)$", line)
        if m:
            suite = m.group(1).strip()
            current = None
            continue
        m = re.match(r"^  Test: (.*?) \.\.\.(.*)$", line)
        if m:
            current = (suite, m.group(1).strip())
            rest = m.group(2)
            # Text after the result word on this line is suite clean-up;
            # otherwise it is the test's first log line, which may be the
            # skip notice itself.
            word = rest.split(" ")[0]
            if word in ("passed", "FAILED"):
                results[current] = "failed" if word == "FAILED" else "passed"
                current = None
            else:
                skipped = "[SKIPPED]" in rest
                if skipped:
                    reasons.setdefault(current, skip_reason(rest))
            continue
        if current is None:
            continue
        if line.startswith("passed"):
            results[current] = "skipped" if skipped else "passed"
            current = None
        elif line.startswith("FAILED"):
            results[current] = "failed"
            current = None
        elif "[SKIPPED]" in line:
            skipped = True
            reasons.setdefault(current, skip_reason(line))
    return results


def skip_reason(line):
    """The text after '[SKIPPED]', without the leading punctuation."""
    return line.split("[SKIPPED]", 1)[1].strip(" .:-")


def read_defects(path):
    """`Suite.Test  reason` lines ('#' comments) -> {(suite, test): reason}."""
    defects = OrderedDict()
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if "." not in name or not reason.strip():
            sys.exit(f"{path}: expected 'Suite.Test  reason', got {line!r}")
        defects[tuple(name.split(".", 1))] = reason.strip()
    return defects


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ironsan", required=True)
    ap.add_argument("--expect", help="file of Suite.Test names that must pass")
    ap.add_argument("--digest", default="off", choices=["off", "allowed", "required"],
                    help="the target's header digest policy (libiscsi has no data digests)")
    ap.add_argument("--tests", default="ALL")
    ap.add_argument("--size", default="64M")
    ap.add_argument("--physical-block-size", type=int,
                    help="the LUN's physical block size in bytes (4096: 512e)")
    ap.add_argument("--known-defects",
                    help="file of 'Suite.Test  reason' lines: tests that contradict the standard here")
    ap.add_argument("--lun", help="the LU to test as an ironsan --lun spec (default mem:SIZE)")
    ap.add_argument("--log", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "conformance.log"))
    ap.add_argument("--update", help="write the passing tests to this file")
    ap.add_argument("--timeout", type=int, default=900)
    a = ap.parse_args()
    defects = read_defects(a.known_defects) if a.known_defects else OrderedDict()
    lun = a.lun or f"mem:{a.size}"
    if a.physical_block_size:
        lun += f",physical_block_size={a.physical_block_size}"

    p1, p2 = free_port(), free_port()
    iqn = "iqn.2026-11.io.ironsan:conformance"
    os.makedirs(os.path.dirname(a.log) or ".", exist_ok=True)
    tlog = open(a.log + ".target", "w")
    target = subprocess.Popen(
        [a.ironsan, "--log", "warn", "serve", "--listen", f"127.0.0.1:{p1}", "--listen", f"127.0.0.1:{p2}",
         "--target", iqn, "--lun", lun, "--header-digest", a.digest],
        stdout=tlog, stderr=subprocess.STDOUT)
    try:
        wait_listening(p1, target)
        wait_listening(p2, target)
        cmd = ["iscsi-test-cu", "-d", "-t", a.tests, f"iscsi://127.0.0.1:{p1}/{iqn}/0", f"iscsi://127.0.0.1:{p2}/{iqn}/0"]
        if a.digest == "required":
            # libiscsi asks for a header digest when the URL says so; it
            # has no data digest support at all.
            cmd[-2] += "?header_digest=crc32c"
            cmd[-1] += "?header_digest=crc32c"
        print("running:", " ".join(cmd), flush=True)
        start = time.time()
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=a.timeout)
            out, code = run.stdout + run.stderr, run.returncode
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            code = "timeout"
        elapsed = time.time() - start
        with open(a.log, "w") as f:
            f.write(out)
        alive = target.poll() is None
    finally:
        target.send_signal(signal.SIGTERM)
        try:
            target.wait(15)
        except subprocess.TimeoutExpired:
            target.kill()
        tlog.close()

    reasons = {}
    results = parse(out, reasons)
    suites = OrderedDict()
    for (suite, test), state in results.items():
        if (suite, test) in defects:
            continue
        suites.setdefault(suite, []).append((test, state))
    totals = {"passed": 0, "skipped": 0, "failed": 0}
    print(f"\n{'suite':<28} {'passed':>6} {'skipped':>7} {'failed':>6}")
    for suite, tests in suites.items():
        c = {"passed": 0, "skipped": 0, "failed": 0}
        for _, s in tests:
            c[s] += 1
            totals[s] += 1
        print(f"{suite:<28} {c['passed']:>6} {c['skipped']:>7} {c['failed']:>6}")
    print(f"{'TOTAL':<28} {totals['passed']:>6} {totals['skipped']:>7} {totals['failed']:>6}")
    print(f"iscsi-test-cu exit: {code}, {elapsed:.0f} s; target alive at the end: {alive}")
    for (suite, test), state in results.items():
        if state != "passed" and (suite, test) not in defects:
            why = f" ({reasons[(suite, test)]})" if state == "skipped" and (suite, test) in reasons else ""
            print(f"  {state:<8} {suite}.{test}{why}")
    if defects:
        print(f"known test defects ({a.known_defects}; not counted as passes or failures):")
        for key, reason in defects.items():
            print(f"  {results.get(key, 'missing'):<8} {key[0]}.{key[1]}: {reason}")

    ok = alive and code != "timeout" and len(results) > 0
    want, missing = [], []
    if a.expect:
        want = [l.strip() for l in open(a.expect) if l.strip() and not l.startswith("#")]
        clash = [w for w in want if tuple(w.split(".", 1)) in defects]
        for c in clash:
            print(f"CONFLICT: {c} is both expected to pass and listed as a known test defect")
        missing = [w for w in want if results.get(tuple(w.split(".", 1))) != "passed" or w in clash]
        for m in missing:
            print(f"REGRESSION: {m} is expected to pass but is {results.get(tuple(m.split('.', 1)), 'missing')}")
        ok = ok and not missing
        print(f"expectations: {len(want) - len(missing)}/{len(want)} expected passes hold")
    if a.update:
        with open(a.update, "w") as f:
            f.write("# Tests that must pass (scripts/conformance.py --update regenerates this).\n")
            for (suite, test), state in results.items():
                if state == "passed" and (suite, test) not in defects:
                    f.write(f"{suite}.{test}\n")
    # The suite's own totals (a skip is not a pass; known failures are
    # listed above), then the verdict of this check: expected passes that
    # held, and regressions (or a target that died or hung).
    extra = f" (+ {len(defects)} known test defects, not counted)" if defects else ""
    print(f"iscsi-test-cu totals: {totals['passed']} pass / {totals['skipped']} skip / {totals['failed']} fail{extra}")
    held = len(want) - len(missing) if a.expect else totals["passed"]
    print(f"conformance: {held} passed, {0 if ok else max(1, len(missing) if a.expect else 1)} failed")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
