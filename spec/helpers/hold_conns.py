#!/usr/bin/python3
"""spec/helpers/hold_conns.py: N HTTP/1.1 keep-alive clients that connect at once, send one
request each and hold their connections open, for the fd-exhaustion spec.

usage: hold_conns.py HOST PORT N DIR [MAX_SECONDS]

Raises its own RLIMIT_NOFILE (the server under test runs with a low one, the clients must not).
Every 0.1 s it writes DIR/status (JSON, replaced atomically):
  {"connected": n,   sockets whose connect completed (the kernel's handshake: in a backlog or
                     accepted, the client cannot tell which)
   "answered": n,    clients that got a complete "HTTP/1.1 200" response head
   "other": n,       clients that got a response other than 200
   "dropped": n,     connections the server closed or reset before answering
   "refused": n,     connects that failed
   "open": n,        sockets still open
   "released": n}    answered sockets this script closed itself (mode "release")
Commands are files in DIR, checked every loop turn:
  DIR/release  from now on, close each connection as soon as it is answered (frees the server's
               fds one by one: the clients waiting in the backlog must then be served)
  DIR/quit     close everything, write the last status and DIR/done, and exit
It exits by itself after MAX_SECONDS (default 120)."""
import errno
import json
import os
import resource
import selectors
import socket
import sys
import time


def main():
    host, port, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    max_s = float(sys.argv[5]) if len(sys.argv) > 5 else 120.0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))

    st = {"connected": 0, "answered": 0, "other": 0, "dropped": 0, "refused": 0, "open": 0,
          "released": 0}
    sel = selectors.DefaultSelector()
    req = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    conns = {}  # sock -> {"state": "connecting"|"sent"|"answered", "buf": b""}

    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        r = s.connect_ex((host, port))
        if r not in (0, errno.EINPROGRESS):
            st["refused"] += 1
            s.close()
            continue
        conns[s] = {"state": "connecting", "buf": b""}
        sel.register(s, selectors.EVENT_WRITE)

    def close(s):
        sel.unregister(s)
        s.close()
        del conns[s]

    def write_status():
        st["open"] = len(conns)
        tmp = os.path.join(d, "status.tmp")
        with open(tmp, "w") as f:
            json.dump(st, f)
        os.replace(tmp, os.path.join(d, "status"))

    deadline = time.monotonic() + max_s
    last = 0.0
    release = False
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(d, "quit")):
            break
        if not release and os.path.exists(os.path.join(d, "release")):
            release = True
            for s in [s for s, c in conns.items() if c["state"] == "answered"]:
                close(s)
                st["released"] += 1
        for key, ev in sel.select(timeout=0.05):
            s = key.fileobj
            c = conns.get(s)
            if c is None:
                continue
            if c["state"] == "connecting":
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err != 0:
                    st["refused"] += 1
                    close(s)
                    continue
                st["connected"] += 1
                s.send(req)  # 28 bytes into an empty socket buffer: never partial
                c["state"] = "sent"
                sel.modify(s, selectors.EVENT_READ)
                continue
            try:
                data = s.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                if c["state"] == "sent":
                    st["dropped"] += 1
                close(s)
                continue
            if c["state"] == "sent":
                c["buf"] += data
                if b"\r\n\r\n" in c["buf"]:
                    if c["buf"].startswith(b"HTTP/1.1 200"):
                        st["answered"] += 1
                    else:
                        st["other"] += 1
                    c["state"] = "answered"
                    c["buf"] = b""
                    if release:
                        close(s)
                        st["released"] += 1
        now = time.monotonic()
        if now - last >= 0.1:
            write_status()
            last = now
    for s in list(conns):
        close(s)
    write_status()
    open(os.path.join(d, "done"), "w").close()


if __name__ == "__main__":
    main()
