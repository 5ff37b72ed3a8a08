#!/usr/bin/python3
"""spec/h2/conformance.py PORT [--tls] [CASE...] | --list: HTTP/2 conformance cases in raw frames.

Owns: the case list, written for khamsin from RFC 9113 / RFC 7541 along the sections h2spec 2.6
walks (3.4 preface, 4.1-4.3 framing and header blocks, 5.1 stream states, 5.1.1 ids, 5.1.2
concurrency, 5.3 priority, 5.4-5.5 errors and extensions, 6.1-6.10 each frame type, 8.1-8.2
messages, HPACK decoding errors), plus the cases the engine must not break for real clients
(frames in flight on a stream the server reset are ignored, WINDOW_UPDATE/RST_STREAM/PRIORITY
on closed streams are ignored).
Each case opens its own connection (TLS with ALPN h2 when --tls), completes the SETTINGS
exchange, sends its frames and asserts one exact outcome:
  ("goaway", CODE)         GOAWAY with CODE, then the server closes the connection
  ("rst", SID, CODE)       RST_STREAM(CODE) on SID, no GOAWAY, and the connection still answers PING
  ("status", SID, STATUS)  a response with STATUS on SID, no GOAWAY, PING still answered
  ("ping",)                no GOAWAY, no RST_STREAM, PING answered
  ("closed",)              the connection is closed with no HTTP/2 frame but the server's preface
  (callable)               a case-specific check returning (ok, detail)
Prints one JSON line per case: {"name", "ok", "want", "got"}.
The server runs the app of spec/h2_conformance_spec.lua: GET / (13 bytes), POST /echo,
GET /slow (answers after 1 s), GET /big (100000 bytes), with body_bytes=100000.
"""
import struct
import sys
import time

import hpack

from h2raw import (CONTINUATION, DATA, END_HEADERS, END_STREAM, ERRORS, GOAWAY, HEADERS, PING,
                   PRIORITY, PUSH_PROMISE, RST_STREAM, SETTINGS, WINDOW_UPDATE, RawConn, frame,
                   report, settings)

PADDED, PRIO = 0x8, 0x20
ACK = 0x1
CASES = []
TLS = False
PORT = 0


def case(name, expect, **opts):
    def deco(fn):
        CASES.append((name, expect, fn, opts))
        return fn
    return deco


def code(name):
    return {v: k for k, v in ERRORS.items()}[name]


def u32(v):
    return struct.pack(">I", v)


def prio(dep, weight=15, excl=False):
    return struct.pack(">IB", dep | (0x80000000 if excl else 0), weight)


def req(c, path="/", method="GET", extra=(), scheme=None, order=None, huffman=True):
    hdrs = [(":method", method), (":scheme", scheme or ("https" if TLS else "http")),
            (":path", path), (":authority", "localhost")]
    if order is not None:
        hdrs = order
    return c.enc.encode(hdrs + list(extra), huffman=huffman)


def get(c, sid, path="/", flags=END_STREAM | END_HEADERS, extra=()):
    c.send(frame(HEADERS, flags, sid, req(c, path, extra=extra)))


def post(c, sid, length, path="/echo", flags=END_HEADERS):
    c.send(frame(HEADERS, flags, sid, req(c, path, "POST", [("content-length", str(length))])))


def wait_end(c, sid, t=5):
    return c.wait(lambda: sid in c.ended or sid in c.resets or c.goaway is not None or c.closed, t)


def alive(c, t=5):
    payload = b"k%07d" % (len(c.ping_acks) + int(time.time() * 1000) % 1000000)
    if not c.send(frame(PING, 0, 0, payload)):
        return False
    return c.wait(lambda: payload in c.ping_acks or c.closed, t) and payload in c.ping_acks


# ---- RFC 9113 §3.4: the connection preface ----

@case("3.4/server preface is SETTINGS, then a GET is answered", ("status", 1, 200))
def _(c):
    assert c.order and c.order[0] == SETTINGS, "first frame %r" % c.order[:1]
    get(c, 1)


@case("3.4/invalid client preface: connection closed", ("closed",), preface=False)
def _(c):
    c.send(b"INVALID CONNECTION PREFACE\r\n\r\n")


# ---- §4.1 frame format ----

@case("4.1/unknown frame type is ignored", ("ping",))
def _(c):
    c.send(frame(0x16, 0, 0, b"\x00" * 8))


@case("4.1/undefined flags are ignored", ("ping",))
def _(c):
    c.send(frame(PING, 0x16, 0, b"\x00" * 8))


@case("4.1/reserved bit in the stream id is ignored", ("status", 1, 200))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 0x80000001, req(c)))


# ---- §4.2 frame size ----

@case("4.2/DATA of 2^14 octets is accepted", ("status", 1, 200))
def _(c):
    post(c, 1, 16384)
    c.send(frame(DATA, END_STREAM, 1, b"x" * 16384))


@case("4.2/DATA over SETTINGS_MAX_FRAME_SIZE: FRAME_SIZE_ERROR", ("goaway", "FRAME_SIZE_ERROR"))
def _(c):
    post(c, 1, 16385)
    c.send(frame(DATA, END_STREAM, 1, b"x" * 16385))


@case("4.2/HEADERS over SETTINGS_MAX_FRAME_SIZE: FRAME_SIZE_ERROR", ("goaway", "FRAME_SIZE_ERROR"))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, req(c, extra=[("x-big", "a" * 16500)], huffman=False)))


# ---- §4.3 header blocks ----

@case("4.3/undecodable header block: COMPRESSION_ERROR", ("goaway", "COMPRESSION_ERROR"))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, b"\xff\xff\xff\xff\xff\xff"))


