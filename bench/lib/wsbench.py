#!/usr/bin/python3
"""bench/lib/wsbench.py: WebSocket load for bench/websocket.sh (asyncio, raw frames: no client
library in the measured path).

  wsbench.py idle PORT N h1|tls|h2 PATH   open N/10 sockets, print "ready K", wait for a line on
                                         stdin, open the rest, print "ready N", hold them until
                                         stdin closes
  wsbench.py echo PORT CONNS SECONDS SIZE WINDOW   each connection keeps WINDOW masked text
                                         messages of SIZE bytes in flight; prints messages echoed
  wsbench.py broadcast PORT N ROUNDS     N sockets on /room; GET /publish ROUNDS times; prints the
                                         time from each publish to the last socket's delivery
  wsbench.py pingpong PORT WARM N SIZE   one socket on /echo: WARM round trips (one message in
                                         flight), prints "warm", waits for a line on stdin, then N
                                         round trips, prints "done N" (bench/websocket.sh's ir
                                         part zeroes and dumps callgrind's counters around the N)
"""
import asyncio, base64, json, os, socket, ssl, struct, sys, time

MASK = b"\x11\x22\x33\x44"


def frame(payload, op=1):
    n = len(payload)
    if n < 126:
        h = bytes([0x80 | op, 0x80 | n])
    elif n < 65536:
        h = bytes([0x80 | op, 0x80 | 126]) + struct.pack(">H", n)
    else:
        h = bytes([0x80 | op, 0x80 | 127]) + struct.pack(">Q", n)
    return h + MASK + bytes(b ^ MASK[i & 3] for i, b in enumerate(payload))


async def handshake(port, path, tls=False):
    ctx = None
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["http/1.1"])
    r, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, limit=1 << 22)
    key = base64.b64encode(os.urandom(16)).decode()
    w.write(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, key)).encode())
    head = await r.readuntil(b"\r\n\r\n")
    if b" 101 " not in head.split(b"\r\n")[0]:
        raise RuntimeError(head[:80])
    return r, w


async def read_frame(r):
    h = await r.readexactly(2)
    n = h[1] & 127
    if n == 126:
        n = struct.unpack(">H", await r.readexactly(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", await r.readexactly(8))[0]
    return h[0] & 15, await r.readexactly(n)


async def h2_ws(port, path):
    """one HTTP/2 connection with one RFC 8441 stream (python3-h2)"""
    import h2.connection, h2.config, h2.events
    r, w = await asyncio.open_connection("127.0.0.1", port)
    c = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    w.write(c.data_to_send())
    got = False
    while not got:
        for ev in c.receive_data(await r.read(65536)):
            if isinstance(ev, h2.events.RemoteSettingsChanged):
                got = True
        w.write(c.data_to_send())
    c.send_headers(1, [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "http"),
                       (":path", path), (":authority", "127.0.0.1"), ("sec-websocket-version", "13")])
    w.write(c.data_to_send())
    ok = False
    while not ok:
        for ev in c.receive_data(await r.read(65536)):
            if isinstance(ev, h2.events.ResponseReceived):
                ok = True
        w.write(c.data_to_send())
    return r, w, c


async def idle(port, n, mode, path):
    conns = []
    # TLS handshakes cost the client most: fewer at once, so none waits past the server's
    # tls_handshake_timeout_ms on a loaded box
    sem = asyncio.Semaphore(16 if mode == "tls" else 200)

    async def one():
        async with sem:
            if mode == "h2":
                conns.append(await h2_ws(port, path))
            else:
                conns.append(await handshake(port, path, tls=(mode == "tls")))

    # a tenth first (the server's one-time costs: TLS module, Lua modules, buffers), then the
    # rest once the caller has read the RSS (it writes a line to stdin)
    first = max(1, n // 10)
    await asyncio.gather(*(one() for _ in range(first)))
    print("ready %d" % len(conns), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    await asyncio.gather(*(one() for _ in range(n - first)))
    print("ready %d" % len(conns), flush=True)
    await loop.run_in_executor(None, sys.stdin.read)


def count_frames(buf):
    """complete server frames at the start of buf: (count, bytes they take)"""
    i, n = 0, 0
    while len(buf) - i >= 2:
        k, ln = 2, buf[i + 1] & 127
        if ln == 126:
            if len(buf) - i < 4:
                break
            ln, k = struct.unpack_from(">H", buf, i + 2)[0], 4
        elif ln == 127:
            if len(buf) - i < 10:
                break
            ln, k = struct.unpack_from(">Q", buf, i + 2)[0], 10
        if len(buf) - i < k + ln:
            break
        i += k + ln
        n += 1
    return n, i


async def echo(port, conns, seconds, size, window):
    """each connection writes WINDOW frames in one write, then reads until all WINDOW echoes are
    in (bulk reads, frames counted in place): the client spends little per message, so the
    server, not the client, is what the count measures per server CPU-second"""
    batch = frame(b"x" * size) * window
    stop = time.time() + seconds
    counts = [0] * conns

    async def one(i):
        r, w = await handshake(port, "/echo")
        buf = b""
        while time.time() < stop:
            w.write(batch)
            got = 0
            while got < window:
                buf += await r.read(1 << 20)
                n, used = count_frames(buf)
                buf = buf[used:]
                got += n
            counts[i] += got
        w.close()

    await asyncio.gather(*(one(i) for i in range(conns)))
    print(sum(counts))


async def broadcast(port, n, rounds):
    socks = []
    sem = asyncio.Semaphore(200)

    async def one():
        async with sem:
            socks.append(await handshake(port, "/room"))

    await asyncio.gather(*(one() for _ in range(n)))
    loop = asyncio.get_running_loop()
    out = []
    for _ in range(rounds):
        t0 = time.time()
        pub = loop.run_in_executor(None, lambda: socket.create_connection(("127.0.0.1", port)).sendall(
            b"GET /publish?size=64 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
        await asyncio.gather(*(read_frame(r) for r, w in socks))
        out.append(time.time() - t0)
        await pub
        await asyncio.sleep(0.5)
    print(json.dumps(out))


async def pingpong(port, warm, n, size):
    r, w = await handshake(port, "/echo")
    msg = frame(b"x" * size)

    async def trips(k):
        for _ in range(k):
            w.write(msg)
            op, data = await read_frame(r)
            if op != 1 or len(data) != size:
                raise RuntimeError("bad echo: op %d, %d bytes" % (op, len(data)))

    await trips(warm)
    print("warm", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await trips(n)
    print("done %d" % n, flush=True)
    w.close()


what = sys.argv[1]
a = sys.argv[2:]
if what == "idle":
    asyncio.run(idle(int(a[0]), int(a[1]), a[2], a[3]))
elif what == "pingpong":
    asyncio.run(pingpong(int(a[0]), int(a[1]), int(a[2]), int(a[3])))
elif what == "echo":
    asyncio.run(echo(int(a[0]), int(a[1]), float(a[2]), int(a[3]), int(a[4])))
else:
    asyncio.run(broadcast(int(a[0]), int(a[1]), int(a[2])))
