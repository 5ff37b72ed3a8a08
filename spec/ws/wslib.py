#!/usr/bin/python3
"""python3-websockets (asyncio client, permessage-deflate offered by default) against the echo
endpoint of spec/websocket_spec.lua: text, binary, a 200 KB random message, a ping, a clean
close. Prints a JSON object of booleans (and the close code, the negotiated extension)."""
import asyncio, json, os, sys

import websockets


async def main(port):
    out = {}
    async with websockets.connect("ws://127.0.0.1:%d/ws" % port, max_size=2 ** 22) as ws:
        exts = ws.response_headers.get("Sec-WebSocket-Extensions", "")
        out["extensions"] = exts.split(";")[0]
        await ws.send("héllo")
        out["text"] = (await ws.recv()) == "héllo"
        await ws.send(b"\x00\x01\xff")
        out["binary"] = (await ws.recv()) == b"\x00\x01\xff"
        big = os.urandom(100000).hex()
        await ws.send(big)
        out["big"] = (await ws.recv()) == big
        pong = await ws.ping(b"abc")
        await asyncio.wait_for(pong, 10)
        out["ping"] = True
        await ws.close(1000)
        out["close_code"] = ws.close_code
    return out


print(json.dumps(asyncio.run(main(int(sys.argv[1])))))
