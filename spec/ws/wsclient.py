#!/usr/bin/python3
"""Raw WebSocket client for spec/websocket_spec.lua: sends exactly the frames it is told (bad
ones too: unmasked, reserved bits, broken UTF-8...), over HTTP/1.1 (GET + Upgrade, RFC 6455) or
HTTP/2 (extended CONNECT, RFC 8441, with python3-h2; server frames decoded with python3-wsproto's
frame parser there), and prints what came back as JSON.

stdin (JSON): {"path": "/ws", "headers": {..extra..}, "deflate": bool (offer permessage-deflate),
  "frames": [{"op": 1, "fin": true, "rsv": 0, "text": "..." | "hex": "..", "mask": true,
              "deflate": bool (compress and set RSV1)}],
  "chunk": n (send the frame bytes n at a time), "wait_messages": n (read this many data
  frames before sending the next batch; optional), "timeout": seconds}
A JSON list of such objects runs them one after the other and prints the list of results.
stdout (JSON): {"status": 101, "headers": {...}, "frames": [{"op", "fin", "rsv", "hex", "text"}],
  "close_code": n | null, "eof": bool (the server ended the connection / stream)}
"""
import json, os, socket, struct, sys, time, zlib, base64

MASK = b"\x37\xfa\x21\x3d"


