#!/usr/bin/python3
"""A deliberately broken (and a few well-behaved) HTTP/1.1 servers for spec/http_client_spec.lua.

usage: broken_server.py DIR LIFETIME_S
One listener per mode on 127.0.0.1; DIR/ports gets "mode port" lines once all listen. Exits when
DIR/quit appears or after LIFETIME_S. DIR/events gets one line per connection accepted ("mode").

Modes (each reads a request head first, except where said):
  midbody   Content-Length: 100, sends 10 bytes, closes          -> "closed mid-body"
  chunkcut  chunked, one chunk, closes before the last chunk     -> "closed mid-body"
  clmore    Content-Length: 5, sends 10 bytes, stays open        -> body = 5 bytes, conn not reused
  mute      never answers                                        -> "timeout"
  reset     closes with RST (SO_LINGER 0) after the request      -> "connection reset by peer"
  early     closes (FIN) without a byte                               -> "closed before response"
  badchunk  chunked with a chunk size "zz"                       -> "bad chunked encoding"
  cltete    Content-Length and Transfer-Encoding both            -> ambiguous framing
  slowbody  head at once, then 1 byte every 0.3 s (10 bytes)     -> read timeout / total timeout
  gzip      200 with a gzip body ("hello gzip" x 100)
  zstd      200 with a zstd body ("hello zstd" x 100) made by /usr/bin/zstd
  gzipbad   Content-Encoding: gzip, a body that is not gzip      -> "corrupt compressed body"
  zstdold   Content-Encoding: zstd, a pre-1.0 (v0.7 magic) frame  -> "corrupt compressed body"
  bomb      gzip of 64 MiB of zeros (about 64 KiB on the wire)   -> "response body too large"
  redirect  /r/N -> 302 to /r/N-1 on the same port, /r/0 -> 200 echoing Authorization/Cookie;
            /cross?to=PORT -> 302 to http://127.0.0.1:PORT/r/0; /loop -> 302 to /loop;
            /post303 -> 303 to /r/0 (method and body recorded in the body of /r/0)
  redirect2 the same on another port (another origin)
  watch     reads the request, never answers, logs "watch-closed" when the client closes
  echo      keep-alive server: answers every request with its method, target and the
            connection's request count ("GET / 3"), so reuse shows
"""
import gzip
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

DIR = sys.argv[1]
LIFETIME = float(sys.argv[2]) if len(sys.argv) > 2 else 300

GZ = gzip.compress(b"hello gzip" * 100)
ZS = subprocess.run(["/usr/bin/zstd", "-q", "-c"], input=b"hello zstd" * 100,
                    stdout=subprocess.PIPE, check=True).stdout


