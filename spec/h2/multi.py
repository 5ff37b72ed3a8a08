#!/usr/bin/python3
"""spec/h2_idle_mem_spec.lua's client: CONNS connections at once (one thread, a selector), each
with STREAMS concurrent GET /pat/SIZE/c<i>s<j>; every body must be the pattern that names its
stream, byte for byte. Prints one JSON line: {"ok": n, "bad": [...]}.

  multi.py PORT CONNS STREAMS SIZE [tls]
"""
import json
import selectors
import socket
import ssl
import sys
import time

import h2.config
import h2.connection
import h2.events


def expected(tag, n):
    out, i, ln = [], 0, 0
    while ln < n:
        s = "<%s:%08d>" % (tag, i)
        out.append(s)
        ln += len(s)
        i += 1
    return "".join(out)[:n].encode()


def main():
    port, nconn, nstream, size = (int(x) for x in sys.argv[1:5])
    tls = len(sys.argv) > 5 and sys.argv[5] == "tls"
    sel = selectors.DefaultSelector()
    conns = []
    for c in range(1, nconn + 1):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["h2"])
            s = ctx.wrap_socket(s, server_hostname="localhost")
        h = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        h.initiate_connection()
        st = {}
        for j in range(1, nstream + 1):
            sid = h.get_next_available_stream_id()
            tag = "c%ds%d" % (c, j)
            h.send_headers(sid, [(":method", "GET"), (":path", "/pat/%d/%s" % (size, tag)),
                                 (":scheme", "https" if tls else "http"), (":authority", "localhost")],
                           end_stream=True)
            st[sid] = {"tag": tag, "body": bytearray(), "done": False}
        s.sendall(h.data_to_send())
        s.setblocking(False)
        conn = {"s": s, "h": h, "st": st}
        conns.append(conn)
        sel.register(s, selectors.EVENT_READ, conn)
    deadline = time.time() + 60
    while any(not x["done"] for c in conns for x in c["st"].values()) and time.time() < deadline:
        for key, _ in sel.select(1):
            conn = key.data
            try:
                data = conn["s"].recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError):
                continue
            if not data:
                sel.unregister(conn["s"])
                continue
            for ev in conn["h"].receive_data(data):
                if isinstance(ev, h2.events.DataReceived):
                    conn["st"][ev.stream_id]["body"] += ev.data
                    conn["h"].acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    conn["st"][ev.stream_id]["done"] = True
            out = conn["h"].data_to_send()
            if out:
                conn["s"].setblocking(True)
                conn["s"].sendall(out)
                conn["s"].setblocking(False)
    ok, bad = 0, []
    for c in conns:
        for x in c["st"].values():
            if x["done"] and bytes(x["body"]) == expected(x["tag"], size):
                ok += 1
            else:
                bad.append("%s: %d bytes%s" % (x["tag"], len(x["body"]), "" if x["done"] else " (not ended)"))
    print(json.dumps({"ok": ok, "bad": bad}))


if __name__ == "__main__":
    main()