def build(f):
    data = bytes.fromhex(f["hex"]) if "hex" in f else f.get("text", "").encode("utf-8", "surrogatepass")
    if "repeat" in f:
        data = data * f["repeat"]
    rsv = f.get("rsv", 0)
    if f.get("deflate"):
        c = zlib.compressobj(wbits=-15)
        data = c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
        if data.endswith(b"\x00\x00\xff\xff"):
            data = data[:-4]
        rsv |= 4
    if f.get("split"):  # one message in this many fragments (a compressed one: its stream split)
        k = f["split"]
        step = max(1, (len(data) + k - 1) // k)
        parts = [data[i:i + step] for i in range(0, len(data), step)] or [b""]
        out = b""
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            out += build({"op": f.get("op", 1) if i == 0 else 0, "fin": last,
                          "rsv": rsv if i == 0 else 0, "hex": part.hex(), "mask": f.get("mask", True)})
        return out
    b0 = (0x80 if f.get("fin", True) else 0) | (rsv << 4) | f.get("op", 1)
    n = len(data)
    masked = f.get("mask", True)
    mb = 0x80 if masked else 0
    if n < 126:
        h = bytes([b0, mb | n])
    elif n < 65536:
        h = bytes([b0, mb | 126]) + struct.pack(">H", n)
    else:
        h = bytes([b0, mb | 127]) + struct.pack(">Q", n)
    if masked:
        h += MASK
        data = bytes(c ^ MASK[i & 3] for i, c in enumerate(data))
    return h + data


class Parser:
    """server frames (never masked)"""

    def __init__(self):
        self.all = b""
        self.buf = b""
        self.frames = []
        self.inflate_next = False

    def feed(self, b):
        self.all += b
        self.buf += b
        while True:
            if len(self.buf) < 2:
                return
            b0, b1 = self.buf[0], self.buf[1]
            n, k = b1 & 0x7F, 2
            if n == 126:
                if len(self.buf) < 4:
                    return
                n, k = struct.unpack(">H", self.buf[2:4])[0], 4
            elif n == 127:
                if len(self.buf) < 10:
                    return
                n, k = struct.unpack(">Q", self.buf[2:10])[0], 10
            if b1 & 0x80:
                k += 4  # a masked server frame: reported as a failure by the spec
            if len(self.buf) < k + n:
                return
            data = self.buf[k:k + n]
            self.buf = self.buf[k + n:]
            rsv = (b0 >> 4) & 7
            if rsv & 4:
                d = zlib.decompressobj(wbits=-15)
                data = d.decompress(data + b"\x00\x00\xff\xff")
            fr = {"op": b0 & 15, "fin": bool(b0 & 0x80), "rsv": rsv, "masked": bool(b1 & 0x80),
                  "len": len(data)}
            if len(data) <= 4096:
                fr["hex"] = data.hex()
                try:
                    fr["text"] = data.decode("utf-8")
                except UnicodeDecodeError:
                    pass
            self.frames.append(fr)


def close_code(frames):
    for f in frames:
        if f["op"] == 8:
            h = f.get("hex", "")
            return int(h[:4], 16) if len(h) >= 4 else 1005
    return None


def data_count(frames):
    return sum(1 for f in frames if f["op"] in (0, 1, 2))


def run_h1(port, req):
    key = base64.b64encode(os.urandom(16)).decode()
    s = socket.create_connection(("127.0.0.1", port), timeout=req.get("timeout", 20))
    hdrs = {"Host": "127.0.0.1:%d" % port, "Upgrade": "websocket", "Connection": "Upgrade",
            "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13"}
    if req.get("deflate"):
        hdrs["Sec-WebSocket-Extensions"] = req.get("offer", "permessage-deflate; client_max_window_bits")
    for k_, v in req.get("headers", {}).items():
        if v is None or v is False:
            hdrs.pop(k_, None)
        else:
            hdrs[k_] = v
    head = "GET %s HTTP/1.1\r\n" % req.get("path", "/ws") + "".join("%s: %s\r\n" % kv for kv in hdrs.items()) + "\r\n"
    s.sendall(head.encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            break
        buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    rh = {}
    for l in lines[1:]:
        if ":" in l:
            a, b = l.split(":", 1)
            rh[a.strip().lower()] = b.strip()
    out = {"status": status, "headers": rh, "frames": [], "close_code": None, "eof": False}
    if status != 101:
        s.close()
        return out
    import hashlib
    want = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    out["accept_ok"] = rh.get("sec-websocket-accept") == want
    p = Parser()
    p.feed(rest)

    def pump(until_count=None):
        deadline = time.time() + req.get("timeout", 20)
        while time.time() < deadline:
            if until_count is not None and data_count(p.frames) >= until_count:
                return
            if close_code(p.frames) is not None and until_count is not None:
                return
            try:
                s.settimeout(max(0.05, deadline - time.time()))
                d = s.recv(65536)
            except socket.timeout:
                return
            except ConnectionResetError:
                out["eof"] = True
                return
            if not d:
                out["eof"] = True
                return
            p.feed(d)

    send_all(req, lambda b: s.sendall(b), lambda n: pump(n))
    # then read until the server closes (after its close frame) or the timeout
    if not out["eof"]:
        pump()
    s.close()
    out["frames"] = p.frames
    out["close_code"] = close_code(p.frames)
    return out


def send_all(req, send, wait):
    chunk = req.get("chunk")
    batches = req.get("batches") or [req.get("frames", [])]
    for bi, frames in enumerate(batches):
        data = b"".join(build(f) for f in frames)
        try:
            if chunk:
                for i in range(0, len(data), chunk):
                    send(data[i:i + chunk])
                    time.sleep(0.001)
            else:
                send(data)
        except (BrokenPipeError, ConnectionResetError):
            return
        w = req.get("wait_messages")
        if w is not None and bi < len(batches) - 1:
            wait(w[bi] if isinstance(w, list) else w)


def run_h2(port, req):
    import h2.connection, h2.config, h2.events, h2.settings
    from wsproto.frame_protocol import FrameProtocol, Opcode
    s = socket.create_connection(("127.0.0.1", port), timeout=req.get("timeout", 20))
    c = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    c.initiate_connection()
    s.sendall(c.data_to_send())
    out = {"status": 0, "headers": {}, "frames": [], "close_code": None, "eof": False}
    enabled = False
    # wait for the server's SETTINGS
    deadline = time.time() + req.get("timeout", 20)
    got_settings = False
    while not got_settings and time.time() < deadline:
        d = s.recv(65536)
        if not d:
            return out
        for ev in c.receive_data(d):
            if isinstance(ev, h2.events.RemoteSettingsChanged):
                got_settings = True
                st = ev.changed_settings.get(8)  # SETTINGS_ENABLE_CONNECT_PROTOCOL
                enabled = bool(st and st.new_value == 1)
        s.sendall(c.data_to_send())
    out["connect_protocol"] = enabled
    sid = c.get_next_available_stream_id()
    hdrs = [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "http"),
            (":path", req.get("path", "/ws")), (":authority", "127.0.0.1:%d" % port),
            ("sec-websocket-version", "13")]
    if req.get("deflate"):
        hdrs.append(("sec-websocket-extensions", req.get("offer", "permessage-deflate; client_max_window_bits")))
    for k_, v in req.get("headers", {}).items():
        hdrs = [h for h in hdrs if h[0] != k_.lower()]
        if v is not None and v is not False:
            hdrs.append((k_.lower(), v))
    c.send_headers(sid, hdrs)
    s.sendall(c.data_to_send())
    # wsproto decodes the server's frames (it checks them as a client would)
    raw = Parser()
    state = {"ended": False}

    def handle(d):
        for ev in c.receive_data(d):
            if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                for k_, v in ev.headers:
                    if k_ == ":status":
                        out["status"] = int(v)
                    else:
                        out["headers"][k_] = v
            elif isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                c.acknowledge_received_data(ev.flow_controlled_length, sid)
                raw.feed(ev.data)
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)) and ev.stream_id == sid:
                state["ended"] = True
            elif isinstance(ev, h2.events.ConnectionTerminated):
                state["ended"] = True
        s.sendall(c.data_to_send())

    def pump(until_count=None):
        deadline = time.time() + req.get("timeout", 20)
        while time.time() < deadline and not state["ended"]:
            if until_count is not None and data_count(raw.frames) >= until_count:
                return
            if until_count is None and out["status"] and out["status"] != 200:
                return
            try:
                s.settimeout(max(0.05, deadline - time.time()))
                d = s.recv(65536)
            except socket.timeout:
                return
            if not d:
                state["ended"] = True
                return
            handle(d)

    while out["status"] == 0 and not state["ended"] and time.time() < deadline:
        d = s.recv(65536)
        if not d:
            break
        handle(d)
    if out["status"] != 200:
        s.close()
        return out

    def send(b):
        # respect flow control
        while b:
            w = min(c.local_flow_control_window(sid), c.max_outbound_frame_size, len(b))
            if w <= 0:
                d = s.recv(65536)
                if not d:
                    return
                handle(d)
                continue
            c.send_data(sid, b[:w])
            s.sendall(c.data_to_send())
            b = b[w:]

    send_all(req, send, lambda n: pump(n))
    pump()
    out["eof"] = state["ended"]
    s.close()
    out["frames"] = raw.frames
    out["close_code"] = close_code(raw.frames)
    # wsproto's client-side frame parser over the same bytes: it must accept them and read the
    # same close code (a second, independent decoder of what the server sent)
    try:
        exts = []
        ext_hdr = out["headers"].get("sec-websocket-extensions")
        if ext_hdr:
            from wsproto.extensions import PerMessageDeflate
            pmd = PerMessageDeflate()
            pmd.finalize(ext_hdr)
            exts.append(pmd)
        fp = FrameProtocol(client=True, extensions=exts)
        fp.receive_bytes(raw.all)
        code = None
        n = 0
        for fr in fp.received_frames():
            n += 1
            if fr.opcode == Opcode.CLOSE:
                code = int(fr.payload[0])
        out["wsproto_frames"] = n
        out["wsproto_close_code"] = code
    except Exception as e:
        out["wsproto_error"] = repr(e)
    return out


def main():
    port = int(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "h1"
    req = json.load(sys.stdin)
    run = run_h2 if mode == "h2" else run_h1
    if isinstance(req, list):  # a batch of cases, one connection each
        out = []
        for r in req:
            try:
                out.append(run(port, r))
            except Exception as e:
                out.append({"error": repr(e)})
    else:
        out = run(port, req)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