def zeros_gzip(total, seg=1 << 20):
    """gzip of `total` zero bytes, built from one compressed segment repeated: after a full
    flush deflate starts over, so every further segment of zeros compresses to the same bytes.
    gzip.compress of the 64 MiB took 0.46 s of CPU, over 10 s of wall time on the 2-core box at
    load 25, and the spec gives this script 20 s to listen (http_client_spec's setup failed with
    "broken_server.py did not start"); this takes 0.03 s."""
    z = b"\0" * seg
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(z) + c.flush(zlib.Z_FULL_FLUSH)
    rest = c.compress(z) + c.flush(zlib.Z_FULL_FLUSH)
    end = c.flush(zlib.Z_FINISH)
    crc = 0
    for _ in range(total // seg):
        crc = zlib.crc32(z, crc)
    return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + first + rest * (total // seg - 1) + end
            + struct.pack("<II", crc, total & 0xFFFFFFFF))


BOMB = zeros_gzip(64 << 20)  # 66 KB that inflate to 64 MiB

lock = threading.Lock()


def event(line):
    with lock:
        with open(os.path.join(DIR, "events"), "a") as f:
            f.write(line + "\n")


def read_head(conn, buf=b""):
    """Reads one request head; returns (method, target, headers dict, body, rest) or None."""
    while b"\r\n\r\n" not in buf:
        d = conn.recv(65536)
        if not d:
            return None
        buf += d
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    hdrs = {}
    for l in lines[1:]:
        n, v = l.split(":", 1)
        hdrs[n.strip().lower()] = v.strip()
    n = int(hdrs.get("content-length", "0"))
    while len(rest) < n:
        d = conn.recv(65536)
        if not d:
            break
        rest += d
    return method, target, hdrs, rest[:n], rest[n:]


def resp(status, body, extra=""):
    return ("HTTP/1.1 %s\r\nContent-Length: %d\r\n%s\r\n" % (status, len(body), extra)).encode() + body


def handle(mode, conn, ports):
    count = 0
    buf = b""
    while True:
        r = read_head(conn, buf)
        if r is None:
            conn.close()
            return
        method, target, hdrs, body, buf = r
        count += 1
        if mode == "early":
            conn.close()
            return
        if mode == "midbody":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
            conn.close()
            return
        if mode == "chunkcut":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            conn.close()
            return
        if mode == "clmore":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n0123456789")
            continue  # the connection stays open: its next request meets "56789"
        if mode == "mute":
            time.sleep(LIFETIME)
            return
        if mode == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            return
        if mode == "badchunk":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")
            conn.close()
            return
        if mode == "cltete":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"5\r\nhello\r\n0\r\n\r\n")
            conn.close()
            return
        if mode == "slowbody":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
            for i in range(10):
                time.sleep(0.3)
                try:
                    conn.sendall(b"x")
                except OSError:
                    return
            continue
        if mode == "gzip":
            conn.sendall(resp("200 OK", GZ, "Content-Encoding: gzip\r\n"))
            continue
        if mode == "zstd":
            conn.sendall(resp("200 OK", ZS, "Content-Encoding: zstd\r\n"))
            continue
        if mode == "zstdold":
            # RFC 8878 defines magic 0xFD2FB528 only; libzstd's legacy v0.7 reader is refused
            conn.sendall(resp("200 OK", bytes([0x27, 0xb5, 0x2f, 0xfd, 0x04, 0x58, 0, 0, 0]),
                              "Content-Encoding: zstd\r\n"))
            continue
        if mode == "gzipbad":
            conn.sendall(resp("200 OK", b"this is not gzip at all", "Content-Encoding: gzip\r\n"))
            continue
        if mode == "bomb":
            conn.sendall(resp("200 OK", BOMB, "Content-Encoding: gzip\r\n"))
            continue
        if mode == "watch":
            # waits for the client to go away and says so
            while True:
                try:
                    d = conn.recv(65536)
                except OSError:
                    d = b""
                if not d:
                    event("watch-closed")
                    conn.close()
                    return
        if mode in ("redirect", "redirect2"):
            port = ports["redirect"]
            if target.startswith("/r/"):
                n = int(target[3:])
                if n > 0:
                    conn.sendall(resp("302 Found", b"", "Location: /r/%d\r\n" % (n - 1)))
                else:
                    out = "auth=%s cookie=%s method=%s body=%s" % (
                        hdrs.get("authorization", "-"), hdrs.get("cookie", "-"), method,
                        body.decode() or "-")
                    conn.sendall(resp("200 OK", out.encode()))
            elif target.startswith("/cross?to="):
                to = int(target.split("=", 1)[1])
                conn.sendall(resp("302 Found", b"", "Location: http://127.0.0.1:%d/r/0\r\n" % to))
            elif target == "/loop":
                conn.sendall(resp("302 Found", b"", "Location: /loop\r\n"))
            elif target == "/post303":
                conn.sendall(resp("303 See Other", b"", "Location: /r/0\r\n"))
            elif target == "/post307":
                conn.sendall(resp("307 Temporary Redirect", b"", "Location: /echo307\r\n"))
            elif target == "/echo307":
                conn.sendall(resp("200 OK", ("method=%s body=%s" % (method, body.decode())).encode()))
            else:
                conn.sendall(resp("404 Not Found", b"no"))
            _ = port
            continue
        if mode == "echo":
            conn.sendall(resp("200 OK", ("%s %s %d" % (method, target, count)).encode()))
            continue
        conn.close()
        return


def serve(mode, lsock, ports):
    while True:
        try:
            conn, _ = lsock.accept()
        except OSError:
            return
        event(mode)
        t = threading.Thread(target=handle_safe, args=(mode, conn, ports), daemon=True)
        t.start()


def handle_safe(mode, conn, ports):
    try:
        handle(mode, conn, ports)
    except OSError:
        pass


def main():
    modes = ["midbody", "chunkcut", "clmore", "mute", "reset", "early", "badchunk", "cltete",
             "slowbody", "gzip", "zstd", "zstdold", "gzipbad", "bomb", "redirect", "redirect2", "echo",
             "watch"]
    ports = {}
    socks = {}
    for m in modes:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(128)
        ports[m] = s.getsockname()[1]
        socks[m] = s
    for m in modes:
        threading.Thread(target=serve, args=(m, socks[m], ports), daemon=True).start()
    tmp = os.path.join(DIR, "ports.tmp")
    with open(tmp, "w") as f:
        for m in modes:
            f.write("%s %d\n" % (m, ports[m]))
    os.rename(tmp, os.path.join(DIR, "ports"))
    end = time.time() + LIFETIME
    while time.time() < end and not os.path.exists(os.path.join(DIR, "quit")):
        time.sleep(0.1)
    os._exit(0)


main()