@case("4.3/PRIORITY inside a header block: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(HEADERS, END_STREAM, 1, req(c)) + frame(PRIORITY, 0, 1, prio(0)))


@case("4.3/HEADERS of another stream inside a header block: PROTOCOL_ERROR",
      ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(HEADERS, END_STREAM, 1, req(c)) + frame(HEADERS, END_STREAM | END_HEADERS, 3, req(c)))


@case("4.3/PING inside a header block: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(HEADERS, END_STREAM, 1, req(c)) + frame(PING, 0, 0, b"\x00" * 8))


# ---- §5.1 stream states ----

@case("5.1/idle: DATA: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(DATA, END_STREAM, 1, b"x"))


@case("5.1/idle: RST_STREAM: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(RST_STREAM, 0, 1, u32(8)))


@case("5.1/idle: WINDOW_UPDATE: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(WINDOW_UPDATE, 0, 1, u32(100)))


@case("5.1/idle: CONTINUATION: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(CONTINUATION, END_HEADERS, 1, req(c)))


@case("5.1/idle: PRIORITY is accepted", ("ping",))
def _(c):
    c.send(frame(PRIORITY, 0, 3, prio(0)))


@case("5.1/half-closed (remote): DATA: STREAM_CLOSED", ("goaway", "STREAM_CLOSED"))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(DATA, END_STREAM, 1, b"x"))


@case("5.1/half-closed (remote): HEADERS: STREAM_CLOSED", ("goaway", "STREAM_CLOSED"))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, c.enc.encode([("x-trailer", "a")])))


@case("5.1/half-closed (remote): CONTINUATION: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(CONTINUATION, END_HEADERS, 1, c.enc.encode([("x-foo", "a")])))


@case("5.1/half-closed (remote): WINDOW_UPDATE is accepted", ("status", 1, 200))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(WINDOW_UPDATE, 0, 1, u32(1)))


@case("5.1/half-closed (remote): PRIORITY is accepted", ("status", 1, 200))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(PRIORITY, 0, 1, prio(0, 100)))


@case("5.1/half-closed (remote): RST_STREAM is accepted", ("ping",))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(RST_STREAM, 0, 1, u32(8)))


def _reset_by_peer(c):
    post(c, 1, 10)
    c.send(frame(RST_STREAM, 0, 1, u32(8)))
    assert alive(c), "no PING answer after the reset"


@case("5.1/closed by the peer's RST_STREAM: DATA: STREAM_CLOSED", ("rst", 1, "STREAM_CLOSED"))
def _(c):
    _reset_by_peer(c)
    c.send(frame(DATA, END_STREAM, 1, b"x"))


@case("5.1/closed by the peer's RST_STREAM: HEADERS: STREAM_CLOSED", ("rst", 1, "STREAM_CLOSED"))
def _(c):
    _reset_by_peer(c)
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, c.enc.encode([("x-trailer", "a")])))


@case("5.1/closed by the peer's RST_STREAM: CONTINUATION: PROTOCOL_ERROR",
      ("goaway", "PROTOCOL_ERROR"))
def _(c):
    _reset_by_peer(c)
    c.send(frame(CONTINUATION, END_HEADERS, 1, c.enc.encode([("x-foo", "a")])))


def _closed(c, path="/"):
    get(c, 1, path)
    assert wait_end(c, 1) and c.status(1) == 200 and 1 in c.ended, "stream 1 not answered"
    assert alive(c), "no PING answer after the response"


@case("5.1/closed: DATA: STREAM_CLOSED", ("goaway", "STREAM_CLOSED"))
def _(c):
    _closed(c)
    c.send(frame(DATA, END_STREAM, 1, b"x"))


@case("5.1/closed: HEADERS: STREAM_CLOSED", ("goaway", "STREAM_CLOSED"))
def _(c):
    _closed(c)
    get(c, 1)


