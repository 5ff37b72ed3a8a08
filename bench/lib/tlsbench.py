#!/usr/bin/python3
"""bench/lib/tlsbench.py: measuring helpers for bench/tls.sh (stdlib only; /usr/bin/python3).

  tlsbench.py waitready PORT PID SECS         wait until a TLS GET / answers 200 (or PID died)
  tlsbench.py window ROOT CORE SCORE -- CMD...
                                              run CMD pinned to CORE; print JSON: the server
                                              tree's CPU seconds (utime+stime from /proc) over
                                              the run, wall seconds, CMD's output, and `other`:
                                              the share of the server core SCORE used by
                                              anything but the server (noise)
  tlsbench.py quiet SECS                      wait up to SECS until both cores are >= 90% idle
  tlsbench.py idle PORT ROOT N CORE [--tls]   open N connections (TLS 1.3 when --tls), one GET
                                              each, keep them open; print the PSS delta of the
                                              server tree per connection
  tlsbench.py hs PORT N new|reuse             N TLS 1.3 connections one after the other (ALPN
                                              http/1.1), one GET each, then close; `reuse`
                                              resumes every one from the ticket of a first,
                                              uncounted connection. Prints JSON: counts of
                                              connections, resumed ones, and tickets seen

Modelled on bench/lib/benchlib.py (http1.sh): same /proc accounting, same PSS rule.
"""
import json
import os
import re
import resource
import socket
import ssl
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
REQ = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def die(msg, code=1):
    print("tlsbench: " + msg, file=sys.stderr, flush=True)
    sys.exit(code)


import benchlib  # noqa: E402

# /proc walking is shared with http1.sh's helper (same directory, so importable as a module).
from benchlib import cpu_snapshot as cpu_ticks  # noqa: E402  {(pid, starttime): ticks} over the tree


def cpu_delta(before, after):
    return sum(t - before.get(k, 0) for k, t in after.items()) / CLK_TCK


def core_busy(core):
    """busy ticks (everything but idle and iowait) of one core, from /proc/stat"""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{core} "):
                v = [int(x) for x in line.split()[1:]]
                return sum(v) - v[3] - v[4]
    return 0


def all_idle_share(secs=0.5):
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    t0, i0 = snap()
    time.sleep(secs)
    t1, i1 = snap()
    return (i1 - i0) / max(1, t1 - t0)


def cmd_quiet(secs):
    t0 = time.monotonic()
    while time.monotonic() - t0 < secs:
        if all_idle_share() >= 0.9:
            break
    print(f"{time.monotonic() - t0:.1f}")


def pss_kib(root):
    return benchlib.pss_kib(root)[0]


def client_ctx():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def get(sock):
    sock.sendall(REQ)
    buf = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the response")
        buf += chunk
        if b"\r\n\r\n" in buf:
            head, body = buf.split(b"\r\n\r\n", 1)
            m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if m and len(body) >= int(m.group(1)):
                if not head.startswith(b"HTTP/1.1 200"):
                    raise ConnectionError("bad answer %r" % head[:80])
                return


def cmd_waitready(port, pid, secs):
    deadline = time.monotonic() + float(secs)
    ctx = client_ctx()
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            die(f"server pid {pid} exited")
        try:
            with socket.create_connection(("127.0.0.1", int(port)), timeout=1) as s:
                with ctx.wrap_socket(s) as t:
                    get(t)
                    return
        except OSError:
            time.sleep(0.05)
    die(f"port {port}: no TLS answer within {secs}s")


def cmd_window(root, core, score, cmd):
    before = cpu_ticks(root)
    busy0 = core_busy(score)
    t0 = time.monotonic()
    out = subprocess.run(["taskset", "-c", core] + cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    cpu = cpu_delta(before, cpu_ticks(root))
    other = max(0.0, (core_busy(score) - busy0) / CLK_TCK - cpu) / wall
    print(json.dumps(dict(cpu_s=cpu, wall_s=wall, other=other, rc=out.returncode,
                          out=out.stdout + out.stderr)))


def cmd_idle(port, root, n, core, use_tls):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < n + 100:
        die(f"RLIMIT_NOFILE {hard} < {n + 100}")
    os.sched_setaffinity(0, {int(core)})
    ctx = client_ctx()
    # a few connections first, so that one-time allocations (OpenSSL's per-thread state,
    # buffer caches) are in the baseline rather than in the per-connection figure
    warm = []
    for _ in range(64):
        s = socket.create_connection(("127.0.0.1", port))
        s = ctx.wrap_socket(s) if use_tls else s
        get(s)
        warm.append(s)
    for s in warm:
        s.close()
    time.sleep(1)
    base = pss_kib(root)
    socks = []
    t0 = time.monotonic()
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s = ctx.wrap_socket(s) if use_tls else s
        get(s)
        socks.append(s)
    opened = time.monotonic() - t0
    time.sleep(1)
    after = pss_kib(root)
    closed = 0
    for s in socks:
        try:
            raw = s if not use_tls else s  # SSLSocket: a pending close shows as readable EOF
            raw.setblocking(False)
            if raw.recv(1) == b"":
                closed += 1
        except (ssl.SSLWantReadError, BlockingIOError):
            pass
        except OSError:
            closed += 1
    for s in socks:
        s.close()
    delta = (after - base) * 1024
    print(json.dumps(dict(n=n, tls=use_tls, pss_before_kib=base, pss_after_kib=after,
                          bytes_per_conn=delta / n, open_s=opened, closed=closed)))
    if closed:
        die(f"server closed {closed} of {n} idle connections before the measurement", 2)


def cmd_hs(port, n, mode):
    ctx = client_ctx()
    sess = None
    if mode == "reuse":
        with socket.create_connection(("127.0.0.1", port)) as s:
            with ctx.wrap_socket(s) as t:
                get(t)
                sess = t.session
        if sess is None or not sess.has_ticket:
            die("no session ticket from the first connection")
    resumed = 0
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port)) as s:
            with ctx.wrap_socket(s, session=sess) as t:
                get(t)
                resumed += 1 if t.session_reused else 0
    print(json.dumps(dict(n=n, mode=mode, resumed=resumed)))
    if mode == "reuse" and resumed != n:
        die(f"only {resumed} of {n} connections resumed", 2)


def main():
    a = sys.argv[1:]
    if not a:
        die(__doc__)
    if a[0] == "waitready":
        cmd_waitready(int(a[1]), int(a[2]), a[3])
    elif a[0] == "window":
        i = a.index("--")
        cmd_window(int(a[1]), a[2], a[3], a[i + 1:])
    elif a[0] == "quiet":
        cmd_quiet(float(a[1]))
    elif a[0] == "idle":
        cmd_idle(int(a[1]), int(a[2]), int(a[3]), a[4], "--tls" in a)
    elif a[0] == "hs":
        cmd_hs(int(a[1]), int(a[2]), a[3])
    else:
        die("unknown command " + a[0])


if __name__ == "__main__":
    main()
