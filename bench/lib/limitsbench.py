#!/usr/bin/python3
"""Clients for bench/limits.sh: what a server does at its resource limits (stdlib only).

Each subcommand talks to one server on 127.0.0.1:PORT whose process tree is rooted at PID and
prints one JSON line of figures. Every loop here is bounded in count and time.

  fdflood PORT PID CLIENTS SECS LOG   CLIENTS keep-alive connections, one GET / each, held SECS
                                      s: served / queued / refused, server CPU and log lines in
                                      that window; then every client closes and one new GET /
                                      must be answered (recovered, and how long it took)
  pipeline PORT PID N                 one connection pipelines N `GET /big` (1 MiB each) and
                                      never reads: server RSS growth, and how long a GET / on
                                      a second connection takes meanwhile
  slowread PORT PID PATH RATE SECS    GET PATH read at RATE bytes/s: bytes read, time, complete?
  stopread PORT PID PATH SECS         GET PATH, read 64 KiB, then stop reading: time until the
                                      server gives the connection up (its socket leaves
                                      ESTABLISHED in /proc/net/tcp), at most SECS
  idlekeep PORT PID N                 N keep-alive clients, one GET / each, then idle (the
                                      server's connection limit): is a new client served, and
                                      how soon; how many idle ones the server closed for it
  stopslow PORT PID SIG N PATH RATE   N clients GET PATH and read it at RATE bytes/s each; 1 s
                                      in, signal SIG (a graceful stop): whole answers delivered,
                                      and when the server exited
  slowloris CSV                       the figures of a slowhttptest -g CSV: seconds sampled,
                                      seconds the probe found the service unavailable, most
                                      connections held, connections the server closed
"""
import json
import os
import resource
import selectors
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
REQ = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"


tree = benchlib.tree


def cpu_s(root):
    """utime + stime of the server's whole process tree, seconds."""
    total = 0
    for p in tree(root):
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            pass
    return total / CLK_TCK


