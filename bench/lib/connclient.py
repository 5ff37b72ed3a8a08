#!/usr/bin/python3
"""bench/lib/connclient.py: N connections, one request each, `Connection: close`, a fixed count.

    connclient.py PORT N [CONCURRENCY]

Each connection sends `GET / HTTP/1.1` with `Connection: close`, reads the response head and its
Content-Length body, then closes its socket, as wrk does with `-H 'Connection: close'` (it does
not wait for the server's FIN). CONCURRENCY connections (default 8) are in flight at a time.
For load-independent counts (bench/perconn.sh: callgrind instructions and strace syscalls per
connection): the server does the same work N times, whatever the box's load. Prints
"N ok" and exits 1 if any connection failed or any answer was not a 200.
"""
import selectors
import socket
import sys

REQ = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def main():
    port, n = int(sys.argv[1]), int(sys.argv[2])
    conc = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    sel = selectors.DefaultSelector()
    started = done = bad = 0

    def start():
        nonlocal started
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        sel.register(s, selectors.EVENT_WRITE, [b"", False])
        started += 1

    while started < min(conc, n):
        start()
    while done < n:
        for key, ev in sel.select(timeout=30) or [(None, None)]:
            if key is None:
                sys.exit(f"timed out with {n - done} connections left")
            s, st = key.fileobj, key.data
            finished = False
            if not st[1]:
                try:
                    s.send(REQ)
                except OSError:
                    bad += 1
                    finished = True
                else:
                    st[1] = True
                    sel.modify(s, selectors.EVENT_READ, st)
            else:
                try:
                    chunk = s.recv(65536)
                except OSError:
                    chunk = b""
                st[0] += chunk
                buf = st[0]
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    head = buf[:end].lower()
                    i = head.find(b"content-length:")
                    clen = int(head[i + 15:].split(b"\r\n")[0]) if i >= 0 else 0
                    if len(buf) >= end + 4 + clen:
                        if not buf.startswith(b"HTTP/1.1 200"):
                            bad += 1
                        finished = True
                if not chunk and not finished:
                    bad += 1
                    finished = True
            if finished:
                sel.unregister(s)
                s.close()
                done += 1
                if started < n:
                    start()
    print(f"{n - bad} ok")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
