#!/usr/bin/python3
"""bench/lib/streamsbench.py PROTO PORT PATH N [STREAMS_PER_CONN]: opens N idle long-lived
streams (SSE: GET PATH, read until the first event) on 127.0.0.1:PORT and holds them; prints
"ready N" once all have their first event, then waits for stdin to close (the bench script
measures the server meanwhile), then closes them. PROTO: h1, h1+tls, h2c, h2 (TLS, ALPN h2).
With h2/h2c, STREAMS_PER_CONN streams share one connection (default 1). stdlib + python3-h2."""
import asyncio
import ssl
import sys


async def open_h1(port, path, tls):
    ctx = None
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["http/1.1"])
    r, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    buf = b""
    while b"\n\n" not in buf.split(b"\r\n\r\n", 1)[-1] or b"\r\n\r\n" not in buf:
        d = await r.read(4096)
        if not d:
            raise RuntimeError("closed: " + buf.decode(errors="replace"))
        buf += d
    return (r, w)


async def open_h2(port, path, tls, per_conn):
    import h2.config
    import h2.connection
    import h2.events
    ctx = None
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
    r, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    ids = []
    for i in range(per_conn):
        sid = c.get_next_available_stream_id()
        c.send_headers(sid, [(":method", "GET"), (":scheme", "https" if tls else "http"),
                             (":path", path), (":authority", "x")], end_stream=True)
        ids.append(sid)
    w.write(c.data_to_send())
    got = set()
    while len(got) < per_conn:
        d = await r.read(65536)
        if not d:
            raise RuntimeError("h2 connection closed")
        for e in c.receive_data(d):
            if isinstance(e, h2.events.DataReceived):
                c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                got.add(e.stream_id)
        w.write(c.data_to_send())
    return (r, w, c)


async def main():
    proto, port, path, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    per = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    conns = []
    sem = asyncio.Semaphore(50 if proto in ("h1+tls", "h2") else 200)

    async def one():
        async with sem:
            for attempt in range(5):  # a loaded box may reset a handshake: try again
                try:
                    if proto in ("h1", "h1+tls"):
                        conns.append(await open_h1(port, path, proto == "h1+tls"))
                    else:
                        conns.append(await open_h2(port, path, proto == "h2", per))
                    return
                except (ConnectionError, OSError, RuntimeError):
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.2)

    nconn = n if proto in ("h1", "h1+tls") else (n + per - 1) // per
    await asyncio.gather(*(one() for _ in range(nconn)))
    print("ready", nconn * (1 if proto in ("h1", "h1+tls") else per), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    for c in conns:
        c[1].close()


asyncio.run(main())