@case("5.1/closed: CONTINUATION: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    _closed(c)
    c.send(frame(CONTINUATION, END_HEADERS, 1, c.enc.encode([("x-foo", "a")])))


@case("5.1/closed: WINDOW_UPDATE is ignored", ("ping",))
def _(c):
    _closed(c)
    c.send(frame(WINDOW_UPDATE, 0, 1, u32(100)))


@case("5.1/closed: RST_STREAM is ignored", ("ping",))
def _(c):
    _closed(c)
    c.send(frame(RST_STREAM, 0, 1, u32(8)))


@case("5.1/closed: PRIORITY is ignored", ("ping",))
def _(c):
    _closed(c)
    c.send(frame(PRIORITY, 0, 1, prio(0)))


@case("5.1/closed, a request on a later stream still answered", ("status", 5, 200))
def _(c):
    _closed(c)
    get(c, 3)
    assert wait_end(c, 3) and c.status(3) == 200, "stream 3 not answered"
    get(c, 5)


def _reset_by_us_413(c):
    # content-length over body_bytes: 413, then RST_STREAM(NO_ERROR) (the rest would not fit
    # the window the client holds); the client's DATA and trailers may be in flight
    post(c, 1, 50000000)
    assert c.wait(lambda: 1 in c.resets or c.closed) and c.resets.get(1) == "NO_ERROR", \
        "no RST_STREAM(NO_ERROR) after the 413: %r" % c.resets
    assert c.status(1) == 413, "status %r" % c.status(1)


@case("5.4.2/reset by the server (413): the peer's DATA in flight is ignored", ("ping",))
def _(c):
    _reset_by_us_413(c)
    c.send(frame(DATA, 0, 1, b"x" * 1000) + frame(DATA, 0, 1, b"x" * 1000))


@case("5.4.2/reset by the server (413): the peer's trailers in flight are ignored", ("ping",))
def _(c):
    _reset_by_us_413(c)
    c.send(frame(DATA, 0, 1, b"x" * 100) +
           frame(HEADERS, END_STREAM | END_HEADERS, 1, c.enc.encode([("x-trailer", "a")])))


@case("5.4.2/reset by the server (malformed): the peer's DATA in flight is ignored", ("ping",))
def _(c):
    c.send(frame(HEADERS, END_HEADERS, 1, req(c, "/echo", "POST", [("X-Upper", "a")])))
    assert c.wait(lambda: 1 in c.resets or c.closed) and c.resets.get(1) == "PROTOCOL_ERROR", \
        "no RST_STREAM(PROTOCOL_ERROR): %r" % c.resets
    c.send(frame(DATA, 0, 1, b"x" * 100) + frame(DATA, END_STREAM, 1, b"x"))


@case("5.4.2/reset by the server (handler error after the head): DATA then the next request",
      ("status", 3, 200))
def _(c):
    # the response ends early (RST_STREAM NO_ERROR after a full answer) while the body flows
    post(c, 1, 200000, "/")
    c.wait(lambda: 1 in c.resets or 1 in c.ended or c.closed)
    c.send(frame(DATA, 0, 1, b"x" * 16384))
    get(c, 3)


# ---- §5.1.1 stream identifiers ----

@case("5.1.1/even stream id: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    get(c, 2)


@case("5.1.1/stream id lower than a previous one: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    get(c, 5)
    assert wait_end(c, 5) and c.status(5) == 200, "stream 5 not answered"
    get(c, 3)


@case("5.1.1/stream id lower than a previous one, in the same packet: PROTOCOL_ERROR",
      ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 5, req(c)) +
           frame(HEADERS, END_STREAM | END_HEADERS, 3, req(c)))


@case("5.1.1/first stream 3, then stream 1: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    get(c, 3)
    assert wait_end(c, 3) and c.status(3) == 200, "stream 3 not answered"
    get(c, 1)


@case("5.1.1/DATA on a skipped (never opened) stream id: PROTOCOL_ERROR",
      ("goaway", "PROTOCOL_ERROR"))
def _(c):
    post(c, 7, 1)
    c.send(frame(DATA, END_STREAM, 3, b"x"))


@case("5.1.1/PRIORITY on an idle stream, then HEADERS on a lower id", ("status", 3, 200))
def _(c):
    c.send(frame(PRIORITY, 0, 5, prio(0)))
    get(c, 3)


# ---- §5.1.2 concurrency ----

def _concurrency(c):
    limit = (c.server_settings or {}).get(3)
    assert limit, "no SETTINGS_MAX_CONCURRENT_STREAMS"
    b = b"".join(frame(HEADERS, END_STREAM | END_HEADERS, 1 + 2 * i, req(c, "/slow"))
                 for i in range(limit + 1))
    c.send(b)


@case("5.1.2/over SETTINGS_MAX_CONCURRENT_STREAMS: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    _concurrency(c)


# ---- §5.3 priority ----

@case("5.3.1/HEADERS depending on itself: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS | PRIO, 1, prio(1) + req(c)))


@case("5.3.1/PRIORITY depending on itself: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(PRIORITY, 0, 1, prio(1)))


@case("5.3.1/PRIORITY depending on itself, on an open stream: PROTOCOL_ERROR",
      ("goaway", "PROTOCOL_ERROR"))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(PRIORITY, 0, 1, prio(1, excl=True)))


@case("5.3/PRIORITY frames with weights 1 and 256, dependencies, exclusive: accepted",
      ("status", 7, 200))
def _(c):
    c.send(frame(PRIORITY, 0, 1, prio(0, 0)) + frame(PRIORITY, 0, 3, prio(0, 255)) +
           frame(PRIORITY, 0, 5, prio(3)) + frame(PRIORITY, 0, 7, prio(3, excl=True)))
    get(c, 7)


@case("5.3/browser-style priorities (HEADERS with exclusive dependencies): all answered",
      ("status", 5, 200))
def _(c):
    # Chromium: each request depends exclusively on the previous one, weight 256
    c.send(frame(HEADERS, END_STREAM | END_HEADERS | PRIO, 1, prio(0, 255, True) + req(c)) +
           frame(HEADERS, END_STREAM | END_HEADERS | PRIO, 3, prio(1, 255, True) + req(c)) +
           frame(HEADERS, END_STREAM | END_HEADERS | PRIO, 5, prio(3, 255, True) + req(c)))
    assert wait_end(c, 1) and wait_end(c, 3), "streams 1 and 3 not answered"
    assert c.status(1) == 200 and c.status(3) == 200, "statuses %r %r" % (c.status(1), c.status(3))


@case("5.3/anchor PRIORITY frames on idle streams, then requests above them: all answered",
      ("status", 15, 200))
def _(c):
    # Firefox (before 2022): PRIORITY on idle 3..11 as group anchors, requests from 13 on
    c.send(b"".join(frame(PRIORITY, 0, sid, prio(0 if sid < 7 else 3, 200)) for sid in (3, 5, 7, 9, 11)))
    c.send(frame(HEADERS, END_STREAM | END_HEADERS | PRIO, 13, prio(3, 21) + req(c)))
    assert wait_end(c, 13) and c.status(13) == 200, "stream 13 not answered"
    c.send(frame(PRIORITY, 0, 13, prio(5, 41)))   # reprioritized while closed: ignored
    c.send(frame(HEADERS, END_STREAM | END_HEADERS | PRIO, 15, prio(9, 21) + req(c)))


# ---- §5.4 error handling, §5.5 extensions ----

@case("5.4.1/invalid PING: GOAWAY then the connection closes", ("goaway", "FRAME_SIZE_ERROR"))
def _(c):
    c.send(frame(PING, 0, 0, b"\x00" * 6))


@case("5.5/unknown extension frame is ignored", ("status", 1, 200))
def _(c):
    c.send(frame(0xFF, 0, 1, b"ext"))
    get(c, 1)


@case("5.5/unknown extension frame inside a header block: PROTOCOL_ERROR",
      ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(HEADERS, END_STREAM, 1, req(c)) + frame(0xFF, 0, 1, b"ext"))


# ---- §6.1 DATA ----

@case("6.1/DATA on stream 0: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(DATA, END_STREAM, 0, b"x"))


@case("6.1/DATA with padding is accepted", ("status", 1, 200))
def _(c):
    post(c, 1, 4)
    c.send(frame(DATA, END_STREAM | PADDED, 1, bytes([6]) + b"test" + b"\x00" * 6))


@case("6.1/DATA with pad length over the payload: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    post(c, 1, 4)
    c.send(frame(DATA, END_STREAM | PADDED, 1, bytes([6]) + b"test"))


@case("6.1/multiple DATA frames are accepted", ("status", 1, 200))
def _(c):
    post(c, 1, 8)
    c.send(frame(DATA, 0, 1, b"test") + frame(DATA, END_STREAM, 1, b"test"))


# ---- §6.2 HEADERS ----

@case("6.2/HEADERS on stream 0: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 0, req(c)))


@case("6.2/HEADERS with padding is accepted", ("status", 1, 200))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS | PADDED, 1, bytes([8]) + req(c) + b"\x00" * 8))


@case("6.2/HEADERS with pad length over the payload: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    blk = req(c)
    c.send(frame(HEADERS, END_STREAM | END_HEADERS | PADDED, 1, bytes([len(blk) + 1]) + blk))


@case("6.2/HEADERS with priority is accepted", ("status", 1, 200))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS | PRIO, 1, prio(0, 200, True) + req(c)))


# ---- §6.3 PRIORITY ----

@case("6.3/PRIORITY on stream 0: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(PRIORITY, 0, 0, prio(1)))


@case("6.3/PRIORITY of length 4: FRAME_SIZE_ERROR", ("goaway", "FRAME_SIZE_ERROR"))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(PRIORITY, 0, 1, prio(0)[:4]))


# ---- §6.4 RST_STREAM ----

@case("6.4/RST_STREAM on stream 0: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(RST_STREAM, 0, 0, u32(8)))


@case("6.4/RST_STREAM of length 3: FRAME_SIZE_ERROR", ("goaway", "FRAME_SIZE_ERROR"))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(RST_STREAM, 0, 1, u32(8)[:3]))


@case("7/RST_STREAM with an unknown error code is accepted", ("ping",))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(RST_STREAM, 0, 1, u32(0xFF)))


# ---- §6.5 SETTINGS ----

@case("6.5/SETTINGS ACK with a payload: FRAME_SIZE_ERROR", ("goaway", "FRAME_SIZE_ERROR"))
def _(c):
    c.send(frame(SETTINGS, ACK, 0, struct.pack(">HI", 3, 100)))


@case("6.5/SETTINGS on a stream: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(SETTINGS, 0, 1, struct.pack(">HI", 3, 100)))


@case("6.5/SETTINGS of length 3: FRAME_SIZE_ERROR", ("goaway", "FRAME_SIZE_ERROR"))
def _(c):
    c.send(frame(SETTINGS, 0, 0, b"\x00\x03\x00"))


@case("6.5.2/SETTINGS_ENABLE_PUSH = 2: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(settings([(2, 2)]))


@case("6.5.2/SETTINGS_INITIAL_WINDOW_SIZE = 2^31: FLOW_CONTROL_ERROR", ("goaway", "FLOW_CONTROL_ERROR"))
def _(c):
    c.send(settings([(4, 1 << 31)]))


@case("6.5.2/SETTINGS_MAX_FRAME_SIZE = 16383: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(settings([(5, 16383)]))


@case("6.5.2/SETTINGS_MAX_FRAME_SIZE = 2^24: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(settings([(5, 1 << 24)]))


@case("6.5.2/unknown setting is ignored", ("ping",))
def _(c):
    c.send(settings([(0xFF, 1)]))


def _settings_acked(c):
    before = c.settings_acks
    c.send(settings([(3, 100)]))
    ok = c.wait(lambda: c.settings_acks > before or c.closed) and c.settings_acks > before
    return ok and c.goaway is None, {"settings_acks": c.settings_acks - before, "goaway": c.goaway}


@case("6.5.3/SETTINGS is acknowledged", _settings_acked)
def _(c):
    pass


def _first_data(sid, size):
    def check(c):
        c.wait(lambda: sid in c.data_sizes or c.closed or c.goaway is not None)
        sizes = c.data_sizes.get(sid, [])
        return bool(sizes) and sizes[0] == size and c.goaway is None, \
            {"data_sizes": sizes[:4], "goaway": c.goaway, "status": c.status(sid)}
    return check


@case("6.5.3/several INITIAL_WINDOW_SIZE values: the last one counts", _first_data(1, 1))
def _(c):
    c.send(settings([(4, 100), (4, 1)]))
    c.wait(lambda: c.settings_acks >= 2)
    get(c, 1)


# ---- §6.7 PING ----

@case("6.7/PING is answered with the same payload", ("ping",))
def _(c):
    pass


def _ping_ack_ignored(c):
    c.wait(lambda: False, 0.3)
    return b"ackackac" not in c.ping_acks and alive(c), {"acks": [a.decode() for a in c.ping_acks]}


@case("6.7/PING with ACK is not answered", _ping_ack_ignored)
def _(c):
    c.send(frame(PING, ACK, 0, b"ackackac"))


@case("6.7/PING on a stream: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(PING, 0, 1, b"\x00" * 8))


@case("6.7/PING of length 6: FRAME_SIZE_ERROR", ("goaway", "FRAME_SIZE_ERROR"))
def _(c):
    c.send(frame(PING, 0, 0, b"\x00" * 6))


# ---- §6.8 GOAWAY ----

@case("6.8/GOAWAY on a stream: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(GOAWAY, 0, 1, u32(0) + u32(0)))


def _after_goaway(c):
    ok = wait_end(c, 1) and c.status(1) == 200
    return ok and (c.goaway is None or c.goaway["code"] == "NO_ERROR"), \
        {"status": c.status(1), "goaway": c.goaway}


@case("6.8/the client's GOAWAY (unknown code): the stream in flight is still answered",
      _after_goaway)
def _(c):
    get(c, 1, "/slow")
    c.send(frame(GOAWAY, 0, 0, u32(0) + u32(0xFF)))


# ---- §6.9 WINDOW_UPDATE ----

@case("6.9/WINDOW_UPDATE of 0 on the connection: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(WINDOW_UPDATE, 0, 0, u32(0)))


# a stream error by RFC 9113 §6.9; nghttp2 makes it a connection error, which §5.4.1 allows
@case("6.9/WINDOW_UPDATE of 0 on a stream: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(WINDOW_UPDATE, 0, 1, u32(0)))


@case("6.9/WINDOW_UPDATE of length 3: FRAME_SIZE_ERROR", ("goaway", "FRAME_SIZE_ERROR"))
def _(c):
    c.send(frame(WINDOW_UPDATE, 0, 0, u32(1)[:3]))


@case("6.9/WINDOW_UPDATE on the connection is accepted", ("ping",))
def _(c):
    c.send(frame(WINDOW_UPDATE, 0, 0, u32(1)))


@case("6.9.1/INITIAL_WINDOW_SIZE = 1: DATA frames of 1 byte", _first_data(1, 1))
def _(c):
    c.send(settings([(4, 1)]))
    c.wait(lambda: c.settings_acks >= 2)
    get(c, 1)


@case("6.9.1/connection window over 2^31-1: FLOW_CONTROL_ERROR", ("goaway", "FLOW_CONTROL_ERROR"))
def _(c):
    c.send(frame(WINDOW_UPDATE, 0, 0, u32(0x7FFFFFFF)) + frame(WINDOW_UPDATE, 0, 0, u32(0x7FFFFFFF)))


@case("6.9.1/stream window over 2^31-1: FLOW_CONTROL_ERROR", ("rst", 1, "FLOW_CONTROL_ERROR"))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(WINDOW_UPDATE, 0, 1, u32(0x7FFFFFFF)) + frame(WINDOW_UPDATE, 0, 1, u32(0x7FFFFFFF)))


def _window_changed(c):
    ok = c.wait(lambda: 1 in c.data_sizes or c.closed) and c.data_sizes.get(1, [None])[0] == 5
    return ok and c.goaway is None, {"data_sizes": c.data_sizes.get(1), "goaway": c.goaway}


@case("6.9.2/INITIAL_WINDOW_SIZE changed after HEADERS: applied to the open stream", _window_changed)
def _(c):
    c.send(settings([(4, 0)]))
    c.wait(lambda: c.settings_acks >= 2)
    get(c, 1)
    assert c.wait(lambda: c.status(1) is not None), "no response head"
    assert not c.data_sizes, "DATA sent with a zero window"
    c.send(settings([(4, 5)]))


def _negative_window(c):
    ok = c.wait(lambda: len(c.data_sizes.get(1, [])) >= 2 or c.closed) and \
        c.data_sizes.get(1, [])[:2] == [5, 2]
    return ok and c.goaway is None, {"data_sizes": c.data_sizes.get(1), "goaway": c.goaway}


@case("6.9.2/a window made negative by SETTINGS is tracked", _negative_window)
def _(c):
    c.send(settings([(4, 5)]))
    c.wait(lambda: c.settings_acks >= 2)
    get(c, 1)
    assert c.wait(lambda: 1 in c.data_sizes), "no first DATA"
    c.send(settings([(4, 3)]))            # window 0 + (3 - 5) = -2
    c.wait(lambda: c.settings_acks >= 3)
    c.send(frame(WINDOW_UPDATE, 0, 1, u32(4)))  # -2 + 4 = 2


# ---- §6.10 CONTINUATION ----

def _split(c):
    blk = req(c, extra=[("x-a", "1" * 40), ("x-b", "2" * 40)])
    return blk[:10], blk[10:30], blk[30:]


@case("6.10/HEADERS + CONTINUATION frames are accepted", ("status", 1, 200))
def _(c):
    a, b, d = _split(c)
    c.send(frame(HEADERS, END_STREAM, 1, a) + frame(CONTINUATION, 0, 1, b) +
           frame(CONTINUATION, END_HEADERS, 1, d))


@case("6.10/CONTINUATION followed by another frame type: PROTOCOL_ERROR",
      ("goaway", "PROTOCOL_ERROR"))
def _(c):
    a, b, d = _split(c)
    c.send(frame(HEADERS, END_STREAM, 1, a) + frame(CONTINUATION, 0, 1, b) + frame(DATA, 0, 1, b"x"))


@case("6.10/CONTINUATION on stream 0: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    a, b, d = _split(c)
    c.send(frame(HEADERS, END_STREAM, 1, a) + frame(CONTINUATION, END_HEADERS, 0, b + d))


@case("6.10/CONTINUATION on another stream: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    a, b, d = _split(c)
    c.send(frame(HEADERS, END_STREAM, 1, a) + frame(CONTINUATION, END_HEADERS, 3, b + d))


@case("6.10/CONTINUATION after HEADERS with END_HEADERS: PROTOCOL_ERROR",
      ("goaway", "PROTOCOL_ERROR"))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, req(c)) +
           frame(CONTINUATION, END_HEADERS, 1, c.enc.encode([("x-foo", "a")])))


@case("6.10/CONTINUATION after CONTINUATION with END_HEADERS: PROTOCOL_ERROR",
      ("goaway", "PROTOCOL_ERROR"))
def _(c):
    a, b, d = _split(c)
    c.send(frame(HEADERS, END_STREAM, 1, a) + frame(CONTINUATION, END_HEADERS, 1, b + d) +
           frame(CONTINUATION, END_HEADERS, 1, c.enc.encode([("x-foo", "a")])))


@case("6.10/CONTINUATION after DATA: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    post(c, 1, 4)
    c.send(frame(DATA, 0, 1, b"te") + frame(CONTINUATION, END_HEADERS, 1, c.enc.encode([("x-a", "b")])))


# ---- §8.1 messages ----

@case("8.1/GET is answered", ("status", 1, 200))
def _(c):
    get(c, 1)


@case("8.1/HEAD is answered without DATA", ("status", 1, 200))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, req(c, "/", "HEAD")))
    assert wait_end(c, 1) and 1 not in c.data_sizes, "DATA after HEAD"


@case("8.1/POST is answered", ("status", 1, 200))
def _(c):
    post(c, 1, 4)
    c.send(frame(DATA, END_STREAM, 1, b"test"))


@case("8.1/POST with trailers is answered", ("status", 1, 200))
def _(c):
    post(c, 1, 4)
    c.send(frame(DATA, 0, 1, b"test") +
           frame(HEADERS, END_STREAM | END_HEADERS, 1, c.enc.encode([("x-trailer", "done")])))


@case("8.1/trailers without END_STREAM: PROTOCOL_ERROR", ("rst", 1, "PROTOCOL_ERROR"))
def _(c):
    post(c, 1, 4)
    c.send(frame(DATA, 0, 1, b"test") +
           frame(HEADERS, END_HEADERS, 1, c.enc.encode([("x-trailer", "done")])))


def _bad_head(name, hdrs=None, extra=(), method="GET"):
    @case("8.2/" + name + ": PROTOCOL_ERROR", ("rst", 1, "PROTOCOL_ERROR"))
    def _(c):
        blk = req(c, "/", method, extra=extra, order=hdrs(c) if hdrs else None)
        c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, blk))


def _std(c):
    return [(":method", "GET"), (":scheme", "https" if TLS else "http"), (":path", "/"),
            (":authority", "localhost")]


_bad_head("upper-case field name", extra=[("X-Upper", "a")])
_bad_head("field name with a space", extra=[("x bad", "a")])
_bad_head("field value with a line feed", extra=[("x-bad", "a\nb")])
_bad_head("field value with NUL", extra=[("x-bad", "a\x00b")])
_bad_head("unknown pseudo-header", extra=[(":foo", "a")])
_bad_head(":status in a request", extra=[(":status", "200")])
_bad_head("pseudo-header after a regular field", lambda c: _std(c)[:3] + [("x-a", "b"), _std(c)[3]])
_bad_head("connection field", extra=[("connection", "keep-alive")])
_bad_head("keep-alive field", extra=[("keep-alive", "timeout=5")])
_bad_head("proxy-connection field", extra=[("proxy-connection", "keep-alive")])
_bad_head("transfer-encoding field", extra=[("transfer-encoding", "chunked")])
_bad_head("upgrade field", extra=[("upgrade", "websocket")])
_bad_head("te other than trailers", extra=[("te", "gzip")])
_bad_head("empty :path", lambda c: [_std(c)[0], _std(c)[1], (":path", ""), _std(c)[3]])
_bad_head(":path not starting with /", lambda c: [_std(c)[0], _std(c)[1], (":path", "foo"), _std(c)[3]])
_bad_head("no :method", lambda c: _std(c)[1:])
_bad_head("no :scheme", lambda c: [_std(c)[0]] + _std(c)[2:])
_bad_head("no :path", lambda c: _std(c)[:2] + _std(c)[3:])
_bad_head("duplicate :method", lambda c: _std(c)[:1] + _std(c))
_bad_head("duplicate :scheme", lambda c: _std(c)[:2] + [_std(c)[1]] + _std(c)[2:])
_bad_head("duplicate :path", lambda c: _std(c)[:3] + [_std(c)[2]] + _std(c)[3:])


def _authority(c, value, host=None):
    hdrs = _std(c)[:3] + ([(":authority", value)] if value is not None else [])
    return hdrs + ([("host", host)] if host is not None else [])


# RFC 9113 §8.3.1: :authority (and host) take what HTTP/1.1 takes in Host; a host that names
# another entity than :authority is malformed
_bad_head(":authority with userinfo", lambda c: _authority(c, "u@localhost"))
_bad_head(":authority with a port over 65535", lambda c: _authority(c, "localhost:99999"))
_bad_head(":authority with an unclosed IPv6 literal", lambda c: _authority(c, "[::1"))
_bad_head(":authority with two ports", lambda c: _authority(c, "localhost:80:80"))
_bad_head("host with userinfo and no :authority", lambda c: _authority(c, None, "u@localhost"))
_bad_head("host naming another entity than :authority", lambda c: _authority(c, "localhost", "evil"))


@case("8.3.1/host equal to :authority but for case is accepted", ("status", 1, 200))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1,
                 req(c, order=_authority(c, "LocalHost:8080", "localhost:8080"))))


@case("8.3.1/host alone is accepted", ("status", 1, 200))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, req(c, order=_authority(c, None, "localhost"))))


@case("8.2.2/te: trailers is accepted", ("status", 1, 200))
def _(c):
    get(c, 1, extra=[("te", "trailers")])


@case("8.3.1/split cookie fields are accepted", ("status", 1, 200))
def _(c):
    get(c, 1, extra=[("cookie", "a=1"), ("cookie", "b=2")])


@case("8.2/pseudo-header in trailers: PROTOCOL_ERROR", ("rst", 1, "PROTOCOL_ERROR"))
def _(c):
    post(c, 1, 4)
    c.send(frame(DATA, 0, 1, b"test") +
           frame(HEADERS, END_STREAM | END_HEADERS, 1, c.enc.encode([(":method", "POST")])))


@case("8.1.1/content-length above the DATA: PROTOCOL_ERROR", ("rst", 1, "PROTOCOL_ERROR"))
def _(c):
    post(c, 1, 10)
    c.send(frame(DATA, END_STREAM, 1, b"test"))


@case("8.1.1/content-length below the sum of DATA frames: PROTOCOL_ERROR",
      ("rst", 1, "PROTOCOL_ERROR"))
def _(c):
    post(c, 1, 6)
    c.send(frame(DATA, 0, 1, b"test") + frame(DATA, END_STREAM, 1, b"test"))


@case("8.1.1/content-length with END_STREAM on HEADERS: PROTOCOL_ERROR", ("rst", 1, "PROTOCOL_ERROR"))
def _(c):
    post(c, 1, 4, flags=END_HEADERS | END_STREAM)


# ---- what nghttp2's HTTP messaging checked and the cases above do not: the checks are ours now
# (core/kh_h2_fields.c), each outcome the one nghttp2 gave ----

_bad_head("field value with a leading space", extra=[("x-bad", " a")])
_bad_head("field value with a trailing tab", extra=[("x-bad", "a\t")])
_bad_head("field value with DEL", extra=[("x-bad", "a\x7fb")])
_bad_head("field value with a carriage return", extra=[("x-bad", "a\rb")])
_bad_head("upper-case pseudo-header", lambda c: [(":Method", "GET")] + _std(c)[1:])
_bad_head("empty :method", lambda c: [(":method", "")] + _std(c)[1:])
_bad_head(":method not a token", lambda c: [(":method", "G(T")] + _std(c)[1:])
_bad_head(":path with a space", lambda c: _std(c)[:2] + [(":path", "/a b")] + _std(c)[3:])
_bad_head(":path * on GET", lambda c: _std(c)[:2] + [(":path", "*")] + _std(c)[3:])
_bad_head(":scheme not a URI scheme", lambda c: [_std(c)[0], (":scheme", "1http")] + _std(c)[2:])
_bad_head("empty :authority", lambda c: _authority(c, ""))
_bad_head("duplicate :authority", lambda c: _std(c) + [_std(c)[3]])
_bad_head("empty host", lambda c: _authority(c, "localhost", ""))
_bad_head("duplicate host", lambda c: _authority(c, None, "localhost") + [("host", "localhost")])
_bad_head("no :authority and no host", lambda c: _std(c)[:3])
_bad_head("content-length twice (same value)", extra=[("content-length", "0"), ("content-length", "0")])
_bad_head("content-length not a number", extra=[("content-length", "1x")])
_bad_head("content-length over 2^63-1", extra=[("content-length", "9223372036854775808")])
_bad_head("CONNECT without :authority", lambda c: [(":method", "CONNECT")], method="CONNECT")
_bad_head("CONNECT with :path", lambda c: [(":method", "CONNECT"), (":authority", "localhost:443"),
                                           (":path", "/")])
_bad_head(":protocol on GET", lambda c: _std(c) + [(":protocol", "websocket")])
_bad_head("extended CONNECT without :authority",
          lambda c: [(":method", "CONNECT"), (":protocol", "websocket"), _std(c)[1], (":path", "/"),
                     ("host", "localhost")])


@case("8.3.1/OPTIONS * is answered", ("status", 1, 404))
def _(c):
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, req(c, "*", "OPTIONS")))


@case("8.1.1/DATA past content-length before END_STREAM: PROTOCOL_ERROR", ("rst", 1, "PROTOCOL_ERROR"))
def _(c):
    post(c, 1, 4)
    c.send(frame(DATA, 0, 1, b"testtest"))


@case("8.1.1/content-length matched by padded DATA is answered", ("status", 1, 200))
def _(c):
    post(c, 1, 4)
    c.send(frame(DATA, END_STREAM | PADDED, 1, bytes([6]) + b"test" + b"\x00" * 6))


@case("8.1.1/trailers after DATA short of content-length: PROTOCOL_ERROR", ("rst", 1, "PROTOCOL_ERROR"))
def _(c):
    post(c, 1, 6)
    c.send(frame(DATA, 0, 1, b"test") +
           frame(HEADERS, END_STREAM | END_HEADERS, 1, c.enc.encode([("x-trailer", "done")])))


@case("8.2.2/connection field in trailers: PROTOCOL_ERROR", ("rst", 1, "PROTOCOL_ERROR"))
def _(c):
    post(c, 1, 4)
    c.send(frame(DATA, 0, 1, b"test") +
           frame(HEADERS, END_STREAM | END_HEADERS, 1, c.enc.encode([("connection", "close")])))


@case("8.1/a second trailer section: STREAM_CLOSED", ("goaway", "STREAM_CLOSED"))
def _(c):
    post(c, 1, 4)
    c.send(frame(DATA, 0, 1, b"test") +
           frame(HEADERS, END_STREAM | END_HEADERS, 1, c.enc.encode([("x-a", "1")])) +
           frame(HEADERS, END_STREAM | END_HEADERS, 1, c.enc.encode([("x-b", "2")])))


@case("9218/priority fields (one that does not parse too) are accepted", ("status", 3, 200))
def _(c):
    get(c, 1, extra=[("priority", "u=0, i")])
    assert wait_end(c, 1) and c.status(1) == 200, "stream 1 not answered"
    get(c, 3, extra=[("priority", "u=(0)")])


@case("8.4/PUSH_PROMISE from a client: PROTOCOL_ERROR", ("goaway", "PROTOCOL_ERROR"))
def _(c):
    get(c, 1, "/slow")
    c.send(frame(PUSH_PROMISE, END_HEADERS, 1, u32(2) + req(c)))


# ---- RFC 7541 HPACK ----

def _raw_head(c, tail):
    # a valid block from the static table (method GET, path /, scheme, authority literal)
    scheme = 0x87 if TLS else 0x86
    return bytes([0x82, 0x84, scheme, 0x41, 9]) + b"localhost" + tail


def _hpack_err(name, tail, plain=False):
    @case("7541/" + name + ": COMPRESSION_ERROR", ("goaway", "COMPRESSION_ERROR"))
    def _(c):
        blk = tail if plain else _raw_head(c, tail)
        c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, blk))


