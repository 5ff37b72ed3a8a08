#!/usr/bin/python3
"""HTTP/2 cleartext (prior knowledge) servers that end their connections early, for
spec/http_client_mux_spec.lua.

usage: h2_goaway_server.py DIR LIFETIME_S
One listener per mode on 127.0.0.1; DIR/ports gets "mode port" lines once all listen. Exits when
DIR/quit appears or after LIFETIME_S. Every answer's body is "conn N stream S" (N counts the
connections the mode accepted, from 1), so the client's use of connections shows.

Modes:
  goaway  waits until 4 requests are open on the connection, then sends GOAWAY (NO_ERROR) with
          last-stream-id = the second one, answers the first two after 0.2 s and closes: the
          others were not processed (a client sends them again on another connection)
  reset   waits until 3 requests are open (and the client acknowledged its SETTINGS), then
          closes the TCP connection with RST
"""
import os
import socket
import struct
import sys
import threading
import time

import h2.config
import h2.connection
import h2.events

DIR = sys.argv[1]
LIFETIME = float(sys.argv[2]) if len(sys.argv) > 2 else 300

counts = {}
lock = threading.Lock()


def serve(mode, conn):
    with lock:
        counts[mode] = counts.get(mode, 0) + 1
        n = counts[mode]
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    c.initiate_connection()
    conn.sendall(c.data_to_send())
    open_streams = []
    acked = False
    done = False
    while not done:
        data = conn.recv(65536)
        if not data:
            break
        for ev in c.receive_data(data):
            if isinstance(ev, h2.events.RequestReceived):
                open_streams.append(ev.stream_id)
            elif isinstance(ev, h2.events.SettingsAcknowledged):
                acked = True
        conn.sendall(c.data_to_send())
        if mode == "goaway" and n == 1 and len(open_streams) >= 4:
            keep = open_streams[:2]
            # GOAWAY written by hand: the h2 library sends nothing after its own
            conn.sendall(struct.pack(">I", 8)[1:] + b"\x07\x00" + struct.pack(">II", 0, keep[-1])
                         + struct.pack(">I", 0))
            time.sleep(0.2)
            for sid in keep:
                body = ("conn %d stream %d" % (n, sid)).encode()
                c.send_headers(sid, [(":status", "200"), ("content-length", str(len(body)))])
                c.send_data(sid, body, end_stream=True)
            conn.sendall(c.data_to_send())
            time.sleep(0.1)
            done = True
        elif mode == "reset" and len(open_streams) >= 3 and acked:
            # once the client has nothing more to say (its SETTINGS ACK came): a write of its
            # own would see the reset as "broken pipe" rather than on its read
            time.sleep(0.1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            done = True
        elif mode == "goaway" and n > 1:
            # later connections answer at once
            for sid in open_streams:
                body = ("conn %d stream %d" % (n, sid)).encode()
                c.send_headers(sid, [(":status", "200"), ("content-length", str(len(body)))])
                c.send_data(sid, body, end_stream=True)
            open_streams = []
            conn.sendall(c.data_to_send())
    conn.close()


def listener(mode):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(64)

    def loop():
        while True:
            conn, _ = s.accept()
            threading.Thread(target=serve, args=(mode, conn), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return s.getsockname()[1]


ports = {m: listener(m) for m in ("goaway", "reset")}
with open(os.path.join(DIR, "ports.tmp"), "w") as f:
    for m, p in ports.items():
        f.write("%s %d\n" % (m, p))
os.rename(os.path.join(DIR, "ports.tmp"), os.path.join(DIR, "ports"))
end = time.time() + LIFETIME
while time.time() < end and not os.path.exists(os.path.join(DIR, "quit")):
    time.sleep(0.1)
