#!/usr/bin/python3
"""k.send_to and k.publish against a running khamsin (spec/websocket_spec.lua).

pushclient.py PORT sendto N: one socket on /info learns its ws.id, then N HTTP requests
  GET /send?id=..&data=mI (keep-alive off: they spread over the workers) and one GET /later
  (a timer sends "from a timer"); prints {"id", "got": [...texts...], "http": [...bodies...]}.
pushclient.py PORT broadcast FAST COUNT SIZE: FAST sockets on /room read everything, one raw
  socket on /room never reads until the publishing is over; GET /publish?count=&size= makes the
  server k.publish COUNT messages of SIZE bytes to "room". Prints {"fast": [messages per fast
  socket], "slow_messages": n, "slow_close": code|null, "seconds": time to the last delivery}.
"""
import asyncio, base64, json, os, socket, struct, sys, time, urllib.request

import websockets


def http_get(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=30) as r:
        return r.read().decode()


async def sendto(port, n):
    out = {"got": [], "http": []}
    async with websockets.connect("ws://127.0.0.1:%d/info" % port, compression=None) as ws:
        await ws.send("id")
        wid = await ws.recv()
        out["id"] = wid
        loop = asyncio.get_running_loop()
        for i in range(n):
            out["http"].append(await loop.run_in_executor(None, http_get, port, "/send?id=%s&data=m%d" % (wid, i)))
        out["http"].append(await loop.run_in_executor(None, http_get, port, "/later?id=%s" % wid))
        while len(out["got"]) < n + 1:
            out["got"].append(await asyncio.wait_for(ws.recv(), 20))
        await ws.close()
    return out


def raw_connect(port, path):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, key)).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(1)
    return s


def read_all_frames(s, timeout):
    s.settimeout(timeout)
    buf = b""
    while True:
        try:
            d = s.recv(1 << 20)
        except (socket.timeout, ConnectionResetError):
            break
        if not d:
            break
        buf += d
    msgs, close = 0, None
    i = 0
    while i + 2 <= len(buf):
        op, n, k = buf[i] & 15, buf[i + 1] & 127, 2
        if n == 126:
            n, k = struct.unpack(">H", buf[i + 2:i + 4])[0], 4
        elif n == 127:
            n, k = struct.unpack(">Q", buf[i + 2:i + 10])[0], 10
        if i + k + n > len(buf):
            break
        if op == 1:
            msgs += 1
        elif op == 8:
            close = struct.unpack(">H", buf[i + k:i + k + 2])[0] if n >= 2 else 1005
        i += k + n
    return msgs, close


async def broadcast(port, nfast, count, size):
    fast = [await websockets.connect("ws://127.0.0.1:%d/room" % port, compression=None, max_size=None,
                                     max_queue=None) for _ in range(nfast)]
    slow = raw_connect(port, "/room")
    loop = asyncio.get_running_loop()
    t0 = time.time()
    pub = loop.run_in_executor(None, http_get, port, "/publish?count=%d&size=%d" % (count, size))
    counts = [0] * nfast

    async def drain(i, ws):
        while counts[i] < count:
            await asyncio.wait_for(ws.recv(), 60)
            counts[i] += 1

    await asyncio.gather(*(drain(i, ws) for i, ws in enumerate(fast)))
    seconds = time.time() - t0
    await pub
    for ws in fast:
        await ws.close()
    msgs, close = read_all_frames(slow, 5)
    return {"fast": counts, "slow_messages": msgs, "slow_close": close, "seconds": seconds}


port, what = int(sys.argv[1]), sys.argv[2]
if what == "sendto":
    print(json.dumps(asyncio.run(sendto(port, int(sys.argv[3])))))
else:
    print(json.dumps(asyncio.run(broadcast(port, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))))
