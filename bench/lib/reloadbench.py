#!/usr/bin/python3
"""bench/lib/reloadbench.py: helpers for bench/reload.sh (hot reload, issue 11).

  reloadbench.py ready PORT TIMEOUT
        wait until GET / answers 200
  reloadbench.py savetime PORT APP ROUNDS
        khamsin --dev serves APP (a copy of examples/hello.lua): a prober GETs / in a loop on one
        keep-alive connection; each round saves APP (new file renamed over it, as editors do)
        with a new greeting and times the save -> the first answer with it. Prints one line
        per round ("round N ms X failed F") and "savetime median MIN MAX failed F".
  reloadbench.py window PID PORT SECS CORE CONNS HUP_EVERY_MS
        one wrk window on / (pinned to CORE); with HUP_EVERY_MS > 0, SIGHUP to PID that often
        during it (a reload per signal). Prints "rps cpu_us_per_req rps_per_cpu_s non2xx errors
        reloads"
  reloadbench.py idlemem PID PORT APP N
        RSS of PID, then N times: a request held by a deferred reply (GET /hold), a save, a
        SIGHUP and a wait for the new generation (GET /gen): N old instances stay alive, each
        held by its one idle request. Then the held connections close (the instances are
        closed). Prints "rss_kb_before rss_kb_held rss_kb_after per_instance_kb"
"""
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (all threads)


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def get(port, path, timeout=2.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            c = s.recv(65536)
            if not c:
                break
            data += c
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode("latin-1")


def ready(port, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if get(port, "/")[0] == 200:
                return 0
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.05)
    return 1


def save(path, text):
    with open(path + ".tmp~", "w") as f:
        f.write(text)
    os.rename(path + ".tmp~", path)


class Prober(threading.Thread):
    """GET / in a loop on one keep-alive connection; records when each body was first seen."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.first, self.failed, self.stop = port, {}, 0, False

    def run(self):
        req = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        s = None
        while not self.stop:
            try:
                if s is None:
                    s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.sendall(req)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    c = s.recv(65536)
                    if not c:
                        raise OSError("closed")
                    buf += c
                head, _, body = buf.partition(b"\r\n\r\n")
                cl = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
                while len(body) < cl:
                    body += s.recv(65536)
                t = time.time()
                if not head.startswith(b"HTTP/1.1 200"):
                    self.failed += 1
                self.first.setdefault(body.decode("latin-1"), t)
            except OSError:
                self.failed += 1
                if s:
                    s.close()
                s = None


def savetime(port, app, rounds):
    base = open(app).read()
    p = Prober(port)
    p.start()
    times = []
    for r in range(1, rounds + 1):
        word = f"Hello, reload {r}!"
        text = base.replace("Hello, World!", word)
        time.sleep(0.5)  # the previous reload is over (the --dev debounce is 50 ms)
        t0 = time.time()
        save(app, text)
        deadline = t0 + 10
        while word not in p.first and time.time() < deadline:
            time.sleep(0.001)
        ms = (p.first[word] - t0) * 1000 if word in p.first else float("nan")
        times.append(ms)
        print(f"round {r} ms {ms:.1f} failed {p.failed}", flush=True)
    p.stop = True
    ok = [t for t in times if t == t]
    print(f"savetime {statistics.median(ok):.1f} {min(ok):.1f} {max(ok):.1f} failed {p.failed}")


def window(pid, port, secs, core, conns, hup_ms):
    cmd = ["taskset", "-c", str(core), "wrk", "-t1", f"-c{conns}", f"-d{int(secs)}s",
           f"http://127.0.0.1:{port}/"]
    t0, c0 = time.monotonic(), cpu_ticks(pid)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    reloads = 0
    if hup_ms > 0:
        time.sleep(0.2)
        end = t0 + secs - 0.2
        while time.monotonic() < end:
            os.kill(pid, signal.SIGHUP)
            reloads += 1
            time.sleep(hup_ms / 1000)
    out = proc.communicate()[0]
    t1, c1 = time.monotonic(), cpu_ticks(pid)
    reqs = int(re.search(r"^\s*(\d+) requests in", out, re.M).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errs = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    cpu = (c1 - c0) / TICK
    print(f"{reqs / (t1 - t0):.0f} {cpu / max(reqs, 1) * 1e6:.2f} {reqs / max(cpu, 1e-9):.0f} "
          f"{int(non2xx.group(1)) if non2xx else 0} "
          f"{sum(map(int, errs.groups())) if errs else 0} {reloads}")


def idlemem(pid, port, app, n):
    base = open(app).read()
    time.sleep(0.5)
    before = rss_kb(pid)
    held = []
    gen = int(get(port, "/gen")[1])
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        held.append(s)
        # the hold is registered before the reload: /held counts them in the shared dict
        deadline = time.time() + 5
        while int(get(port, "/held")[1]) < i + 1 and time.time() < deadline:
            time.sleep(0.005)
        save(app, base.replace("Hello, World!", f"Hello, {i}!"))
        os.kill(pid, signal.SIGHUP)
        deadline = time.time() + 10
        while int(get(port, "/gen")[1]) < gen + 1 and time.time() < deadline:
            time.sleep(0.005)
        gen += 1
    time.sleep(0.5)
    during = rss_kb(pid)
    for s in held:
        s.close()
    time.sleep(1.0)
    after = rss_kb(pid)
    print(f"{before} {during} {after} {(during - before) / n:.0f}")


if __name__ == "__main__":
    c = sys.argv[1]
    if c == "ready":
        sys.exit(ready(int(sys.argv[2]), float(sys.argv[3])))
    elif c == "savetime":
        savetime(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    elif c == "window":
        window(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]),
               int(sys.argv[6]), int(sys.argv[7]))
    elif c == "idlemem":
        idlemem(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