_hpack_err("indexed field with an index past the tables", bytes([0xFF, 0x10]))   # 127 + 16
_hpack_err("literal with a name index past the tables", bytes([0x7F, 0x10, 0x01]) + b"a")
_hpack_err("indexed field with index 0", bytes([0x80]))
_hpack_err("table size update at the end of a block", bytes([0x20]))
_hpack_err("table size update over SETTINGS_HEADER_TABLE_SIZE", bytes([0x3F, 0xE2, 0x1F]), plain=True)  # 4097
# 'a' is 00011 (5 bits): 0x1F = 00011 111 (valid, 3 bits of EOS padding)
_hpack_err("Huffman string with padding over 7 bits", bytes([0x40, 0x82, 0x1F, 0xFF, 0x01]) + b"a")
_hpack_err("Huffman string padded with zeros", bytes([0x40, 0x81, 0x18, 0x01]) + b"a")
_hpack_err("Huffman string containing EOS", bytes([0x40, 0x84, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]) + b"a")


def _hpack_ok(name, tail, prefix=b""):
    @case("7541/" + name + " is accepted", ("status", 1, 200))
    def _(c):
        c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, prefix + _raw_head(c, tail)))


_hpack_ok("literal with incremental indexing, indexed name", bytes([0x40 | 58, 3]) + b"foo")  # user-agent
_hpack_ok("literal with incremental indexing, new name", bytes([0x40, 3]) + b"x-a" + bytes([1]) + b"b")
_hpack_ok("literal with incremental indexing, Huffman name and value", bytes([0x40, 0x81, 0x1F, 0x81, 0x1F]))
_hpack_ok("literal without indexing, indexed name", bytes([0x0F, 58 - 15, 3]) + b"foo")
_hpack_ok("literal without indexing, new name", bytes([0x00, 3]) + b"x-a" + bytes([1]) + b"b")
_hpack_ok("literal never indexed, indexed name", bytes([0x1F, 58 - 15, 3]) + b"foo")
_hpack_ok("literal never indexed, new name", bytes([0x10, 3]) + b"x-a" + bytes([1]) + b"b")
_hpack_ok("dynamic table size update at the start", b"", prefix=bytes([0x3F, 0xE1, 0x0F]))  # 2048
_hpack_ok("two dynamic table size updates at the start", b"", prefix=bytes([0x20, 0x3F, 0xE1, 0x1F]))  # 0, 4096


