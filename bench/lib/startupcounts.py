#!/usr/bin/python3
"""bench/startup.sh's PARTS=counts: load-independent counts from exec to the first request, per
case, beside the two floors (issue 15 item 5).

  startupcounts.py --port P [--runs 20] CASE=CMD ...
      CMD: a command line split on spaces, PORT replaced; it must exit once it has the first
      request (khamsin with bench/apps/first_answer.lua; bench/lib/startup_floor.c with --once).
      A CASE named "true" is a command that exits by itself (/bin/true: nothing is polled).

Per case: page faults (perf stat -e page-faults, median of --runs runs; each fault costs
10-35 us on the VMs measured, the largest part of the wall clock above the floor), syscalls from
exec to the first accept4 (strace -f; every thread; exec -> exit for a case that never
accepts), the threads created (clone/clone3) and the shared objects opened (openat of a .so)
on the way, and the syscalls by name. Each run is polled by a client that connects every
0.2 ms (as bench/lib/startupbench.py does) and sends GET / once connected; the counts do not
depend on how fast it goes, but for epoll_wait (a worker's timer may fire while a slow run
waits) and futex, which are shown apart.
"""
import argparse
import collections
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REQ = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
TIMING = ("epoll_wait", "futex")  # counts that depend on timing, shown apart


def poke(port, stop):
    """connects every 0.2 ms until connected, sends GET /, reads until the server closes"""
    while not stop.is_set():
        s = socket.socket()
        try:
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            s.sendall(REQ)
            while s.recv(4096):
                pass
            return
        except OSError:
            time.sleep(0.0002)
        finally:
            s.close()


def run_polled(cmd, port, polled):
    stop = threading.Event()
    t = None
    if polled:
        t = threading.Thread(target=poke, args=(port, stop), daemon=True)
        t.start()
    try:
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        stop.set()
        if t:
            t.join(10)
    return r


def faults(cmd, port, polled, runs):
    xs = []
    with tempfile.NamedTemporaryFile(prefix="khcounts.", suffix=".txt") as f:
        for _ in range(runs):
            run_polled(["perf", "stat", "-x,", "-o", f.name, "-e", "page-faults"] + cmd, port, polled)
            with open(f.name) as g:
                line = [ln for ln in g.read().splitlines() if "page-faults" in ln][-1]
            xs.append(int(line.split(",")[0]))
    return statistics.median(xs), min(xs), max(xs)


def syscalls(cmd, port, polled):
    with tempfile.NamedTemporaryFile(prefix="khcounts.", suffix=".strace") as f:
        run_polled(["strace", "-f", "-qq", "-o", f.name] + cmd, port, polled)
        with open(f.name) as g:
            lines = g.read().splitlines()
    names = collections.Counter()
    sos = set()
    for ln in lines:
        if "resumed>" in ln or "+++" in ln or "---" in ln:
            continue
        m = re.match(r"\s*\d+\s+(\w+)\(", ln)
        if not m:
            continue
        name = m.group(1)
        names[name] += 1
        if name == "openat":
            so = re.search(r'"([^"]+\.so[.\d]*)"', ln)
            if so and not re.search(r"= -1 ", ln):
                sos.add(os.path.basename(so.group(1)))
        if name == "accept4":
            break
    return names, sorted(sos)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    rows = []
    for c in a.cases:
        name, cmd = c.split("=", 1)
        cmd = cmd.replace("PORT", str(a.port)).split()
        polled = name != "true"
        med, lo, hi = faults(cmd, a.port, polled, a.runs)
        names, sos = syscalls(cmd, a.port, polled)
        rows.append((name, med, lo, hi, names, sos))
    print(f"  {'case':<16} {'faults':>7} {'[min..max]':>12} {'syscalls':>9} {'+timing':>8} {'threads':>8}  shared objects opened")
    for name, med, lo, hi, names, sos in rows:
        total = sum(names.values())
        timing = sum(names[t] for t in TIMING)
        threads = names["clone3"] + names["clone"]
        print(f"  {name:<16} {med:>7.0f} {'[%d..%d]' % (lo, hi):>12} {total - timing:>9} {timing:>8} {threads:>8}  "
              f"{' '.join(sos) or '-'}", flush=True)
    print("  (faults: median of %d runs, exec -> exit after the first request; syscalls: one strace -f run, exec -> "
          "the first accept4, every thread, without epoll_wait and futex, which are in '+timing')" % a.runs)
    for name, _, _, _, names, _ in rows:
        print(f"  {name} syscalls by name: " + ", ".join(f"{k} {v}" for k, v in names.most_common()))


if __name__ == "__main__":
    main()
