#!/usr/bin/python3
"""Mixed abuse for bench/limits.sh's soak part (stdlib only; slowhttptest runs beside it).

  soak.py PORT PID SECS SEED   for SECS s: mutated requests (byte flips, inserts, deletes,
                               duplicated spans of valid HTTP/1.1 requests) each on a new
                               connection, idle keep-alive connections opened and dropped, and
                               pipelined GET /big with a tiny receive window dropped half-read;
                               samples the server tree's RSS every 5 s. Prints one JSON line:
                               requests sent, answers by status class, no answer, 5xx, RSS at
                               10 s / at the end / 5 s after the end, and whether the server
                               still answers GET /.
Every loop is bounded in count and time; traffic goes to 127.0.0.1 only."""
import json
import random
import socket
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from limitsbench import one_get, rss_kb  # noqa: E402

BASE = [
    b"GET / HTTP/1.1\r\nHost: soak\r\nUser-Agent: x\r\nAccept: */*\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: soak\r\nContent-Length: 11\r\n\r\nhello world",
    b"POST / HTTP/1.1\r\nHost: soak\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nT: v\r\n\r\n",
    b"GET /big HTTP/1.1\r\nHost: soak\r\nRange: bytes=0-10,5-20\r\nConnection: keep-alive\r\n\r\nGET / HTTP/1.1\r\nHost: soak\r\n\r\n",
    b"GET /%2e%2e/x?a=b HTTP/1.0\r\nHost: soak\r\nConnection: keep-alive\r\n\r\n",
]


def mutate(rng, b):
    b = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        i = rng.randrange(len(b)) if b else 0
        if op == 0 and b:
            b[i] = rng.randrange(256)
        elif op == 1:
            b[i:i] = bytes([rng.choice(b"\r\n :;,\x00\x7f\xff0-9a")])
        elif op == 2 and b:
            del b[i:i + rng.randint(1, 8)]
        elif op == 3 and b:
            j = min(len(b), i + rng.randint(1, 40))
            b[i:i] = b[i:j] * rng.randint(1, 50)
        else:
            b[i:i] = str(rng.choice([-1, 2**63, 2**64 + 1, 99999999999999999999])).encode()
    return bytes(b)


def one(port, data, counts):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            got = s.recv(64)
            if not got:
                counts["closed"] += 1
            elif got.startswith(b"HTTP/1."):
                cls = got[9:10].decode(errors="replace") + "xx"
                counts[cls] = counts.get(cls, 0) + 1
            else:
                counts["other"] += 1
    except socket.timeout:
        counts["no_answer"] += 1
    except OSError:
        counts["reset"] += 1


def main():
    port, pid, secs, seed = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    counts = {"sent": 0, "closed": 0, "other": 0, "no_answer": 0, "reset": 0}
    rss = []
    idle, t0, next_sample = [], time.monotonic(), 0.0
    while time.monotonic() - t0 < secs:
        el = time.monotonic() - t0
        if el >= next_sample:
            rss.append((round(el), rss_kb(pid)))
            next_sample += 5
        one(port, mutate(rng, rng.choice(BASE)), counts)
        counts["sent"] += 1
        if counts["sent"] % 10 == 0:  # idle keep-alive churn: at most 200 held
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=1)
                s.sendall(BASE[0])
                idle.append(s)
            except OSError:
                pass
            if len(idle) > 200:
                idle.pop(0).close()
        if counts["sent"] % 50 == 0:  # a pipelined download dropped half-read
            try:
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.settimeout(1)
                s.connect(("127.0.0.1", port))
                s.sendall(b"GET /big HTTP/1.1\r\nHost: soak\r\n\r\n" * 8)
                s.recv(4096)
                s.close()
            except OSError:
                pass
    for s in idle:
        s.close()
    end = rss_kb(pid)
    time.sleep(5)
    after = rss_kb(pid)
    ok = one_get(port, 5) is not None
    at10 = next((r for t, r in rss if t >= 10), rss[0][1] if rss else 0)
    print(json.dumps({"secs": secs, **counts, "rss_10s_kb": at10, "rss_end_kb": end,
                      "rss_after_kb": after, "rss_samples": rss, "answers_after": ok}), flush=True)


if __name__ == "__main__":
    main()
