#!/usr/bin/python3
"""bench/startup.sh's PARTS=faults: where the page faults from exec to the first request go.

  startupfaults.py --bin KHAMSIN --port P --app bench/apps/first_answer.lua [--runs 5] [--tls] -- ARGS...

Load-independent (a count, not a time): on the VMs measured a page fault costs 10-35 us, more
than anything else the start-up does, so this is the breakdown of what the wall clock spends
above the floor. Each run records every page fault (perf record -e page-faults -c 1 -d, the
faults taken by trapping, so MADV_POPULATE_WRITE's are not among them) and a few syscalls that
mark the phases (the first rt_sigaction is main's signal(SIGPIPE), listen, the supervisor's
clone3, worker 0's first epoll_wait, accept4, and exit_group: first_answer.lua exits in its
handler), then prints the median count per phase and per mapping the faulting address is in,
and for the files with the most faults, per ELF segment (from readelf -lW: ld.so's relocations
write the GNU_RELRO pages, one trapping copy-on-write fault each; fault-around maps only reads).
The floor is /bin/true's count (perf stat), exec to exit. Needs perf and tracefs (root).
"""
import argparse
import collections
import os
import re
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

MARKS = ["rt_sigaction", "listen", "clone3", "epoll_wait", "accept4", "exit_group"]
PHASES = [  # (name, the mark that ends it)
    ("exec -> main: ld.so, libc", "rt_sigaction"),
    ("main -> listening: options, sockets", "listen"),
    ("-> supervisor thread created", "clone3"),
    ("-> worker 0 loop: Lua state, app", "epoll_wait"),
    ("-> accept", "accept4"),
    ("-> request in Lua: read, parse", "exit_group"),
]


def poke(port, deadline, tls):
    ctx = None
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            if ctx is not None:
                s = ctx.wrap_socket(s, server_hostname="localhost")
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(2)
            try:
                s.recv(1)
            except OSError:
                pass
            s.close()
            return
        except OSError:  # ssl.SSLError is one
            time.sleep(0.002)


def one_run(a, data):
    cmd = ["perf", "record", "-q", "-o", data, "-e", "page-faults", "-c", "1", "-d"]
    for m in MARKS:
        cmd += ["-e", "syscalls:sys_enter_" + m]
    cmd += [a.bin] + a.args + [a.app]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    poke(a.port, time.monotonic() + 20, a.tls)
    p.wait(20)
    out = subprocess.run(["perf", "script", "-i", data, "--show-mmap-events", "-F",
                          "pid,tid,event,addr,dso"], capture_output=True, text=True).stdout
    phase, seen = 0, set()
    by_phase, by_map, by_seg, thread = collections.Counter(), collections.Counter(), collections.Counter(), 0
    base = {}  # file -> where its first mapping (offset 0) starts
    for line in out.splitlines():
        mm = re.search(r"PERF_RECORD_MMAP2 .*?\[(0x[0-9a-f]+)\(0x[0-9a-f]+\) @ (0x[0-9a-f]+|0) .*\]: \S+ (/\S+)$", line)
        if mm:
            if int(mm.group(2), 16) == 0 and mm.group(3) not in base:
                base[mm.group(3)] = int(mm.group(1), 16)
            continue
        m = re.match(r"\s*(\d+)/(\d+)\s+(\S+):\s*(.*)$", line)
        if not m:
            continue
        pid, tid, ev, rest = m.groups()
        if ev.startswith("syscalls:sys_enter_"):
            name = ev[len("syscalls:sys_enter_"):]
            # a phase ends at its mark's first occurrence, once the marks before it were seen
            if phase < len(PHASES) and name == PHASES[phase][1] and name not in seen:
                seen.add(name)
                phase += 1
            continue
        if ev != "page-faults" or phase >= len(PHASES):
            continue
        dso = re.search(r"\((.*)\)\s*$", rest)
        dso = dso.group(1).split("/")[-1] if dso else "?"
        if dso in ("anon", "[unknown]"):
            dso = "anonymous (heap, Lua arena, TLS, bss)"
        by_phase[PHASES[phase][0]] += 1
        by_map[dso] += 1
        path = re.search(r"\((/[^)]*)\)\s*$", rest)
        addr = re.match(r"\s*([0-9a-f]+)", rest)
        if path and addr and path.group(1) in base:
            by_seg[(dso, segment_of(path.group(1), int(addr.group(1), 16) - base[path.group(1)]))] += 1
        if tid != pid:
            thread += 1
    return by_phase, by_map, thread, phase == len(PHASES), by_seg


