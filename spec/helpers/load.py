#!/usr/bin/python3
"""spec/helpers/load.py: N concurrent keep-alive HTTP/1.1 clients against one path, and a
separate prober process that times a cheap path on the same server meanwhile.

usage: load.py HOST PORT PATH CLIENTS SECONDS [PROBE_PATH] [PROBE_EVERY_MS]
prints one JSON object: {"status": {"200": n, "503": n}, "errors": n, "done": n, "rps": x,
"probe": {"n": n, "p50_ms": x, "p90_ms": x, "p99_ms": x, "max_ms": x, "errors": n}}

Clients connect over a 0.5 s ramp-up; a client that gets 503 waits for its Retry-After (at most
1 s, with +-50% jitter) before it retries, as a
polite client does; this keeps the load generator itself from eating the CPU the server needs.
The prober runs in a child process with blocking sockets, so its timings do not include the
load generator's own event-loop delays."""
import asyncio
import json
import random
import multiprocessing
import socket
import sys
import time


def probe(host, port, path, every_ms, seconds, out):
    lat, errors = [], 0
    deadline = time.monotonic() + seconds
    req = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    s = None
    reconnects = 0
    while time.monotonic() < deadline:
        try:
            if s is None:
                # the connect is not timed: the probe measures the worker's answer, not the
                # kernel's accept queue while 500 clients connect at once
                s = socket.create_connection((host, port), timeout=2)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                reconnects += 1
        except OSError:
            errors += 1
            time.sleep(every_ms / 1000)
            continue
        t0 = time.monotonic()
        try:
            s.sendall(req)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    raise OSError("closed")
                buf += chunk
            head, _, body = buf.partition(b"\r\n\r\n")
            cl = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    cl = int(line.split(b":")[1])
            while len(body) < cl:
                body += s.recv(4096)
            if not head.startswith(b"HTTP/1.1 200"):
                errors += 1
            lat.append((time.monotonic() - t0) * 1000)
        except OSError:
            errors += 1
            s = None
        left = every_ms / 1000 - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
    lat.sort()
    n = len(lat)
    res = {"n": n, "errors": errors, "connects": reconnects}
    if n:
        res.update(p50_ms=round(lat[n // 2], 2), p90_ms=round(lat[min(n - 1, int(n * 0.9))], 2),
                   p99_ms=round(lat[min(n - 1, int(n * 0.99))], 2), max_ms=round(lat[-1], 2))
    out.put(res)


async def client(host, port, path, deadline, stats, ramp):
    req = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    reader = writer = None
    await asyncio.sleep(random.uniform(0, ramp))  # clients connect over the ramp-up
    while time.monotonic() < deadline:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            writer.write(req)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            status = head[9:12].decode()
            cl, retry, close = 0, 0, False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    cl = int(value)
                elif name == b"retry-after":
                    retry = float(value)
                elif name == b"connection" and value.strip().lower() == b"close":
                    close = True
            if cl:
                await reader.readexactly(cl)
            stats["status"][status] = stats["status"].get(status, 0) + 1
            if status == "200":
                stats["ok_times"].append(time.monotonic())
            stats["done"] += 1
            if close:
                writer.close()
                reader = writer = None
            if status == "503":
                # Retry-After with jitter, as well-behaved clients do (no thundering herd)
                await asyncio.sleep((min(retry, 1.0) or 0.05) * random.uniform(0.5, 1.5))
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError,
                asyncio.LimitOverrunError) as e:
            stats["errors"] += 1
            stats.setdefault("error_kinds", {})
            stats["error_kinds"][type(e).__name__] = stats["error_kinds"].get(type(e).__name__, 0) + 1
            if writer is not None:
                writer.close()
            reader = writer = None
            await asyncio.sleep(0.01)
    if writer is not None:
        writer.close()


async def main_async(host, port, path, clients, seconds):
    stats = {"status": {}, "errors": 0, "done": 0, "ok_times": []}
    deadline = time.monotonic() + seconds
    t0 = time.monotonic()
    await asyncio.gather(*(client(host, port, path, deadline, stats, min(0.5, seconds / 4)) for _ in range(clients)))
    stats["seconds"] = round(time.monotonic() - t0, 3)
    stats["rps"] = round(stats["status"].get("200", 0) / max(stats["seconds"], 0.001), 2)
    # steady state: 200s completed between the end of the ramp-up (+0.5 s) and the deadline,
    # without the start (queue filling) and the drain after the deadline
    a, b = t0 + min(0.5, seconds / 4) + 0.5, deadline
    steady = [t for t in stats.pop("ok_times") if a <= t <= b]
    stats["rps_steady"] = round(len(steady) / max(b - a, 0.001), 2)
    return stats


def main():
    host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    clients, seconds = int(sys.argv[4]), float(sys.argv[5])
    probe_path = sys.argv[6] if len(sys.argv) > 6 else None
    every = float(sys.argv[7]) if len(sys.argv) > 7 else 10
    q = multiprocessing.Queue()
    p = None
    if probe_path:
        p = multiprocessing.Process(target=probe, args=(host, port, probe_path, every, seconds, q))
        p.start()
    stats = asyncio.run(main_async(host, port, path, clients, seconds))
    if p:
        stats["probe"] = q.get(timeout=seconds + 30)
        p.join()
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
