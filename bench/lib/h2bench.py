#!/usr/bin/python3
"""bench/lib/h2bench.py: the measuring half of bench/h2.sh (stdlib only, reuses benchlib.py).

  check PORT                    one h2c GET / (prior knowledge) must answer 200 "Hello, World!"
  window --name N --port P --root PID --conns C --streams M --duration D --warmup W
         --client-core K --jsonl FILE
                                h2load warm-up, then a measured h2load -D run; server CPU is the
                                delta of utime+stime over the server's process tree
  report FILE                   table of medians with khamsin/nginx-lua ratios
  idle --name N --port P --root PID --n COUNT --jsonl FILE
                                COUNT h2c connections, one GET each (response read), then idle:
                                PSS delta / COUNT
  cgsplit CALLGRIND_OUT N       khamsin's h2 request split: inclusive Ir / request of nghttp2's
                                entry points and of our callbacks and layers under them
"""
import argparse
import json
import os
import re
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# HPACK, no dynamic table: :method GET (idx 2), :scheme http (idx 6), :path / (idx 4),
# :authority literal without indexing (name idx 1) "127.0.0.1"
HEADERS_BLOCK = bytes([0x82, 0x86, 0x84, 0x01, 0x09]) + b"127.0.0.1"


def frame(t, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([t, flags]) + struct.pack(">I", sid) + payload


REQUEST = PREFACE + frame(4, 0, 0) + frame(1, 0x5, 1, HEADERS_BLOCK)


def read_until_end_stream(sock, deadline):
    """Reads frames until stream 1 ends; returns (status_ok, body_bytes). ACKs SETTINGS."""
    buf, body, ok = b"", b"", False
    while time.time() < deadline:
        sock.settimeout(max(deadline - time.time(), 0.01))
        d = sock.recv(65536)
        if not d:
            break
        buf += d
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            t, fl, sid = buf[3], buf[4], struct.unpack(">I", buf[5:9])[0] & 0x7FFFFFFF
            p = buf[9:9 + n]
            buf = buf[9 + n:]
            if t == 4 and not fl & 1:
                sock.sendall(frame(4, 1, 0))
            if t == 1 and sid == 1:
                ok = p[:1] == b"\x88"  # indexed :status 200
            if t == 0 and sid == 1:
                body += p
            if t in (0, 1) and sid == 1 and fl & 1:
                return ok, body
    return ok, body


def connect(port, tls, timeout):
    """A connection speaking h2: prior knowledge on cleartext, ALPN h2 over TLS (any certificate)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        s = ctx.wrap_socket(s)
        if s.selected_alpn_protocol() != "h2":
            benchlib.die(f"port {port}: TLS without ALPN h2")
    return s


def cmd_check(a):
    s = connect(a.port, a.tls, 3)
    s.sendall(REQUEST)
    ok, body = read_until_end_stream(s, time.time() + 3)
    s.close()
    if not ok or body != b"Hello, World!":
        benchlib.die(f"port {a.port}: h2c GET / did not answer 200 'Hello, World!' (body {body[:60]!r})")


def cmd_waitready(a):
    deadline = time.time() + a.timeout
    last = None
    while time.time() < deadline:
        if not os.path.exists(f"/proc/{a.pid}"):
            benchlib.die(f"server pid {a.pid} exited before it was ready")
        try:
            s = connect(a.port, a.tls, 1)
            s.sendall(REQUEST)
            ok, body = read_until_end_stream(s, time.time() + 1)
            s.close()
            if ok:
                return
            last = "no 200"
        except OSError as e:
            last = str(e)
        time.sleep(0.05)
    benchlib.die(f"server on port {a.port} not ready (h2c) after {a.timeout}s (last: {last})")


def h2load(port, conns, streams, secs, core, tls, warm=None):
    cmd = ["taskset", "-c", str(core), "h2load", "-c", str(conns), "-m", str(streams), "-t", "1",
           "-D", str(secs), f"{'https' if tls else 'http'}://127.0.0.1:{port}/"]
    if warm:
        cmd[-1:-1] = ["--warm-up-time", str(warm)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 60).stdout
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                  r"(\d+) errored, (\d+) timeout", out)
    rps = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
    if not m or not rps:
        benchlib.die("cannot parse h2load output:\n" + out)
    secs_taken = float(rps.group(1)) / (1000 if rps.group(2) == "ms" else 1)
    return {"done": int(m.group(3)), "succeeded": int(m.group(4)), "failed": int(m.group(5)),
            "errored": int(m.group(6)), "rps": float(rps.group(3)), "secs": secs_taken}, out


def cmd_window(a):
    h2load(a.port, a.conns, a.streams, a.warmup, a.client_core, a.tls)
    before = benchlib.cpu_snapshot(a.root)
    r, out = h2load(a.port, a.conns, a.streams, a.duration, a.client_core, a.tls)
    after = benchlib.cpu_snapshot(a.root)
    cpu, lost = benchlib.cpu_delta_seconds(before, after)
    r.update({"server": a.name, "conns": a.conns, "streams": a.streams, "round": a.round,
              "server_cpu_s": round(cpu, 3), "req_per_cpu_s": round(r["succeeded"] / cpu, 1) if cpu else None,
              "lost": lost})
    with open(a.jsonl, "a") as f:
        f.write(json.dumps(r) + "\n")
    with open(a.rawlog, "a") as f:
        f.write(f"### {a.name} c={a.conns} m={a.streams} round {a.round}\n{out}\n")
    bad = r["failed"] or r["errored"]
    print(f"  round {a.round} {a.name:13s} c={a.conns} m={a.streams}: {r['rps']:10.0f} req/s  "
          f"server CPU {cpu:6.2f} s  {r['req_per_cpu_s'] or 0:10.0f} req/CPU-s"
          f"{'  FAILED ' + str(r['failed']) + ' errored ' + str(r['errored']) if bad else ''}")
    if bad:
        sys.exit(1)


def cmd_report(a):
    rows = [json.loads(x) for x in open(a.jsonl)]
    keys = sorted({(r["conns"], r["streams"]) for r in rows})
    servers = []
    for r in rows:
        if r["server"] not in servers:
            servers.append(r["server"])
    print(f"  {'server':15s} {'c x m':>8s} {'req/s (median)':>16s} {'req/CPU-s (median)':>20s}  runs")
    med = {}
    for k in keys:
        for s in servers:
            sel = [r for r in rows if r["server"] == s and (r["conns"], r["streams"]) == k]
            if not sel:
                continue
            rps = statistics.median(r["rps"] for r in sel)
            eff = statistics.median(r["req_per_cpu_s"] or 0 for r in sel)
            med[(s, k)] = (rps, eff)
            print(f"  {s:15s} {str(k[0]) + 'x' + str(k[1]):>8s} {rps:16.0f} {eff:20.0f}  {len(sel)}")
    for k in keys:
        for ours, theirs in (("khamsin", "nginx-lua"), ("khamsin", "lighttpd"), ("khamsin", "lighttpd-static"),
                            ("khamsin-tls", "nginx-lua-tls")):
            if (ours, k) in med and (theirs, k) in med:
                kr, ke = med[(ours, k)]
                nr, ne = med[(theirs, k)]
                print(f"  ratio {ours} / {theirs} at {k[0]}x{k[1]}: req/s {kr / nr:.2f}, req/CPU-s {ke / ne:.2f}")


def cmd_idle(a):
    benchlib.raise_nofile()
    time.sleep(0.5)
    base, _ = benchlib.pss_kib(a.root)
    abase = benchlib.anon_kib(a.root)
    socks = []
    for i in range(a.n):
        s = connect(a.port, a.tls, 5)
        s.sendall(REQUEST)
        ok, body = read_until_end_stream(s, time.time() + 5)
        if not ok:
            benchlib.die(f"{a.name}: connection {i} got no 200")
        socks.append(s)
    time.sleep(1)
    after, _ = benchlib.pss_kib(a.root)
    aafter = benchlib.anon_kib(a.root)
    closed = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed += 1
        except (BlockingIOError, ssl.SSLWantReadError):
            pass
        except OSError:
            closed += 1
    per = (after - base) * 1024 / a.n
    aper = (aafter - abase) * 1024 / a.n
    print(f"  {a.name:13s} {a.n} idle {'h2 (TLS)' if a.tls else 'h2c'} connections: PSS {base} KiB -> {after} KiB, "
          f"{per:.0f} bytes per connection; RssAnon {abase} KiB -> {aafter} KiB, {aper:.0f} bytes per "
          f"connection ({closed} closed by the server meanwhile)")
    with open(a.jsonl, "a") as f:
        f.write(json.dumps({"server": a.name, "n": a.n, "pss_before_kib": base, "pss_after_kib": after,
                            "bytes_per_conn": round(per), "anon_before_kib": abase,
                            "anon_after_kib": aafter, "anon_bytes_per_conn": round(aper),
                            "closed": closed}) + "\n")
    for s in socks:
        s.close()


# (label, function names as callgrind_annotate prints them; the largest match is taken)
CG_ROWS = [
    ("read: h2_on_read (all of it, Lua included)", ["h2_on_read"]),
    ("  nghttp2_session_mem_recv", ["nghttp2_session_mem_recv"]),
    ("    HPACK decode (nghttp2_hd_inflate_hd_nv)", ["nghttp2_hd_inflate_hd_nv"]),
    ("    header checks (nghttp2_http_on_header)", ["nghttp2_http_on_header"]),
    ("    stream open (nghttp2_session_on_request_headers_received)", ["nghttp2_session_on_request_headers_received"]),
    ("    ours: on_begin_headers (stream alloc)", ["on_begin_headers"]),
    ("    ours: on_header (field copy)", ["on_header"]),
    ("    ours: on_frame_recv -> head_done", ["on_frame_recv"]),
    ("      kh_stream_set_head (copy into the request)", ["kh_stream_set_head"]),
    ("  dispatch_pending (the app: Lua)", ["dispatch_pending"]),
    ("    l_respond", ["l_respond"]),
    ("      h2_head (sink head)", ["h2_head"]),
    ("        kh_stream_head_build", ["kh_stream_head_build"]),
    ("        nghttp2_submit_response", ["nghttp2_submit_response"]),
    ("          nghttp2_nv_array_copy", ["nghttp2_nv_array_copy"]),
    ("      h2_data (sink data)", ["h2_data"]),
    ("flush: h2_on_flush", ["h2_on_flush"]),
    ("  nghttp2_session_mem_send", ["nghttp2_session_mem_send"]),
    ("    HPACK encode (nghttp2_hd_deflate_hd_bufs)", ["nghttp2_hd_deflate_hd_bufs"]),
    ("    DATA (nghttp2_session_pack_data)", ["nghttp2_session_pack_data"]),
    ("    after send (session_after_frame_sent1)", ["session_after_frame_sent1"]),
    ("      stream close (nghttp2_session_close_stream)", ["nghttp2_session_close_stream"]),
    ("        ours: on_stream_close", ["on_stream_close"]),
    ("nghttp2 allocations (h2m_malloc + h2m_free)", ["h2m_malloc", "h2m_free"]),
    ("libc malloc + free, all callers", ["malloc", "free"]),
]


def cmd_cgsplit(a):
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--show=Ir", "--threshold=100", a.file],
                         capture_output=True, text=True).stdout
    inc = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+\S*?:([\w.']+)", line)
        if m:
            fn = m.group(2).split(".")[0].split("'")[0]
            inc[fn] = max(inc.get(fn, 0), int(m.group(1).replace(",", "")))
    for label, fns in CG_ROWS:
        v = sum(inc.get(f, 0) for f in fns)
        print(f"  {label:66s} {v / a.n:8.0f}")


def main():
    p = argparse.ArgumentParser()
    sp = p.add_subparsers(dest="cmd", required=True)
    c = sp.add_parser("check"); c.add_argument("port", type=int); c.set_defaults(f=cmd_check)
    c.add_argument("--tls", action="store_true")
    c = sp.add_parser("waitready"); c.add_argument("port", type=int); c.add_argument("pid", type=int)
    c.add_argument("timeout", type=float); c.set_defaults(f=cmd_waitready)
    c.add_argument("--tls", action="store_true")
    w = sp.add_parser("window")
    for k in ("name", "jsonl", "rawlog"):
        w.add_argument("--" + k, required=True)
    for k in ("port", "root", "conns", "streams", "duration", "warmup", "client_core", "round"):
        w.add_argument("--" + k.replace("_", "-"), dest=k, type=int, required=True)
    w.add_argument("--tls", action="store_true")
    w.set_defaults(f=cmd_window)
    r = sp.add_parser("report"); r.add_argument("jsonl"); r.set_defaults(f=cmd_report)
    i = sp.add_parser("idle")
    i.add_argument("--name", required=True); i.add_argument("--jsonl", required=True)
    for k in ("port", "root", "n"):
        i.add_argument("--" + k, type=int, required=True)
    i.add_argument("--tls", action="store_true")
    g = sp.add_parser("cgsplit"); g.add_argument("file"); g.add_argument("n", type=int)
    g.set_defaults(f=cmd_cgsplit)
    i.set_defaults(f=cmd_idle)
    a = p.parse_args()
    a.f(a)


if __name__ == "__main__":
    main()
