#!/usr/bin/python3
"""spec/h2/client.py: a well-behaved HTTP/2 client (python3-h2) for spec/h2_spec.lua.
Prints one JSON line. Modes:

  requests PORT JSON   the requests in JSON (a list of {method, path, headers: [[k, v]],
                       body, body_len}) go concurrently on one h2c connection (prior knowledge);
                       prints {"settings": {...}, "responses": [{status, headers, body_len, body,
                       echo_ok, reset}]}
  sigterm PORT PID     starts POST /slow without its body, sends SIGTERM to PID, expects GOAWAY
                       (NO_ERROR, last stream 1), then sends the body and expects the answer
  rst_wait PORT [MARK] POST /wait with part of a body, RST_STREAM(CANCEL) (once the file MARK
                       exists: the handler's sign that it waits), then GET / on the same
                       connection
  idle PORT            opens a connection, sends nothing more, waits for GOAWAY and close
"""
import hashlib
import json
import os
import signal
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class Client:
    def __init__(self, port, window=None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cfg = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.c = h2.connection.H2Connection(cfg)
        self.c.initiate_connection()
        if window:
            self.c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
            self.c.increment_flow_control_window(window)
        self.flush()
        self.streams = {}
        self.goaway = None
        self.closed = False
        self.remote_settings = {}

    def flush(self):
        d = self.c.data_to_send()
        if d:
            self.sock.sendall(d)

    def stream(self, sid):
        return self.streams.setdefault(sid, {"status": None, "headers": {}, "body": bytearray(),
                                             "ended": False, "reset": None})

    def pump(self, timeout=0.1):
        if self.closed:
            return False
        self.sock.settimeout(timeout)
        try:
            d = self.sock.recv(1 << 20)
        except socket.timeout:
            return True
        except OSError:
            self.closed = True
            return False
        if not d:
            self.closed = True
            return False
        for e in self.c.receive_data(d):
            if isinstance(e, h2.events.ResponseReceived):
                st = self.stream(e.stream_id)
                for k, v in e.headers:
                    if k == ":status":
                        st["status"] = int(v)
                    else:
                        st["headers"][k] = (st["headers"][k] + ", " + v) if k in st["headers"] else v
            elif isinstance(e, h2.events.DataReceived):
                self.stream(e.stream_id)["body"] += e.data
                self.c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            elif isinstance(e, h2.events.StreamEnded):
                self.stream(e.stream_id)["ended"] = True
            elif isinstance(e, h2.events.StreamReset):
                self.stream(e.stream_id)["reset"] = int(e.error_code)
            elif isinstance(e, h2.events.ConnectionTerminated):
                self.goaway = {"code": int(e.error_code), "last_stream_id": e.last_stream_id}
            elif isinstance(e, h2.events.RemoteSettingsChanged):
                for k, v in e.changed_settings.items():
                    self.remote_settings[int(k)] = v.new_value
        self.flush()
        return True

    def wait(self, cond, timeout=10):
        deadline = time.time() + timeout
        while not cond() and time.time() < deadline:
            if not self.pump(0.05):
                break
        return cond()

    def request(self, method, path, headers=(), body=None, end=True):
        sid = self.c.get_next_available_stream_id()
        hdrs = [(":method", method), (":path", path), (":scheme", "http"),
                (":authority", "127.0.0.1")] + [tuple(h) for h in headers]
        if body is not None:
            hdrs.append(("content-length", str(len(body))))
        self.c.send_headers(sid, hdrs, end_stream=(body is None and end))
        self.flush()
        self.stream(sid)
        return sid

    def send_body(self, sid, body, end=True):
        """Sends as much as the windows allow, pumping for WINDOW_UPDATE; returns bytes sent."""
        sent = 0
        deadline = time.time() + 20
        while sent < len(body) and time.time() < deadline:
            if self.stream(sid)["reset"] is not None or self.closed:
                break
            room = min(self.c.local_flow_control_window(sid), self.c.max_outbound_frame_size)
            if room <= 0:
                self.pump(0.05)
                continue
            chunk = body[sent:sent + room]
            self.c.send_data(sid, chunk)
            sent += len(chunk)
            self.flush()
        if end and sent == len(body) and self.stream(sid)["reset"] is None and not self.closed:
            self.c.end_stream(sid)
            self.flush()
        return sent


def summary(st, sent_body=None):
    out = {"status": st["status"], "headers": st["headers"], "body_len": len(st["body"]),
           "reset": st["reset"], "ended": st["ended"]}
    if len(st["body"]) <= 4096:
        out["body"] = bytes(st["body"]).decode("utf-8", "replace")
    if sent_body is not None:
        out["echo_ok"] = hashlib.sha256(st["body"]).digest() == hashlib.sha256(sent_body).digest()
    return out


def mode_requests(port, spec):
    cl = Client(port)
    sids, bodies = [], []
    for r in spec:
        body = r.get("body")
        if body is None and r.get("body_len") is not None:
            body = bytes((i * 7 + 3) % 251 for i in range(256)) * (r["body_len"] // 256) + b"z" * (r["body_len"] % 256)
        elif body is not None:
            body = body.encode()
        sid = cl.request(r.get("method", "GET"), r.get("path", "/"), r.get("headers", []), body)
        sids.append(sid)
        bodies.append(body)
    for sid, body in zip(sids, bodies):
        if body is not None:
            cl.send_body(sid, body)
    cl.wait(lambda: all(cl.stream(s)["ended"] or cl.stream(s)["reset"] is not None for s in sids), 30)
    return {"settings": cl.remote_settings,
            "responses": [summary(cl.stream(s), b) for s, b in zip(sids, bodies)],
            "goaway": cl.goaway}


def mode_sigterm(port, pid):
    # raw frames: python3-h2 treats any GOAWAY as the end of the connection and would refuse to
    # send the rest of the body, which RFC 9113 §6.8 allows for streams up to last_stream_id
    import hpack
    from h2raw import DATA, END_HEADERS, END_STREAM, HEADERS, RawConn, frame, request_block
    c = RawConn(port)
    enc = hpack.Encoder()
    body = b"in flight"
    c.send(frame(HEADERS, END_HEADERS, 1, request_block("/slow", "POST",
                                                        [("content-length", str(len(body)))], enc)))
    # 0.3 s for the server to take stream 1 (pump returns at the first bytes: its SETTINGS,
    # which it sends as soon as it has read the preface, maybe before the HEADERS came)
    c.wait(lambda: False, 0.3)
    os.kill(pid, signal.SIGTERM)
    c.wait(lambda: c.goaway is not None, 5)
    goaway = c.goaway
    # a stream opened after the GOAWAY is not processed (RFC 9113 §6.8)
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 3, request_block("/", encoder=enc)))
    c.send(frame(DATA, END_STREAM, 1, body))
    c.wait(lambda: 1 in c.ended or c.closed, 5)
    closed = c.wait_closed(5)
    return {"goaway": goaway, "closed": closed, "late_refused": c.status(3) is None,
            "response": {"status": c.status(1), "body": bytes(c.data.get(1, b"")).decode(),
                         "ended": 1 in c.ended}}


