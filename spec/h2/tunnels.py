#!/usr/bin/python3
"""spec/h2/tunnels.py: long-lived streams on one HTTP/2 connection (python3-h2; WebSocket frames
over RFC 8441 extended CONNECT, the server's decoded with python3-wsproto) for
spec/h2_tunnels_spec.lua. Prints one JSON object. Modes:

  slow PORT ws|sse     stream 1: a WebSocket on /ws (or an SSE stream on /events) whose DATA is
                       never acknowledged on the stream (the connection's window is given back,
                       so the other streams go on): a slow consumer. Stream 3: GET /flood?n=60
                       uses its window up; stream 5: GET /flood?n=400 makes the server k.send_to
                       it past stream_out_cap. Then GET /closed on later
                       streams of the same connection until the app says the slow stream's close
                       callback ran. Prints {"reset": code | null, "reset_after": s, "ended":
                       bool (END_STREAM on stream 1), "flood": body, "closed": body,
                       "closed_after": s, "got": bytes on stream 1, "close_code": the WebSocket
                       close code wsproto read, if any}
  idle PORT SECONDS    streams 1 and 3: two WebSockets on /ws. Stream 3 sends a text frame every
                       0.1 s and reads its echo; stream 1 sends nothing. Runs SECONDS, then one
                       more echo on stream 3 and GET /closed. Prints {"reset1": code | null,
                       "reset1_after": s, "reset3": code | null, "echoes": n, "sent": n,
                       "last_echo": text, "closed": body}
"""
import json
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events
from wsproto.frame_protocol import FrameProtocol, Opcode

MASK = b"\x37\xfa\x21\x3d"


def ws_frame(text):
    data = text.encode()
    assert len(data) < 126
    return bytes([0x81, 0x80 | len(data)]) + MASK + bytes(c ^ MASK[i & 3] for i, c in enumerate(data))


class Conn:
    def __init__(self, port):
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.c = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.c.initiate_connection()
        self.flush()
        self.st = {}
        self.slow = set()  # streams whose window we never give back
        self.t0 = time.time()
        self.dead = False
        self.connect_protocol = False

    def flush(self):
        d = self.c.data_to_send()
        if d:
            self.sock.sendall(d)

    def s(self, sid):
        return self.st.setdefault(sid, {"status": None, "data": bytearray(), "ended": False,
                                        "reset": None, "reset_at": None})

    def pump(self, timeout=0.05):
        if self.dead:
            return
        self.sock.settimeout(timeout)
        try:
            d = self.sock.recv(65536)
        except socket.timeout:
            return
        except ConnectionResetError:
            self.dead = True
            return
        if not d:
            self.dead = True
            return
        for ev in self.c.receive_data(d):
            if isinstance(ev, h2.events.RemoteSettingsChanged):
                st = ev.changed_settings.get(8)
                if st and st.new_value == 1:
                    self.connect_protocol = True
            elif isinstance(ev, h2.events.ResponseReceived):
                self.s(ev.stream_id)["status"] = int(dict(ev.headers)[":status"])
            elif isinstance(ev, h2.events.DataReceived):
                self.s(ev.stream_id)["data"] += ev.data
                if ev.stream_id in self.slow:
                    # the connection's window only: the stream's stays shut
                    if ev.flow_controlled_length:
                        self.c.increment_flow_control_window(ev.flow_controlled_length)
                else:
                    self.c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                self.s(ev.stream_id)["ended"] = True
            elif isinstance(ev, h2.events.StreamReset):
                x = self.s(ev.stream_id)
                x["reset"] = int(ev.error_code)
                x["reset_at"] = time.time() - self.t0
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.dead = True
        try:
            self.flush()
        except OSError:
            self.dead = True

    def until(self, cond, secs):
        end = time.time() + secs
        while time.time() < end and not cond() and not self.dead:
            self.pump()
        return cond()

    def ws_open(self, path="/ws"):
        self.until(lambda: self.connect_protocol, 5)
        sid = self.c.get_next_available_stream_id()
        self.c.send_headers(sid, [(":method", "CONNECT"), (":protocol", "websocket"),
                                  (":scheme", "http"), (":path", path),
                                  (":authority", "127.0.0.1:%d" % self.port),
                                  ("sec-websocket-version", "13")])
        self.flush()
        self.until(lambda: self.s(sid)["status"] is not None, 10)
        return sid

    def get(self, path, end=True):
        sid = self.c.get_next_available_stream_id()
        self.c.send_headers(sid, [(":method", "GET"), (":scheme", "http"), (":path", path),
                                  (":authority", "127.0.0.1:%d" % self.port)], end_stream=end)
        self.flush()
        return sid

    def fetch(self, path, secs=10):
        sid = self.get(path)
        x = self.s(sid)
        self.until(lambda: x["ended"] or x["reset"] is not None, secs)
        return bytes(x["data"]).decode("utf-8", "replace") if x["ended"] else None


