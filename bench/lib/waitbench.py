#!/usr/bin/python3
"""bench/lib/waitbench.py: helpers for bench/wait.sh (the approach of bench/http1.sh: server CPU
from /proc/PID/stat utime+stime over a wrk window, server and load pinned to different cores).

  waitbench.py ready PORT PATH TIMEOUT          wait until GET PATH answers 200
  waitbench.py window PID PORT PATH CONNS SECS WRK_CORE
        one wrk window; prints "rps cpu_us_per_req cpu_share non2xx errors"
"""
import os
import re
import socket
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (all threads)


def ready(port, path, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = s.recv(100)
            s.close()
            if data.startswith(b"HTTP/1.1 200"):
                return 0
        except OSError:
            pass
        time.sleep(0.05)
    return 1


def window(pid, port, path, conns, secs, core):
    cmd = ["taskset", "-c", str(core), "wrk", "-t1", f"-c{conns}", f"-d{int(secs)}s",
           f"http://127.0.0.1:{port}{path}"]
    t0, c0 = time.monotonic(), cpu_ticks(pid)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    t1, c1 = time.monotonic(), cpu_ticks(pid)
    m = re.search(r"^\s*(\d+) requests in", out, re.M)
    reqs = int(m.group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errs = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    cpu = (c1 - c0) / TICK
    rps = reqs / (t1 - t0)
    print(f"{rps:.0f} {cpu / max(reqs, 1) * 1e6:.2f} {cpu / (t1 - t0):.2f} "
          f"{int(non2xx.group(1)) if non2xx else 0} {sum(map(int, errs.groups())) if errs else 0}")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "ready":
        sys.exit(ready(int(sys.argv[2]), sys.argv[3], float(sys.argv[4])))
    elif cmd == "window":
        window(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]),
               float(sys.argv[6]), int(sys.argv[7]))
