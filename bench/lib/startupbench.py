#!/usr/bin/python3
"""bench/startup.sh's measurer: exec -> first answered request, cleartext or over TLS.

  startupbench.py --runs N --port P --json F [--server-core 1 --client-core 0] \
      CASE=CMD ... (CASE ending in -tls is polled over TLS 1.3: a full handshake then GET /)
  startupbench.py --warm-gets N ... : the client's own share instead: each case started once,
      then N polls (a new connection, over TLS a full handshake, then GET /) timed against the
      running server; prints their median (what a poll costs once the server is up)

Per run, the cases alternate (floor A B ... floor A B ...: the noisy-box method of
bench/lib/method.py, one run = one round). The floor is /bin/true spawned the same way, its exit
polled at the same 0.2 ms cadence. A case named floor-server (bench/lib/startup_floor.c: binds,
listens, accepts, answers the same 13 bytes) is the second floor, polled exactly as khamsin is:
each case is also printed minus it. A case's command is split on spaces; PORT in it is replaced.
"""
import argparse
import json
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

REQ = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
FLOOR_SERVER = "floor-server"  # the case name of bench/lib/startup_floor.c, when it is given


def tls_ctx():
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE
    c.minimum_version = ssl.TLSVersion.TLSv1_3
    return c


def try_get(port, ctx):
    s = socket.socket()
    try:
        s.settimeout(1.0)
        s.connect(("127.0.0.1", port))
        if ctx is not None:
            s = ctx.wrap_socket(s, server_hostname="localhost")
        s.sendall(REQ)
        st, _, body, _ = benchlib.read_response(s, time.monotonic() + 1.0)
        return st == 200 and body == benchlib.BODY
    except (OSError, ValueError, ssl.SSLError):
        return False
    finally:
        s.close()


def port_busy(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def run_floor(a):
    os.sched_setaffinity(0, {a.server_core})
    t0 = time.perf_counter()
    p = subprocess.Popen(["/bin/true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    os.sched_setaffinity(0, {a.client_core})
    while p.poll() is None:
        time.sleep(0.0002)
    return (time.perf_counter() - t0) * 1e3


def warm_gets(a, cmd, tls, log):
    """median ms of a.warm_gets polls of an already running server (its start-up excluded)"""
    ctx = tls_ctx() if tls else None
    os.sched_setaffinity(0, {a.server_core})
    p = subprocess.Popen(cmd, stdout=log, stderr=log, close_fds=True)
    os.sched_setaffinity(0, {a.client_core})
    try:
        t_end = time.monotonic() + a.timeout
        while not try_get(a.port, ctx):
            if p.poll() is not None or time.monotonic() > t_end:
                benchlib.die(f"{cmd[0]} did not answer (see {a.log})")
            time.sleep(0.01)
        xs = []
        for _ in range(a.warm_gets):
            t0 = time.perf_counter()
            if not try_get(a.port, ctx):
                benchlib.die(f"a poll of the running {cmd[0]} failed")
            xs.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(xs)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(10)
        for _ in range(500):
            if not port_busy(a.port):
                break
            time.sleep(0.01)


def run_case(a, cmd, tls, log):
    if port_busy(a.port):
        benchlib.die(f"something already answers on port {a.port}")
    ctx = tls_ctx() if tls else None
    os.sched_setaffinity(0, {a.server_core})
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=log, stderr=log, close_fds=True)
    os.sched_setaffinity(0, {a.client_core})
    answered = None
    while time.perf_counter() - t0 < a.timeout:
        if p.poll() is not None:
            benchlib.die(f"{cmd[0]} exited with {p.returncode} before answering (see {a.log})")
        if try_get(a.port, ctx):
            answered = time.perf_counter()
            break
        time.sleep(0.0002)
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(5)
    except subprocess.TimeoutExpired:
        for pid in benchlib.tree(p.pid)[::-1]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        p.wait()
    if answered is None:
        benchlib.die(f"no answer within {a.timeout}s from {' '.join(cmd)}")
    for _ in range(500):
        if not port_busy(a.port):
            break
        time.sleep(0.01)
    return (answered - t0) * 1e3


def run_options(ap):
    """the options run_case reads (a.port, a.server_core, a.client_core, a.timeout) and --runs"""
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--server-core", type=int, default=1)
    ap.add_argument("--client-core", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=10)


def main():
    ap = argparse.ArgumentParser()
    run_options(ap)
    ap.add_argument("--json")
    ap.add_argument("--warm-gets", type=int, default=0)
    ap.add_argument("--log", default="/dev/null")
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    cases = []
    for c in a.cases:
        name, cmd = c.split("=", 1)
        cases.append((name, cmd.replace("PORT", str(a.port)).split(), name.endswith("-tls")))
    log = open(a.log, "ab")
    if a.warm_gets:
        for name, cmd, tls in cases:
            print(f"  {name:<22} {warm_gets(a, cmd, tls, log):>10.2f} ms a poll, median of {a.warm_gets}", flush=True)
        return
    if not a.json:
        benchlib.die("--json is needed")
    rows = []
    for r in range(1, a.runs + 1):
        rows.append(dict(round=r, server="floor", ms=run_floor(a)))
        for name, cmd, tls in cases:
            rows.append(dict(round=r, server=name, ms=run_case(a, cmd, tls, log)))
    with open(a.json, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    floor = statistics.median(x["ms"] for x in rows if x["server"] == "floor")
    # the second floor: a C server polled exactly as khamsin is (bench/lib/startup_floor.c)
    f2 = [x["ms"] for x in rows if x["server"] == FLOOR_SERVER]
    floor2 = statistics.median(f2) if f2 else None
    col2 = f" {'- ' + FLOOR_SERVER:>15}" if f2 else ""
    print(f"  {'case':<22} {'median ms':>10} {'min':>7} {'max':>7} {'- floor':>8}{col2}  (n={a.runs} each, alternated per run)")
    for name in ["floor"] + [c[0] for c in cases]:
        xs = [x["ms"] for x in rows if x["server"] == name]
        m = statistics.median(xs)
        v2 = f" {m - floor2:>15.2f}" if f2 else ""
        print(f"  {name:<22} {m:>10.2f} {min(xs):>7.2f} {max(xs):>7.2f} {m - floor:>8.2f}{v2}", flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    main()
