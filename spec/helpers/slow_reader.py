#!/usr/bin/python3
"""spec/helpers/slow_reader.py PROTO PORT PATH RATE [STOP_AFTER [WAIT]]: GET PATH from
127.0.0.1:PORT over PROTO (h1, or h2 with prior knowledge, python3-h2) and read the response
body at RATE bytes/s, in small steady steps (a 64 KiB receive buffer, a read every 20 ms), so
the reader is slow but never pauses. Prints one JSON line:
{"status": n, "expected": n|null, "bytes": n, "elapsed": s, "max_gap": s, "closed": bool,
 "error": str|null}; max_gap is the longest time between two reads that returned bytes, from the
first body byte on.

With STOP_AFTER, the reader stops reading once it has that many body bytes, sleeps WAIT
seconds, then reads as fast as it can to the end; "closed" says the server ended the
connection before the whole body arrived ("stopped_at" and "resumed_at" are times since the
start, "stopped_epoch" the time of the stop). Over h2 the client's windows are 16 MiB, so the
socket sets the pace, not flow control.

With $SLOW_READER_SAY_HEAD set, it first prints the line "head" (flushed) once the response's
status is known: the caller knows the answer is being written and need not guess a delay."""
import os
import json
import socket
import sys
import time

STEP = 0.02
WINDOW = 16 << 20


def connect(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.connect(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


class H1:
    def __init__(self, s, path):
        self.s = s
        self.head = b""
        self.status = None
        self.expected = None
        self.body = 0
        self.done = False
        s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")

    def feed(self, data):
        if self.status is None:
            self.head += data
            i = self.head.find(b"\r\n\r\n")
            if i < 0:
                return 0
            head, data = self.head[:i].decode("latin-1"), self.head[i + 4:]
            self.status = int(head.split(" ")[1])
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    self.expected = int(v)
        self.body += len(data)
        if self.expected is not None and self.body >= self.expected:
            self.done = True
        return len(data)


class H2:
    def __init__(self, s, path):
        import h2.config
        import h2.connection
        import h2.events
        self.ev = h2.events
        self.s = s
        self.c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.c.initiate_connection()
        # a 16 MiB window, so that the pace is set by the socket (the write path under test),
        # not by flow control (kh_h2's own write_timeout_ms case, spec/h2_attack_spec.lua)
        import h2.settings
        self.c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW})
        self.c.increment_flow_control_window(WINDOW - 65535)
        self.sid = self.c.get_next_available_stream_id()
        self.c.send_headers(self.sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                                       (":authority", "x")], end_stream=True)
        s.sendall(self.c.data_to_send())
        # python3-h2 closes its whole connection on any GOAWAY and then refuses the DATA of a
        # stream the GOAWAY let complete (RFC 9113 §6.8: a graceful stop): after a GOAWAY
        # (NO_ERROR) that covers our stream, its state goes back to open, frame by frame
        import h2.connection
        import h2.errors
        from hyperframe.frame import GoAwayFrame
        on_goaway = self.c._frame_dispatch_table[GoAwayFrame]

        def goaway(frame):
            frames, events = on_goaway(frame)
            if frame.error_code == h2.errors.ErrorCodes.NO_ERROR and frame.last_stream_id >= self.sid:
                self.c.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
            return frames, events
        self.c._frame_dispatch_table[GoAwayFrame] = goaway
        self.status = None
        self.expected = None
        self.body = 0
        self.done = False

    def feed(self, data):
        n = 0
        for e in self.c.receive_data(data):
            if isinstance(e, self.ev.ResponseReceived):
                for k, v in e.headers:
                    if k == b":status":
                        self.status = int(v)
                    elif k == b"content-length":
                        self.expected = int(v)
            elif isinstance(e, self.ev.DataReceived):
                n += len(e.data)
                # the window opens again as fast as we read: the pace is set by the socket
                self.c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            elif isinstance(e, self.ev.StreamEnded):
                self.done = True
            elif isinstance(e, self.ev.ConnectionTerminated):
                # a graceful GOAWAY (NO_ERROR) that covers our stream lets it complete
                if e.error_code != 0 or (e.last_stream_id or 0) < self.sid:
                    raise ConnectionError(type(e).__name__)
            elif isinstance(e, self.ev.StreamReset):
                raise ConnectionError(type(e).__name__)
        out = self.c.data_to_send()
        if out:
            self.s.sendall(out)
        self.body += n
        return n


def main():
    proto, port, path, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    stop_after = int(sys.argv[5]) if len(sys.argv) > 5 else None
    wait = float(sys.argv[6]) if len(sys.argv) > 6 else 0
    s = connect(port)
    r = (H1 if proto == "h1" else H2)(s, path)
    out = {"status": None, "expected": None, "bytes": 0, "closed": False, "error": None}
    t0 = last = time.monotonic()
    max_gap = 0.0
    per_step = max(1, int(rate * STEP))
    stopped = False
    say_head = bool(os.environ.get("SLOW_READER_SAY_HEAD"))
    try:
        while not r.done:
            if stop_after is not None and not stopped and r.body >= stop_after:
                stopped = True
                out["stopped_at"] = time.monotonic() - t0
                out["stopped_epoch"] = time.time()
                time.sleep(wait)
                out["resumed_at"] = time.monotonic() - t0
                s.settimeout(10)
                per_step = 1 << 20
            step_start = time.monotonic()
            s.settimeout(5)
            data = s.recv(per_step)
            if not data:
                out["closed"] = True
                break
            now = time.monotonic()
            if not stopped and r.body > 0:
                max_gap = max(max_gap, now - last)
            last = now
            had_status = r.status is not None
            r.feed(data)
            if say_head and not had_status and r.status is not None:
                print("head", flush=True)
            if per_step < (1 << 20):
                time.sleep(max(0.0, STEP - (time.monotonic() - step_start)))
    except (ConnectionError, socket.timeout, OSError) as e:
        out["closed"] = not isinstance(e, socket.timeout)
        out["error"] = type(e).__name__ + ": " + str(e)
    out.update(status=r.status, expected=r.expected, bytes=r.body,
               elapsed=round(time.monotonic() - t0, 3), max_gap=round(max_gap, 3))
    s.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