@case("7541/dynamic table entries are reused across requests", ("status", 3, 200))
def _(c):
    get(c, 1, extra=[("x-reused", "v" * 50)])
    assert wait_end(c, 1) and c.status(1) == 200, "stream 1 not answered"
    get(c, 3, extra=[("x-reused", "v" * 50)])   # now an indexed field


# ---- the peer's FIN (RFC 9113 §5.4: nothing more can arrive, no WINDOW_UPDATE either) ----

def _closed_soon(c):
    t0 = time.time()
    c.sock.shutdown(1)  # SHUT_WR: our FIN
    closed = c.wait_closed(5)
    secs = round(time.time() - t0, 2)
    return closed and secs < 3, {"closed": closed, "secs": secs, "status": c.status(1),
                                  "data": len(c.data.get(1, b""))}


@case("EOF/a finished response held by a zero window: closed at the peer's FIN", _closed_soon)
def _(c):
    c.send(settings([(4, 0)]))
    c.wait(lambda: c.settings_acks >= 2)
    get(c, 1, "/big")
    assert c.wait(lambda: c.status(1) == 200), "no response head"


@case("EOF/a response sent while the request body still comes: closed at the peer's FIN",
      _closed_soon)
def _(c):
    post(c, 1, 90000, "/")
    assert c.wait(lambda: 1 in c.ended), "no complete response"
    assert 1 not in c.resets, "reset: %r" % c.resets


