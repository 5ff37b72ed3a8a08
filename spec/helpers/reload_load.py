#!/usr/bin/python3
"""spec/helpers/reload_load.py: keep-alive HTTP/1.1 clients that GET one path in a loop and
record every answer, for a hot reload under load (spec/reload_spec.lua, bench/reload.sh).

usage: reload_load.py HOST PORT PATH CLIENTS SECONDS OUT.json

Each client is a thread with one blocking socket, reused for every request (a new connection
only after a failure, which is counted). OUT gets one JSON object:
{"requests": n, "failed": n, "errors": ["..."], "first_seen": {body: unix time},
 "last_seen": {body: unix time}, "per_second": [[unix second, n], ...]}
A request fails when the connection breaks or the status is not 200. OUT.started appears with
the first answer (the load runs: a spec may go on)."""
import json
import socket
import sys
import threading
import time


def client(host, port, path, deadline, rec, lock):
    req = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    s = None
    while time.time() < deadline:
        try:
            if s is None:
                s = socket.create_connection((host, port), timeout=5)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(req)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    raise OSError("connection closed by the server")
                buf += chunk
            head, _, body = buf.partition(b"\r\n\r\n")
            cl = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    cl = int(value)
            while len(body) < cl:
                chunk = s.recv(65536)
                if not chunk:
                    raise OSError("connection closed inside a body")
                body += chunk
            t = time.time()
            status = head.split(b" ", 2)[1]
            with lock:
                rec["requests"] += 1
                sec = int(t)
                rec["ps"][sec] = rec["ps"].get(sec, 0) + 1
                if status != b"200":
                    rec["failed"] += 1
                    if len(rec["errors"]) < 10:
                        rec["errors"].append(head.split(b"\r\n")[0].decode("latin-1"))
                else:
                    b = body.decode("latin-1")
                    if not rec["first_seen"]:
                        open(rec["out"] + ".started", "w").close()  # the spec may go on
                    rec["first_seen"].setdefault(b, t)
                    rec["last_seen"][b] = t
        except OSError as e:
            with lock:
                rec["requests"] += 1
                rec["failed"] += 1
                if len(rec["errors"]) < 10:
                    rec["errors"].append(str(e))
            if s is not None:
                s.close()
            s = None
            time.sleep(0.01)
    if s is not None:
        s.close()


def main():
    host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    clients, seconds, out = int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
    rec = {"requests": 0, "failed": 0, "errors": [], "first_seen": {}, "last_seen": {}, "ps": {},
           "out": out}
    lock = threading.Lock()
    deadline = time.time() + seconds
    ts = [threading.Thread(target=client, args=(host, port, path, deadline, rec, lock))
          for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rec["per_second"] = sorted([k, v] for k, v in rec.pop("ps").items())
    del rec["out"]
    with open(out + ".tmp", "w") as f:
        json.dump(rec, f)
    import os
    os.rename(out + ".tmp", out)


if __name__ == "__main__":
    main()