def mode_rst_wait(port, mark=None):
    cl = Client(port)
    path = "/wait" + ("?mark=" + mark if mark else "")
    sid = cl.request("POST", path, body=b"x" * 100, end=False)
    cl.c.send_data(sid, b"x" * 10)
    cl.flush()
    cl.pump(0.3)
    # with MARK, the handler creates that file before it waits for the body: the reset goes
    # only once it waits (on a loaded box the server may read the reset with the HEADERS, and
    # the handler would never run)
    deadline = time.time() + 10
    while mark and not os.path.exists(mark) and time.time() < deadline:
        cl.pump(0.05)
    cl.c.reset_stream(sid, 8)
    cl.flush()
    cl.pump(0.3)
    sid2 = cl.request("GET", "/")
    cl.wait(lambda: cl.stream(sid2)["ended"], 5)
    return {"first": summary(cl.stream(sid)), "second": summary(cl.stream(sid2)), "goaway": cl.goaway}


def mode_halfclose(port):
    # the request, then FIN: the answer must still come (RFC 9113 does not forbid a half-close)
    import hpack
    from h2raw import END_HEADERS, END_STREAM, HEADERS, RawConn, frame, request_block
    c = RawConn(port)
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, request_block("/big?n=30000", encoder=hpack.Encoder())))
    c.sock.shutdown(socket.SHUT_WR)
    c.wait(lambda: 1 in c.ended or c.closed, 5)
    closed = c.wait_closed(5)
    return {"status": c.status(1), "body_len": len(c.data.get(1, b"")), "ended": 1 in c.ended,
            "closed": closed, "goaway": c.goaway}


def mode_concurrency(port, n):
    # n POST streams that wait for their bodies: past SETTINGS_MAX_CONCURRENT_STREAMS the
    # server refuses the extra ones (RFC 9113 §5.1.2) and keeps serving the others
    import hpack
    from h2raw import DATA, END_HEADERS, END_STREAM, HEADERS, SETTINGS, RawConn, frame, request_block
    c = RawConn(port)
    c.wait(lambda: c.frames.get(SETTINGS, 0) >= 2, 2)  # the server's SETTINGS and its ACK
    enc = hpack.Encoder()
    for i in range(n):
        c.send(frame(HEADERS, END_HEADERS, 1 + 2 * i, request_block("/slow", "POST", [], enc)))
    c.pump(0.5)
    for i in range(3):
        c.send(frame(DATA, END_STREAM, 1 + 2 * i, b"x"))
    c.wait(lambda: all(1 + 2 * i in c.ended for i in range(3)), 5)
    return {"resets": {str(k): v for k, v in c.resets.items()}, "goaway": c.goaway,
            "answered": [c.status(1 + 2 * i) for i in range(3)]}


def mode_leave(port, path):
    # a request, then the client goes away (close) while its handler still works
    import hpack
    from h2raw import END_HEADERS, END_STREAM, HEADERS, RawConn, frame, request_block
    c = RawConn(port)
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, request_block(path, encoder=hpack.Encoder())))
    c.pump(0.3)
    c.sock.close()
    return {"left": True}


def mode_idle(port):
    cl = Client(port)
    t0 = time.time()
    cl.wait(lambda: cl.goaway is not None, 10)
    closed = cl.wait(lambda: cl.closed, 5)
    return {"goaway": cl.goaway, "closed": closed, "elapsed": round(time.time() - t0, 3)}


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "requests":
        out = mode_requests(port, json.loads(sys.argv[3]))
    elif mode == "sigterm":
        out = mode_sigterm(port, int(sys.argv[3]))
    elif mode == "rst_wait":
        out = mode_rst_wait(port, sys.argv[3] if len(sys.argv) > 3 else None)
    elif mode == "halfclose":
        out = mode_halfclose(port)
    elif mode == "concurrency":
        out = mode_concurrency(port, int(sys.argv[3]))
    elif mode == "leave":
        out = mode_leave(port, sys.argv[3])
    elif mode == "idle":
        out = mode_idle(port)
    else:
        raise SystemExit("unknown mode " + mode)
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