def rss_kb(root):
    return benchlib.status_kib(root, "VmRSS")


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def one_get(port, timeout):
    """Seconds until a full `200` head arrives on a new connection, or None."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(REQ)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    return None
                buf += chunk
            return time.monotonic() - t0 if buf.startswith(b"HTTP/1.1 200") else None
    except OSError:
        return None


def fdflood(port, pid, clients, secs, logpath):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, clients + 256)), hard))
    sel = selectors.DefaultSelector()
    state = {}  # sock -> "connecting" | "sent" | "served" | "refused"
    log0 = count_lines(logpath)
    cpu0 = cpu_s(pid)
    t0 = time.monotonic()
    for _ in range(clients):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex(("127.0.0.1", port))
        if err not in (0, 115):  # EINPROGRESS
            state[s] = "refused"
            continue
        state[s] = "connecting"
        sel.register(s, selectors.EVENT_WRITE | selectors.EVENT_READ, bytearray())
    deadline = t0 + secs
    while time.monotonic() < deadline:
        for key, ev in sel.select(timeout=0.1):
            s = key.fileobj
            st = state[s]
            if st == "connecting" and ev & selectors.EVENT_WRITE:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    state[s] = "refused"
                    sel.unregister(s)
                    continue
                try:
                    s.send(REQ)
                    state[s] = "sent"
                    sel.modify(s, selectors.EVENT_READ, key.data)
                except OSError:
                    state[s] = "refused"
                    sel.unregister(s)
                continue
            if ev & selectors.EVENT_READ:
                try:
                    chunk = s.recv(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    state[s] = "refused" if state[s] != "served" else "served"
                    sel.unregister(s)
                    continue
                key.data.extend(chunk)
                if key.data.startswith(b"HTTP/1.1 200") and b"Hello" in key.data:
                    state[s] = "served"
                    sel.unregister(s)  # keep it open: it holds one of the server's fds
    window = time.monotonic() - t0
    cpu = cpu_s(pid) - cpu0
    lines = count_lines(logpath) - log0
    served = sum(1 for v in state.values() if v == "served")
    refused = sum(1 for v in state.values() if v == "refused")
    queued = clients - served - refused
    sel.close()
    for s in state:
        s.close()
    t1 = time.monotonic()
    got = None
    while got is None and time.monotonic() - t1 < 10:
        got = one_get(port, 2)
        if got is None:
            time.sleep(0.1)
    return {"clients": clients, "served": served, "queued": queued, "refused": refused,
            "window_s": round(window, 2), "cpu_pct": round(100 * cpu / window, 1),
            "log_lines": lines, "recovered_s": None if got is None else round(time.monotonic() - t1, 2),
            "rss_kb": rss_kb(pid)}


def pipeline(port, pid, n):
    rss0 = rss_kb(pid)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    data = b"GET /big HTTP/1.1\r\nHost: bench\r\n\r\n" * n
    sent, t0 = 0, time.monotonic()
    peak = rss0
    # send what the server takes in 10 s; a server that stops reading leaves the rest unsent
    while sent < len(data) and time.monotonic() - t0 < 10:
        try:
            sent += s.send(data[sent:sent + 65536])
        except BlockingIOError:
            time.sleep(0.01)
        peak = max(peak, rss_kb(pid))
    t1 = time.monotonic()
    while time.monotonic() - t1 < 3:
        peak = max(peak, rss_kb(pid))
        time.sleep(0.1)
    probe = one_get(port, 10)
    s.close()
    return {"n": n, "requests_taken": sent // len(b"GET /big HTTP/1.1\r\nHost: bench\r\n\r\n"),
            "rss0_kb": rss0, "rss_peak_kb": peak, "rss_growth_kb": peak - rss0,
            "other_get_s": None if probe is None else round(probe, 3)}


def http_get_stream(port, path, rcvbuf):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    return s


def slowread(port, pid, path, rate, secs):
    """Reads at most RATE bytes/s in 50 ms ticks (each tick reads its share, never more), so
    the reader is steady: it never pauses longer than a tick plus what the server makes it wait."""
    s = http_get_stream(port, path, 65536)
    s.settimeout(1)
    got, head, length, closed = 0, b"", None, False
    t0 = time.monotonic()
    tick = 0.05
    allowed = 0.0
    while time.monotonic() - t0 < secs and not closed:
        allowed = min(allowed + rate * tick, 2 * rate * tick)
        while allowed >= 1:
            try:
                chunk = s.recv(int(allowed))
            except socket.timeout:
                break
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            allowed -= len(chunk)
            if length is None:
                head += chunk
                if b"\r\n\r\n" in head:
                    h, _, rest = head.partition(b"\r\n\r\n")
                    for line in h.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
                    if length is None:
                        length = -1  # no Content-Length: counted, never "complete"
                    got = len(rest)
            else:
                got += len(chunk)
            if length is not None and length >= 0 and got >= length:
                closed = True
                break
        time.sleep(tick)
    s.close()
    return {"path": path, "rate_Bps": rate, "bytes": got, "length": length,
            "complete": length is not None and length >= 0 and got >= length, "seconds": round(time.monotonic() - t0, 1)}


def established(server_port, client_port):
    """Is the server side of (server_port <- client_port) still ESTABLISHED?"""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    lp = int(parts[1].split(":")[1], 16)
                    rp = int(parts[2].split(":")[1], 16)
                    if lp == server_port and rp == client_port:
                        return parts[3] == "01"
        except OSError:
            pass
    return False


def stopread(port, pid, path, secs):
    s = http_get_stream(port, path, 16384)
    s.settimeout(5)
    got = 0
    while got < 65536:
        chunk = s.recv(65536 - got)
        if not chunk:
            break
        got += len(chunk)
    cport = s.getsockname()[1]
    t0 = time.monotonic()
    while established(port, cport) and time.monotonic() - t0 < secs:
        time.sleep(0.1)
    gone = not established(port, cport)
    s.close()
    return {"path": path, "read_bytes": got, "closed_after_s": round(time.monotonic() - t0, 1) if gone else None,
            "limit_s": secs}


def idlekeep(port, pid, n):
    conns, served = [], 0
    for _ in range(n):
        s = socket.socket()
        s.settimeout(3)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(REQ)
            if s.recv(4096).startswith(b"HTTP/1.1 200"):
                served += 1
        except OSError:
            pass
        conns.append(s)
    got = one_get(port, 15)
    closed = 0
    for s in conns:
        s.settimeout(0.05)
        try:
            if s.recv(4096) == b"":
                closed += 1
        except socket.timeout:
            pass
        except OSError:
            closed += 1
        s.close()
    return {"n": n, "served": served, "new_client_s": None if got is None else round(got, 2),
            "idle_closed": closed}


def stopslow(port, pid, sig, n, path, rate):
    import signal
    conns = [http_get_stream(port, path, 65536) for _ in range(n)]
    for s in conns:
        s.setblocking(False)
    got = [b"" for _ in conns]
    done = [False] * n
    t0 = time.monotonic()
    signalled = exited = None
    tick = 0.05
    while time.monotonic() - t0 < 120 and not all(done):
        for i, s in enumerate(conns):
            if done[i]:
                continue
            try:
                chunk = s.recv(int(rate * tick))
                if not chunk:
                    done[i] = True
                got[i] += chunk
            except BlockingIOError:
                pass
            except OSError:
                done[i] = True
        if signalled is None and time.monotonic() - t0 >= 1:
            os.kill(pid, getattr(signal, "SIG" + sig))
            signalled = time.monotonic()
        if signalled is not None and exited is None and not os.path.exists(f"/proc/{pid}/status"):
            exited = time.monotonic() - signalled
        time.sleep(tick)
    for s in conns:
        s.close()
    while exited is None and signalled is not None and time.monotonic() - signalled < 60:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    exited = time.monotonic() - signalled
        except OSError:
            exited = time.monotonic() - signalled
        time.sleep(0.05)
    whole = 0
    for g in got:
        h, _, body = g.partition(b"\r\n\r\n")
        for line in h.split(b"\r\n"):
            if line.lower().startswith(b"content-length:") and len(body) >= int(line.split(b":")[1]):
                whole += 1
    return {"n": n, "path": path, "rate_Bps": rate, "signal": sig, "whole": whole,
            "bytes": sum(len(g) for g in got), "exit_s": None if exited is None else round(exited, 1)}


def slowloris(csv):
    rows = []
    with open(csv) as f:
        next(f)
        for line in f:
            p = line.strip().split(",")
            if len(p) >= 5:
                rows.append([int(x) for x in p[:5]])
    return {"seconds": len(rows), "unavailable_s": sum(1 for r in rows if r[4] == 0),
            "max_connected": max((r[3] for r in rows), default=0),
            "closed_by_server": rows[-1][1] if rows else 0}


SUMMARY = {
    "fd": lambda d: (f"served {d['served']}, queued {d['queued']}, refused {d['refused']} of {d['clients']}; "
                     f"CPU {d['cpu_pct']}%; {d['log_lines']} log lines; recovered after {d['recovered_s']} s; "
                     f"SIGTERM exit {d['sigterm_exit_s']} s; RSS {d['rss_kb'] // 1024} MB"),
    "pipeline": lambda d: (f"took {d['requests_taken']} of {d['n']} requests; RSS +{d['rss_growth_kb'] // 1024} MB "
                           f"(peak {d['rss_peak_kb'] // 1024} MB); GET / on another connection: {d['other_get_s']} s"),
    "slowread": lambda d: (f"{d['bytes']} of {d['length']} bytes in {d['seconds']} s at {d['rate_Bps']} B/s: "
                           + ("complete" if d["complete"] else "CUT")),
    "stopread": lambda d: (f"read {d['read_bytes']} B then stopped: server gave up after {d['closed_after_s']} s "
                           f"(watched {d['limit_s']} s)"),
    "idlekeep": lambda d: (f"{d['served']} of {d['n']} idle keep-alive at the limit; a new client served after "
                           f"{d['new_client_s']} s; {d['idle_closed']} idle ones closed for it"),
    "stopslow": lambda d: (f"SIG{d['signal']} 1 s into {d['n']} readers of {d['path']} at {d['rate_Bps']} B/s: "
                           f"{d['whole']} of {d['n']} got the whole answer; exit after {d['exit_s']} s"),
    "soak": lambda d: (f"{d['sent']} mutated requests in {d['secs']:.0f} s: "
                       + ", ".join(f"{k} {d[k]}" for k in sorted(d) if k.endswith("xx"))
                       + f", closed {d['closed']}, no answer {d['no_answer']}, reset {d['reset']}; RSS "
                       f"{d['rss_10s_kb'] // 1024} MB at 10 s, {d['rss_end_kb'] // 1024} MB at the end, "
                       f"{d['rss_after_kb'] // 1024} MB after; serving after: {d['answers_after']}"),
    "slowloris": lambda d: (f"{d['max_connected']} connections held; probe found it unavailable "
                            f"{d['unavailable_s']} of {d['seconds']} s; {d['closed_by_server']} closed by the server"),
}


def summary():
    """stdin: lines `PART SERVER JSON`; stdout: a Markdown table."""
    print("| part | server | result |\n|---|---|---|")
    for line in sys.stdin:
        part, srv, js = line.rstrip("\n").split(" ", 2)
        print(f"| {part} | {srv} | {SUMMARY[part](json.loads(js))} |")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "summary":
        return summary()
    if cmd == "fdflood":
        out = fdflood(int(args[0]), int(args[1]), int(args[2]), float(args[3]), args[4])
    elif cmd == "pipeline":
        out = pipeline(int(args[0]), int(args[1]), int(args[2]))
    elif cmd == "slowread":
        out = slowread(int(args[0]), int(args[1]), args[2], int(args[3]), float(args[4]))
    elif cmd == "stopread":
        out = stopread(int(args[0]), int(args[1]), args[2], float(args[3]))
    elif cmd == "idlekeep":
        out = idlekeep(int(args[0]), int(args[1]), int(args[2]))
    elif cmd == "stopslow":
        out = stopslow(int(args[0]), int(args[1]), args[2], int(args[3]), args[4], int(args[5]))
    elif cmd == "slowloris":
        out = slowloris(args[0])
    else:
        sys.exit(__doc__)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
