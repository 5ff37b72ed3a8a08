#!/usr/bin/python3
"""spec/ws/idle_mem.py PORT PATH WARM N: what idle WebSockets cost the server (spec/ws_memory_spec.lua).
Opens WARM sockets and closes them (so the worker's buffer cache and pools are at their burst
size before the baseline), reads GET /gc (the server's Lua heap and C heap in use after a full Lua
GC, "<lua> <c>"), opens N sockets (handshake only, 50 at a time) and leaves them idle 1 s, reads
/gc again, then sends one text frame on every 50th socket and reads its echo (the sockets are
alive and their readers start on input). Prints JSON: {"n", "lua0", "c0", "lua1", "c1",
"echoed", "probes"}. stdlib only.
spec/ws/idle_mem.py PORT PATH WARM N sse: the same with SSE streams (GET PATH, read until the
first event), no probes.
spec/ws/idle_mem.py PORT PATH churn K ROUNDS [sse]: opens K WebSockets (or SSE streams, read
until their first event) and closes them, ROUNDS times, and prints the JSON list of /gc readings
after each round (a stream whose end does not give it back grows the C heap every round)."""
import asyncio, base64, json, os, struct, sys, urllib.request


async def handshake(port, path):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    w.write(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, key)).encode())
    head = await r.readuntil(b"\r\n\r\n")
    if b" 101 " not in head.split(b"\r\n")[0]:
        raise RuntimeError(head[:80])
    return r, w


def frame(data):
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    return bytes([0x81, 0x80 | len(data)]) + mask + body


def gc(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/gc" % port, timeout=30) as f:
        lua, c = f.read().decode().split()
        return int(lua), int(c)


async def open_many(port, path, n, sse=False):
    sem = asyncio.Semaphore(50)
    conns = []

    async def one():
        async with sem:
            for attempt in range(5):
                try:
                    conns.append(await (open_sse(port, path) if sse else handshake(port, path)))
                    return
                except (ConnectionError, OSError):
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.2)

    await asyncio.gather(*(one() for _ in range(n)))
    return conns


async def open_sse(port, path):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path).encode())
    buf = b""
    while b"\r\n\r\n" not in buf or b"\n\n" not in buf.split(b"\r\n\r\n", 1)[1]:
        d = await r.read(4096)
        if not d:
            raise RuntimeError("closed: %r" % buf[:80])
        buf += d
    return r, w


async def churn(port, path, k, rounds, sse):
    loop = asyncio.get_running_loop()
    out = []
    for _ in range(rounds):
        sem = asyncio.Semaphore(50)
        conns = []

        async def one():
            async with sem:
                conns.append(await (open_sse(port, path) if sse else handshake(port, path)))

        await asyncio.gather(*(one() for _ in range(k)))
        for r, w in conns:
            w.close()
        await asyncio.sleep(1.5)
        out.append(list(await loop.run_in_executor(None, gc, port)))
    print(json.dumps(out))


async def main():
    if sys.argv[3] == "churn":
        await churn(int(sys.argv[1]), sys.argv[2], int(sys.argv[4]), int(sys.argv[5]),
                    len(sys.argv) > 6 and sys.argv[6] == "sse")
        return
    port, path, warm, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sse = len(sys.argv) > 5 and sys.argv[5] == "sse"
    loop = asyncio.get_running_loop()
    warmed = await open_many(port, path, warm, sse)
    for r, w in warmed:
        w.close()
    await asyncio.sleep(1.5)
    lua0, c0 = await loop.run_in_executor(None, gc, port)
    conns = await open_many(port, path, n, sse)
    await asyncio.sleep(1.0)
    lua1, c1 = await loop.run_in_executor(None, gc, port)
    echoed, probes = 0, 0
    for i in range(0, 0 if sse else n, 50):
        r, w = conns[i]
        msg = b"probe %d" % i
        w.write(frame(msg))
        probes += 1
        h = await asyncio.wait_for(r.readexactly(2), 10)
        data = await r.readexactly(h[1] & 127)
        if h[0] == 0x81 and data == msg:
            echoed += 1
    for r, w in conns:
        w.close()
    print(json.dumps({"n": n, "lua0": lua0, "c0": c0, "lua1": lua1, "c1": c1,
                      "echoed": echoed, "probes": probes}))


asyncio.run(main())