@case("EOF/a response blocked on the connection window: closed at the peer's FIN", _closed_soon)
def _(c):
    # the connection window (65535) is spent by /big on stream 1, never reopened
    c.send(settings([(4, 1 << 20)]))
    c.wait(lambda: c.settings_acks >= 2)
    get(c, 1, "/big")
    assert c.wait(lambda: sum(c.data_sizes.get(1, [])) >= 65535), "window not spent"


# ---- the runner ----

def observe(c, want):
    if callable(want):
        return want(c)
    kind = want[0]
    if kind == "closed":
        # over TLS the server's own preface (SETTINGS, WINDOW_UPDATE) may leave before it reads
        # ours; nothing else may come
        c.wait_closed(5)
        return c.closed and set(c.order) <= {SETTINGS, WINDOW_UPDATE}, \
            {"closed": c.closed, "frames": c.order[:5]}
    if kind == "goaway":
        c.wait(lambda: c.goaway is not None or c.closed, 5)
        closed = c.wait_closed(5)
        got = {"goaway": c.goaway, "closed": closed, "resets": c.resets}
        return c.goaway is not None and c.goaway["code"] == want[1] and closed, got
    if kind == "rst":
        sid = want[1]
        c.wait(lambda: sid in c.resets or c.goaway is not None or c.closed, 5)
        up = c.goaway is None and alive(c)
        got = {"resets": c.resets, "goaway": c.goaway, "alive": up, "status": c.status(sid)}
        return c.resets.get(sid) == want[2] and up, got
    if kind == "status":
        sid = want[1]
        wait_end(c, sid)
        up = c.goaway is None and alive(c)
        got = {"status": c.status(sid), "resets": c.resets, "goaway": c.goaway, "alive": up}
        return c.status(sid) == want[2] and up and not c.resets.get(sid, "NO_ERROR") != "NO_ERROR", got
    if kind == "ping":
        up = alive(c)
        got = {"alive": up, "goaway": c.goaway, "resets": c.resets}
        return up and c.goaway is None and c.resets == c.resets_before, got
    raise ValueError(kind)


