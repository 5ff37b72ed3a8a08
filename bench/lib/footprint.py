#!/usr/bin/python3
"""bench/lib/footprint.py TRACE OUT.json: the memory footprint of a server between its syscalls
(issue 15 item 3), read from valgrind's lackey (`--tool=lackey --trace-mem=yes
--trace-syscalls=yes`, one log: every instruction fetch and data access, in program order,
with the syscalls in between). bench/callgrind.sh FOOTPRINT=1 runs it.

Why between syscalls: this box's kernel runs with page-table isolation and no PCID (the
`pti` flag, no `pcid` in /proc/cpuinfo; /sys/devices/system/cpu/vulnerabilities/meltdown says
"Mitigation: PTI"), so every kernel entry and exit switches CR3 and flushes every user TLB
entry; and the kernel's own code and data (a read, a write, epoll_wait on loopback TCP) evict
much of L1. Each stretch of user code between two syscalls therefore starts with a cold TLB
and a cooled L1: what it costs beyond its instructions is about one page walk for each
distinct 4 KiB page it touches and one L2 fill for each distinct 64-byte line. This counts,
per segment (the accesses between two SYSCALL lines), the distinct pages and lines, for
instructions and data apart, and sums them over the segments of the measured window.

Counting runs only between SIGUSR1 (start) and SIGUSR2 (stop), sent by the driver around the
load, so start-up and shutdown are left out. TRACE is read as it is written (a FIFO)."""
import json
import signal
import sys

active = False
# valgrind turns the guest's vDSO calls into syscalls; natively they never enter the kernel
VDSO = {"sys_clock_gettime", "sys_time", "sys_gettimeofday", "sys_getcpu"}


def on_start(*_):
    global active
    active = True


def on_stop(*_):
    global active
    active = False
# valgrind turns the guest's vDSO calls into syscalls; natively they never enter the kernel
VDSO = {"sys_clock_gettime", "sys_time", "sys_gettimeofday", "sys_getcpu"}


def main():
    trace, out = sys.argv[1], sys.argv[2]
    signal.signal(signal.SIGUSR1, on_start)
    signal.signal(signal.SIGUSR2, on_stop)
    tot = dict(segments=0, ipages=0, dpages=0, ilines=0, dlines=0, instr=0, daccess=0)
    by_sys, vdso = {}, {}
    ip, dp, il, dl = set(), set(), set(), set()
    ninstr = nd = 0
    with open(trace, "r", errors="replace", buffering=1 << 20) as f:
        for line in f:
            if not active:
                if line.startswith("SYSCALL"):
                    ip.clear(); dp.clear(); il.clear(); dl.clear(); ninstr = nd = 0
                continue
            c = line[0]
            if c == "I":
                a = int(line[3:line.index(",")], 16)
                ip.add(a >> 12); il.add(a >> 6); ninstr += 1
            elif c == " ":
                a = int(line[3:line.index(",")], 16)
                dp.add(a >> 12); dl.add(a >> 6); nd += 1
            elif line.startswith("SYSCALL"):
                if "... [async] -->" in line:  # the second line of a blocking call: no new segment
                    continue
                name = line.split(")", 1)[1].split("(", 1)[0].strip()
                if name in VDSO:  # a vDSO call outside valgrind: no kernel entry, no flush
                    vdso[name] = vdso.get(name, 0) + 1
                    continue
                if ip or dp:
                    s = by_sys.setdefault(name, dict(segments=0, ipages=0, dpages=0))
                    s["segments"] += 1; s["ipages"] += len(ip); s["dpages"] += len(dp)
                    tot["segments"] += 1
                    tot["ipages"] += len(ip); tot["dpages"] += len(dp)
                    tot["ilines"] += len(il); tot["dlines"] += len(dl)
                    tot["instr"] += ninstr; tot["daccess"] += nd
                ip.clear(); dp.clear(); il.clear(); dl.clear(); ninstr = nd = 0
    tot["by_syscall"] = by_sys
    tot["vdso"] = vdso
    with open(out, "w") as f:
        json.dump(tot, f)


if __name__ == "__main__":
    main()