_phdrs = {}


def segment_of(path, off):
    """The ELF segment an offset from the object's base falls in (its first mapping is at vaddr 0
    for a PIE or a shared object): relro, code, rodata, data/bss, or headers (dynsym, rela...)."""
    if path not in _phdrs:
        loads, relro = [], None
        txt = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True).stdout
        for l in txt.splitlines():
            f = l.split()
            if f and f[0] in ("LOAD", "GNU_RELRO"):
                va, msz = int(f[2], 16), int(f[5], 16)
                if f[0] == "GNU_RELRO":
                    relro = (va, va + msz)
                else:
                    loads.append((va, va + msz, "".join(f[6:-1])))
        _phdrs[path] = (loads, relro)
    loads, relro = _phdrs[path]
    if relro and relro[0] <= off < relro[1]:
        return "relro: written by ld.so's relocations"
    first = True
    for lo, hi, flags in loads:
        if lo <= off < hi:
            if "E" in flags:
                return "code"
            if "W" in flags:
                return "data, bss"
            return "headers: dynsym, dynstr, rela" if first else "rodata, eh_frame"
        first = False
    return "outside its segments"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--app", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tls", action="store_true", help="poke over TLS (a TLS listener)")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    floor = []
    for _ in range(a.runs):
        r = subprocess.run(["perf", "stat", "-x,", "-e", "page-faults", "/bin/true"],
                           capture_output=True, text=True)
        floor.append(int(r.stderr.strip().splitlines()[-1].split(",")[0]))
    runs = []
    with tempfile.TemporaryDirectory(prefix="khfaults.") as tmp:
        for i in range(a.runs):
            bp, bm, th, complete, bs = one_run(a, os.path.join(tmp, "perf.data"))
            if not complete:
                sys.exit("startupfaults: a run did not reach every mark (perf or tracefs missing?)")
            runs.append((bp, bm, th, bs))
    med = lambda k, idx: statistics.median(r[idx][k] for r in runs)
    total = statistics.median(sum(r[0].values()) for r in runs)
    print(f"  page faults, exec -> first request in Lua: {total:.0f} (floor /bin/true, exec -> exit: "
          f"{statistics.median(floor):.0f}); median of {a.runs} runs; of them on the supervisor thread: "
          f"{statistics.median(r[2] for r in runs):.0f}")
    print("  by phase (the syscall that ends it):")
    for name, mark in PHASES:
        print(f"    {name:<40} {med(name, 0):5.0f}   (to the first {mark})")
    print("  by what the faulting address is in:")
    maps = collections.Counter()
    for r in runs:
        maps.update(r[1])
    for k, _ in maps.most_common():
        print(f"    {k:<40} {med(k, 1):5.0f}")
    print("  by ELF segment, in the files with 10 or more (readelf -lW; medians):")
    segs = collections.Counter()
    for r in runs:
        segs.update(r[3])
    for (dso, seg), _ in sorted(segs.items(), key=lambda kv: (-maps[kv[0][0]], -kv[1])):
        if med(dso, 1) >= 10 and med((dso, seg), 3) > 0:
            print(f"    {dso + ': ' + seg:<58} {med((dso, seg), 3):5.0f}")


if __name__ == "__main__":
    main()
