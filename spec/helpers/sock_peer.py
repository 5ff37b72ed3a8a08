#!/usr/bin/python3
# spec/helpers/sock_peer.py: the far end for spec/socket_spec.lua: a few TCP servers on
# 127.0.0.1, each with one behaviour, their ports written as "name port" lines to DIR/ports.
#   echo    echoes what it reads
#   sink    accepts and never reads (the client's send fills the buffers: send timeout)
#   mute    reads and discards, never answers; writes "mute-closed" to DIR/events when the
#           client closes (abort spec: the socket of a client that left is closed)
#   abc     sends "abc" and closes (partial receive)
#   full    listen(0) with its accept queue filled by this script: a connect there waits
#           (connect timeout)
# Stops by itself after LIFETIME seconds, or when DIR/quit exists.
import os
import socket
import sys
import threading
import time

DIR = sys.argv[1]
LIFETIME = float(sys.argv[2]) if len(sys.argv) > 2 else 120
lock = threading.Lock()


def event(s):
    with lock:
        with open(os.path.join(DIR, "events"), "a") as f:
            f.write(s + "\n")


def listener(backlog=128):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(backlog)
    return s


def serve(s, handler):
    def loop():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(c,), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()


def echo(c):
    try:
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
    except OSError:
        pass
    c.close()


held = []


def sink(c):
    held.append(c)


def mute(c):
    try:
        while True:
            d = c.recv(65536)
            if not d:
                break
    except OSError:
        pass
    event("mute-closed")
    c.close()


def abc(c):
    c.sendall(b"abc")
    c.close()


ports = {}
for name, h in (("echo", echo), ("sink", sink), ("mute", mute), ("abc", abc)):
    s = listener()
    serve(s, h)
    ports[name] = s.getsockname()[1]

# a listener whose accept queue is full: listen(0) takes one connection into the queue; the
# handshakes after that are not completed while it stays full
full = listener(0)
ports["full"] = full.getsockname()[1]
fillers = []
for _ in range(4):
    f = socket.socket()
    f.setblocking(False)
    try:
        f.connect(("127.0.0.1", ports["full"]))
    except BlockingIOError:
        pass
    fillers.append(f)
time.sleep(0.3)

with open(os.path.join(DIR, "ports.tmp"), "w") as f:
    for k, v in ports.items():
        f.write("%s %d\n" % (k, v))
os.rename(os.path.join(DIR, "ports.tmp"), os.path.join(DIR, "ports"))

t0 = time.time()
while time.time() - t0 < LIFETIME and not os.path.exists(os.path.join(DIR, "quit")):
    time.sleep(0.1)