def run(name, want, fn, opts):
    try:
        c = RawConn(PORT, tls=TLS, preface=opts.get("preface", True))
    except OSError as e:
        return False, {"error": "connect: %s" % e}
    c.enc = hpack.Encoder()
    try:
        if opts.get("preface", True):
            if not c.wait(lambda: c.server_settings is not None and c.settings_acks >= 1, 5):
                return False, {"error": "no SETTINGS exchange", "frames": c.order}
        fn(c)
        c.resets_before = dict(c.resets)  # resets the case itself waited for
        return observe(c, want)
    except AssertionError as e:
        return False, {"error": "setup: %s" % e, "goaway": c.goaway, "resets": c.resets}
    finally:
        try:
            c.sock.close()
        except OSError:
            pass


def main():
    global TLS, PORT
    args = sys.argv[1:]
    if args == ["--list"]:
        for name, _, _, _ in CASES:
            print(name)
        return
    PORT = int(args.pop(0))
    if args and args[0] == "--tls":
        TLS = True
        args.pop(0)
    for name, want, fn, opts in CASES:
        if args and name not in args:
            continue
        t0 = time.time()
        ok, got = run(name, want, fn, opts)
        report({"name": name, "ok": bool(ok), "want": want if not callable(want) else want.__name__,
                "got": got, "secs": round(time.time() - t0, 2)})


if __name__ == "__main__":
    main()