def ws_close_code(data):
    try:
        fp = FrameProtocol(client=True, extensions=[])
        fp.receive_bytes(bytes(data))
        for fr in fp.received_frames():
            if fr.opcode == Opcode.CLOSE:
                return int(fr.payload[0])
    except Exception:  # a stream cut mid-frame: no close frame to read
        return None
    return None


def slow(port, kind):
    k = Conn(port)
    if kind == "ws":
        sid = k.ws_open("/ws")
    else:
        k.until(lambda: k.c.remote_settings.max_concurrent_streams is not None, 5)
        sid = k.get("/events")
        k.until(lambda: k.s(sid)["status"] is not None, 10)
    k.slow.add(sid)
    x = k.s(sid)
    assert x["status"] == 200, x
    # the handler registered the stream (its id is the app's "last"): first use up its window
    # (60 messages of 1000 bytes go out), then flood it past stream_out_cap from a later stream
    first = k.fetch("/flood?n=60", 20)
    k.until(lambda: len(x["data"]) >= 60000, 10)
    t_flood = time.time()
    flood = k.fetch("/flood?n=400", 20)
    k.until(lambda: x["reset"] is not None or x["ended"], 10)
    out = {"reset": x["reset"], "reset_after": (time.time() - t_flood) if x["reset"] is not None else None,
           "ended": x["ended"], "first": first, "flood": flood, "got": len(x["data"])}
    if kind == "ws":
        out["close_code"] = ws_close_code(x["data"])
    # the app frees the stream: its close callback runs (the reader woke up with on_abort)
    closed = None
    end = time.time() + 10
    while time.time() < end and not k.dead:
        closed = k.fetch("/closed")
        if closed and closed != "nil":
            break
        k.until(lambda: False, 0.1)
    out["closed"] = closed
    out["closed_after"] = time.time() - t_flood
    k.sock.close()
    return out


def idle(port, secs):
    k = Conn(port)
    a = k.ws_open("/ws")
    b = k.ws_open("/ws")
    xa, xb = k.s(a), k.s(b)
    assert xa["status"] == 200 and xb["status"] == 200, (xa, xb)
    sent = 0
    end = time.time() + secs
    while time.time() < end and not k.dead and xb["reset"] is None:
        k.c.send_data(b, ws_frame("m%d" % sent))
        k.flush()
        sent += 1
        k.until(lambda: False, 0.1)
    # one more on the active one, after the idle one is gone
    k.c.send_data(b, ws_frame("last"))
    k.flush()
    sent += 1
    k.until(lambda: bytes(xb["data"]).count(b"echo:") >= sent, 5)
    fp = FrameProtocol(client=True, extensions=[])
    fp.receive_bytes(bytes(xb["data"]))
    texts = [fr.payload for fr in fp.received_frames() if fr.opcode == Opcode.TEXT]
    out = {"reset1": xa["reset"], "reset1_after": xa["reset_at"], "reset3": xb["reset"],
           "echoes": len(texts), "sent": sent, "last_echo": texts[-1] if texts else None,
           "closed": k.fetch("/closed")}
    k.sock.close()
    return out


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "slow":
        out = slow(port, sys.argv[3])
    else:
        out = idle(port, float(sys.argv[3]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
