#!/usr/bin/python3
"""spec/h2/h2c_upgrade.py: the h2c Upgrade smuggling attempt, for spec/h2c_upgrade_spec.lua.

usage: h2c_upgrade.py PORT JSON
JSON: {"path": "/" (the upgrade request), "then": "/admin" (asked over HTTP/2 afterwards),
       "connection": "Upgrade, HTTP2-Settings" (the Connection value sent),
       "settings": null (python3-h2's own HTTP2-Settings) | "<literal value>" | false (none)}

Sends an HTTP/1.1 request with Upgrade: h2c on a raw socket. If the answer is 101, speaks
HTTP/2 over the same connection (python3-h2: the answer to the upgrade request on stream 1),
then sends HEADERS for `then` on stream 3. If the answer is not 101, reads it whole and sends
the HTTP/2 preface, SETTINGS and HEADERS for `then` anyway, as an attacker would, and records
what comes back. Prints one JSON line:
  {"status": <status of the upgrade request>, "upgraded": bool, "body": <its body>,
   "then_status": <HTTP/2 status of `then`, or null>, "then_body": str|null,
   "after": <first line of what came back to the preface when not upgraded>, "closed": bool}
"""
import json
import socket
import sys

import h2.config
import h2.connection
import h2.events


def h2conn():
    cfg = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    return h2.connection.H2Connection(cfg)


def read_head(sock, buf):
    while b"\r\n\r\n" not in buf:
        d = sock.recv(65536)
        if not d:
            raise EOFError("closed before the response head: %r" % buf[:200])
        buf += d
    i = buf.index(b"\r\n\r\n")
    head, rest = buf[:i].decode("latin-1"), buf[i + 4:]
    lines = head.split("\r\n")
    status = int(lines[0].split(" ")[1])
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, rest


def h2_exchange(sock, c, sid, path, host, out, first=b""):
    """Sends HEADERS for path on sid; pumps until sid ends. Fills out[then_status/then_body]."""
    c.send_headers(sid, [(":method", "GET"), (":scheme", "http"), (":authority", host),
                         (":path", path)], end_stream=True)
    sock.sendall(c.data_to_send())
    bodies = {}
    data = first
    while True:
        if data:
            for ev in c.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived):
                    for k, v in ev.headers:
                        if k == ":status":
                            if ev.stream_id == sid:
                                out["then_status"] = int(v)
                            elif ev.stream_id == 1:
                                out["stream1_status"] = int(v)
                elif isinstance(ev, h2.events.DataReceived):
                    bodies[ev.stream_id] = bodies.get(ev.stream_id, b"") + ev.data
                    c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                    out["then_body"] = bodies.get(sid, b"").decode("latin-1")
                    out["stream1_body"] = bodies.get(1, b"").decode("latin-1")
                    return
                elif isinstance(ev, (h2.events.ConnectionTerminated, h2.events.StreamReset)):
                    out["h2_error"] = type(ev).__name__
                    return
            pending = c.data_to_send()
            if pending:
                sock.sendall(pending)
        data = sock.recv(65536)
        if not data:
            out["closed"] = True
            return


def main():
    port = int(sys.argv[1])
    opt = json.loads(sys.argv[2])
    path, then = opt.get("path", "/"), opt.get("then", "/admin")
    host = "127.0.0.1:%d" % port
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    c = h2conn()
    settings = c.initiate_upgrade_connection()
    if isinstance(settings, bytes):
        settings = settings.decode("ascii")
    if opt.get("settings") is False:
        settings = None
    elif opt.get("settings"):
        settings = opt["settings"]
    req = "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: %s\r\nUpgrade: h2c\r\n" % (
        path, host, opt.get("connection", "Upgrade, HTTP2-Settings"))
    if settings is not None:
        req += "HTTP2-Settings: %s\r\n" % settings
    sock.sendall((req + "\r\n").encode("latin-1"))
    out = {"status": None, "upgraded": False, "body": None, "then_status": None,
           "then_body": None, "after": None, "closed": False}
    try:
        status, hdrs, rest = read_head(sock, b"")
    except EOFError:
        out["closed"] = True
        print(json.dumps(out))
        return
    out["status"] = status
    if status == 101:
        out["upgraded"] = True
        sock.sendall(c.data_to_send())  # the client preface and SETTINGS
        h2_exchange(sock, c, 3, then, host, out, rest)
        print(json.dumps(out))
        return
    # not upgraded: read the HTTP/1.1 answer whole (Content-Length), then try HTTP/2 anyway
    n = int(hdrs.get("content-length", "0"))
    try:
        while len(rest) < n:
            d = sock.recv(65536)
            if not d:
                out["closed"] = True
                break
            rest += d
    except socket.timeout:
        pass
    out["body"] = rest[:n].decode("latin-1")
    rest = rest[n:]
    if out["closed"]:
        print(json.dumps(out))
        return
    p = h2conn()
    p.initiate_connection()
    sock.sendall(p.data_to_send())
    p.send_headers(1, [(":method", "GET"), (":scheme", "http"), (":authority", host),
                       (":path", then)], end_stream=True)
    try:
        sock.sendall(p.data_to_send())
    except OSError:
        pass
    sock.settimeout(3)
    got = rest
    try:
        while True:
            d = sock.recv(65536)
            if not d:
                out["closed"] = True
                break
            got += d
    except (socket.timeout, OSError):
        pass
    if got.startswith(b"HTTP/"):
        out["after"] = got.split(b"\r\n", 1)[0].decode("latin-1")
    elif got:
        # HTTP/2 frames came back: someone took the preface; see what it answered to `then`
        try:
            for ev in p.receive_data(got):
                if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == 1:
                    out["then_status"] = int(dict(ev.headers)[":status"])
        except Exception as e:  # noqa: BLE001 (anything unparsable is recorded, not raised)
            out["after"] = "unparsable: %s" % e
    print(json.dumps(out))


if __name__ == "__main__":
    main()
