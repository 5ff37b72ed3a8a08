"""spec/h2/h2raw.py: raw HTTP/2 frames for the attack specs (RFC 9113 §4.1 framing).

Owns: one TCP socket per RawConn (TLS with ALPN "h2" when tls=True, certificate not checked:
the spec servers use --tls-self-signed); builds frames by hand (struct) so that a spec can send
sequences a well-behaved client library refuses to produce. HPACK blocks come from the
hpack package (python3-h2's dependency) or are written byte by byte.
"""
import json
import socket
import ssl
import struct
import sys
import threading
import time

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4

ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
          4: "SETTINGS_TIMEOUT", 5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM",
          8: "CANCEL", 9: "COMPRESSION_ERROR", 10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM",
          12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED"}


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def settings(pairs=()):
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def request_block(path="/", method="GET", extra=(), encoder=None):
    enc = encoder or hpack.Encoder()
    hdrs = [(":method", method), (":path", path), (":scheme", "http"), (":authority", "localhost")]
    return enc.encode(hdrs + list(extra))


class RawConn:
    def __init__(self, port, host="127.0.0.1", window=None, tls=False, preface=True, pairs=None):
        self.sock = socket.create_connection((host, port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["h2"])
            self.sock = ctx.wrap_socket(self.sock, server_hostname="localhost")
            if self.sock.selected_alpn_protocol() != "h2":
                raise OSError("ALPN did not pick h2: %r" % self.sock.selected_alpn_protocol())
        self.buf = bytearray()
        self.goaway = None
        self.closed = False
        self.send_failed = False
        self.frames = {}
        self.headers = {}   # stream id -> list of decoded header lists
        self.data = {}      # stream id -> bytes
        self.ended = set()
        self.resets = {}
        self.decoder = hpack.Decoder()
        self.decoder.max_allowed_table_size = 65536
        self.order = []         # frame types in arrival order
        self.ping_acks = []     # payloads of the PING ACKs received
        self.settings_acks = 0
        self.data_sizes = {}    # stream id -> lengths of its DATA frames
        self.server_settings = None
        if pairs is None:
            pairs = [] if window is None else [(4, window)]
        if preface:
            self.send(PREFACE + settings(pairs))

    def send(self, b):
        """Returns False once the peer no longer takes bytes; closed is only set by reads."""
        try:
            self.sock.settimeout(5)
            self.sock.sendall(b)
            return True
        except OSError:
            self.send_failed = True
            return False

    def _parse(self):
        while len(self.buf) >= 9:
            n = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + n:
                return
            t, fl = self.buf[3], self.buf[4]
            sid = struct.unpack(">I", self.buf[5:9])[0] & 0x7FFFFFFF
            p = bytes(self.buf[9:9 + n])
            del self.buf[:9 + n]
            self.frames[t] = self.frames.get(t, 0) + 1
            self.order.append(t)
            if t == GOAWAY:
                last, code = struct.unpack(">II", p[:8])
                self.goaway = {"last_stream_id": last & 0x7FFFFFFF, "code": ERRORS.get(code, code)}
            elif t == HEADERS:
                try:
                    self.headers.setdefault(sid, []).append(self.decoder.decode(p))
                except Exception as e:  # noqa: BLE001 - reported, not raised
                    self.headers.setdefault(sid, []).append([("error", str(e))])
                if fl & END_STREAM:
                    self.ended.add(sid)
            elif t == DATA:
                self.data_sizes.setdefault(sid, []).append(n)
                if fl & 0x8:  # PADDED
                    p = p[1:len(p) - p[0]]
                self.data.setdefault(sid, bytearray()).extend(p)
                if fl & END_STREAM:
                    self.ended.add(sid)
            elif t == RST_STREAM:
                self.resets[sid] = ERRORS.get(struct.unpack(">I", p)[0], "?")
            elif t == SETTINGS and not fl & ACK:
                if self.server_settings is None:
                    self.server_settings = {k: v for k, v in
                                            (struct.unpack(">HI", p[i:i + 6]) for i in range(0, len(p), 6))}
                self.send(frame(SETTINGS, ACK, 0))
            elif t == SETTINGS:
                self.settings_acks += 1
            elif t == PING and fl & ACK:
                self.ping_acks.append(p)

    def pump(self, timeout=0.0):
        """Reads what arrived within timeout; returns False once the peer closed."""
        if self.closed:
            return False
        self.sock.settimeout(timeout if timeout > 0 else 0.0001)
        try:
            d = self.sock.recv(1 << 20)
        except (socket.timeout, BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return True
        except OSError:
            self.closed = True
            return False
        if not d:
            self.closed = True
            return False
        self.buf.extend(d)
        self._parse()
        return True

    def wait(self, cond, timeout=5.0):
        deadline = time.time() + timeout
        while not cond() and time.time() < deadline:
            if not self.pump(min(0.1, max(deadline - time.time(), 0.001))):
                break
        return cond()

    def wait_closed(self, timeout=5.0):
        deadline = time.time() + timeout
        while not self.closed and time.time() < deadline:
            self.pump(0.1)
        return self.closed

    def status(self, sid):
        for block in self.headers.get(sid, []):
            for k, v in block:
                if k == ":status":
                    return int(v)
        return None


class GoodClient(threading.Thread):
    """A well-behaved client on its own connection: GET / every `every` seconds until stop()."""

    def __init__(self, port, path="/", every=0.02):
        super().__init__(daemon=True)
        self.port, self.path, self.every = port, path, every
        self.ok = self.failed = 0
        self.errors = []
        self._halt = threading.Event()

    def run(self):
        try:
            c = RawConn(self.port)
        except OSError as e:
            self.failed += 1
            self.errors.append(str(e))
            return
        enc = hpack.Encoder()
        sid = 1
        while not self._halt.is_set():
            c.send(frame(HEADERS, END_STREAM | END_HEADERS, sid, request_block(self.path, encoder=enc)))
            if c.wait(lambda: sid in c.ended or sid in c.resets or c.closed, 3) and c.status(sid) == 200:
                self.ok += 1
            else:
                self.failed += 1
                self.errors.append("stream %d: status %s closed %s" % (sid, c.status(sid), c.closed))
                if c.closed:
                    return
            sid += 2
            time.sleep(self.every)

    def stop(self):
        self._halt.set()
        self.join(5)


def report(d):
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()
