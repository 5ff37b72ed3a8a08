#!/usr/bin/python3
"""Helpers for bench/http1.sh (stdlib only; run with /usr/bin/python3).

Subcommands:
  portfree PORT...            exit 1 if something listens on 127.0.0.1:PORT
  check PORT                  GET / must answer 200, Content-Length 13, body "Hello, World!"
  waitready PORT PID SECS     poll until `check` passes (fails if PID dies or SECS pass)
  tree PID                    print PID and all its descendants
  window ...                  one wrk load window with server CPU from /proc (appends a TSV row)
  report TSV                  median table + ratios
  idle ...                    PSS per idle keep-alive connection
  startup ...                 exec -> first HTTP answer, N runs
  startup-floor ...           exec -> exit of an empty program (/bin/true), spawned and polled
                              the same way: what "from exec" costs on this machine
"""
import argparse
import json
import os
import re
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import time

BODY = b"Hello, World!"
REQ = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
CLK_TCK = os.sysconf("SC_CLK_TCK")
NOISY = 0.05  # a window where the server or wrk waited >5% of the time for a CPU (or steal >5%) is noisy


def die(msg, code=1):
    print("ERROR: " + msg, file=sys.stderr, flush=True)
    sys.exit(code)


# ---------------------------------------------------------------- /proc ----

def _stat_fields(pid):
    """Fields of /proc/PID/stat after the comm, index 0 == field 3 (state)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2:].split()


def tree(root):
    """root and all its descendants (scan of /proc/*/stat ppid)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ppid = int(_stat_fields(d)[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [int(root)]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def run_delay_ns(pids):
    """Sum over all threads of `pids` of the time spent runnable but waiting for a CPU
    (2nd field of /proc/PID/task/TID/schedstat, ns). Returns {tid: ns}."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    out[int(tid)] = int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def cpu_snapshot(root):
    """{(pid, starttime): utime+stime ticks} over the process tree.

    /proc/PID/stat utime/stime already sum all threads of the process."""
    snap = {}
    for pid in tree(root):
        try:
            f = _stat_fields(pid)
        except OSError:
            continue
        # field 14 utime, 15 stime, 22 starttime -> indices 11, 12, 19
        snap[(pid, int(f[19]))] = int(f[11]) + int(f[12])
    return snap


def cpu_delta_seconds(before, after):
    ticks = 0
    for key, t in after.items():
        ticks += t - before.get(key, 0)
    # a process that died inside the window loses its last ticks; report it
    lost = [k[0] for k in before if k not in after]
    return ticks / CLK_TCK, lost


def _irq_time_accounting():
    """True if the kernel accounts irq/softirq time apart from task time (CONFIG_IRQ_TIME_ACCOUNTING).

    Default (tick-based) accounting charges an irq/softirq tick to the current task's stime as
    well as to /proc/stat's irq/softirq columns: the server's CPU then includes the kernel network
    work done on its core while it runs, and the core's busy time must include irq+softirq."""
    try:
        import gzip
        with gzip.open("/proc/config.gz", "rt") as f:
            return "CONFIG_IRQ_TIME_ACCOUNTING=y" in f.read()
    except OSError:
        return False


IRQ_TIME_ACCOUNTING = _irq_time_accounting()


def core_times(cores):
    """{core: (task_ticks, irq_ticks, steal_ticks)} from /proc/stat; task = user+nice+system."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                v = line.split()
                c = int(v[0][3:])
                if c in cores:
                    n = [int(x) for x in v[1:]]
                    out[c] = (n[0] + n[1] + n[2], n[5] + n[6], n[7])
    return out


def status_kib(root, field):
    """The sum of one /proc/PID/status field (KiB: "VmRSS", "RssAnon", ...) over root's process tree."""
    total = 0
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total


def anon_kib(root):
    """RssAnon (KiB) of root's process tree: its private anonymous resident memory, which, unlike
    PSS, does not drop when a client maps the same libraries (PSS splits shared pages)."""
    return status_kib(root, "RssAnon")


def pss_kib(root):
    total, per = 0, {}
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        v = int(line.split()[1])
                        per[pid] = v
                        total += v
                        break
        except OSError:
            pass
    return total, per


# ----------------------------------------------------------------- HTTP ----

def read_response(sock, deadline):
    """Read one HTTP/1.1 response with Content-Length. Returns (status, headers, body, raw_head)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("EOF before end of headers")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(b":")
        headers[k.strip().lower().decode()] = v.strip().decode()
    if "content-length" not in headers:
        raise ConnectionError("no Content-Length in response: %r" % head)
    n = int(headers["content-length"])
    while len(rest) < n:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("EOF in body")
        rest += chunk
    return status, headers, rest[:n], head


def http_get(port, timeout=2.0):
    deadline = time.monotonic() + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(REQ)
        return read_response(s, deadline)


def check_ok(port):
    status, headers, body, head = http_get(port)
    problems = []
    if status != 200:
        problems.append(f"status {status}")
    if body != BODY:
        problems.append(f"body {body!r}")
    if headers.get("content-length") != "13":
        problems.append(f"content-length {headers.get('content-length')!r}")
    return problems, head, headers


def cmd_portfree(a):
    busy = []
    for p in a.ports:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", p))
        except OSError as e:
            busy.append(f"{p} ({e.strerror})")
        finally:
            s.close()
    if busy:
        die("port(s) busy on 127.0.0.1: " + ", ".join(busy))


def cmd_check(a):
    try:
        problems, head, headers = check_ok(a.port)
    except Exception as e:  # noqa: BLE001
        die(f"127.0.0.1:{a.port}: GET / failed: {e}")
    if problems:
        die(f"127.0.0.1:{a.port}: bad answer: " + "; ".join(problems) + "\n" + head.decode(errors="replace"))
    hl = len(head) + 4
    print(f"  check 127.0.0.1:{a.port}: 200, body 13 B \"Hello, World!\", "
          f"header block {hl} B, content-type {headers.get('content-type')!r}, "
          f"headers: {', '.join(k for k in headers)}")


def cmd_waitready(a):
    deadline = time.monotonic() + a.secs
    last = None
    while time.monotonic() < deadline:
        try:
            os.kill(a.pid, 0)
            with open(f"/proc/{a.pid}/stat") as f:
                if ") Z" in f.read():
                    die(f"server pid {a.pid} exited before answering")
        except OSError:
            die(f"server pid {a.pid} exited before answering")
        try:
            problems, _, _ = check_ok(a.port)
            if not problems:
                return
            last = "; ".join(problems)
        except Exception as e:  # noqa: BLE001
            last = str(e)
        time.sleep(0.02)
    die(f"server on port {a.port} not ready after {a.secs}s (last: {last})")


def cmd_tree(a):
    print(" ".join(str(p) for p in tree(a.pid)))


# ------------------------------------------------------------------ wrk ----

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def _ms(txt):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", txt)
    if not m:
        raise ValueError(txt)
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(out):
    r = {}
    m = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    r["rps"] = float(m.group(1)) if m else None
    m = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    r["p99_ms"] = _ms(m.group(1)) if m else None
    m = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    r["p50_ms"] = _ms(m.group(1)) if m else None
    m = re.search(r"^\s+(\d+) requests in ([\d.]+)(us|ms|s|m)", out, re.M)
    r["requests"] = int(m.group(1)) if m else None
    r["wrk_secs"] = _ms(m.group(2) + m.group(3)) / 1e3 if m else None
    errs = []
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m and any(int(x) for x in m.groups()):
        errs.append(m.group(0))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m and int(m.group(1)):
        errs.append(m.group(0))
    r["errors"] = errs
    return r


def run_wrk(port, conns, secs, wrk_core, headers=()):
    """Run wrk; returns (cmd, output, rc, wrk CPU seconds, wrk run-queue delay seconds).

    headers: extra request headers (wrk -H), e.g. "Connection: close" (then wrk opens a new
    connection for every request, after reading the response).
    The run delay is sampled every 0.2 s while wrk runs (the last <0.2 s are not seen)."""
    cmd = ["taskset", "-c", str(wrk_core), "wrk", "-t1", f"-c{conns}", f"-d{secs}s", "--latency"]
    for h in headers:
        cmd += ["-H", h]
    cmd.append(f"http://127.0.0.1:{port}/")
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    delay = {}
    while True:
        try:
            out, _ = p.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            delay.update(run_delay_ns([p.pid]))
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return cmd, out.decode(errors="replace"), p.returncode, cpu, sum(delay.values()) / 1e9


def wait_quiet(cores, max_wait, sample=0.5, limit=NOISY):
    """Wait (up to max_wait s) until other tasks use <= limit of each core over `sample` s.

    Called while the freshly started server is idle, so all task time on the cores is foreign."""
    t_start = time.monotonic()
    while True:
        c0 = core_times(cores)
        time.sleep(sample)
        c1 = core_times(cores)
        worst = max((c1[c][0] + c1[c][1] - c0[c][0] - c0[c][1]) / CLK_TCK / sample for c in cores)
        waited = time.monotonic() - t_start
        if worst <= limit:
            return waited, worst
        if waited >= max_wait:
            return waited, worst


def cmd_window(a):
    if a.quiet_wait > 0:
        waited, worst = wait_quiet({a.server_core, a.wrk_core}, a.quiet_wait)
        if a.waited_log:
            with open(a.waited_log, "a") as f:
                f.write(f"{waited:.1f}\n")
        if waited > 1.0:
            print(f"  (waited {waited:.0f} s for the box to be quiet; other tasks now at {100 * worst:.0f}% of a core)", flush=True)
    # warm-up (not measured)
    if a.warmup > 0:
        cmd, out, rc, _, _ = run_wrk(a.port, a.conns, a.warmup, a.wrk_core, a.header)
        w = parse_wrk(out)
        if rc != 0 or w["errors"] or w["rps"] is None:
            die(f"{a.name} c{a.conns} warm-up: wrk rc={rc} errors={w['errors']}\n{out}", 2)
    before = cpu_snapshot(a.root)
    srv_pids = tree(a.root)
    rd0 = run_delay_ns(srv_pids)
    cores0 = core_times({a.server_core, a.wrk_core})
    t0 = time.monotonic()
    cmd, out, rc, wrk_cpu, wrk_delay = run_wrk(a.port, a.conns, a.duration, a.wrk_core, a.header)
    wall = time.monotonic() - t0
    cores1 = core_times({a.server_core, a.wrk_core})
    rd1 = run_delay_ns(srv_pids)
    after = cpu_snapshot(a.root)
    srv_delay = sum(v - rd0.get(t, 0) for t, v in rd1.items()) / 1e9
    # CPU used on the server core by anything but the server (other tasks, irqs), and hypervisor steal
    busy_srv_core = (cores1[a.server_core][0] - cores0[a.server_core][0]) / CLK_TCK
    irq_srv_core = (cores1[a.server_core][1] - cores0[a.server_core][1]) / CLK_TCK
    if not IRQ_TIME_ACCOUNTING:
        busy_srv_core += irq_srv_core  # irq ticks are in the server's stime too (see above)
    steal = sum(cores1[c][2] - cores0[c][2] for c in cores1) / CLK_TCK
    cpu, lost = cpu_delta_seconds(before, after)
    with open(a.rawlog, "a") as f:
        f.write(f"### round {a.round} {a.name} c{a.conns}: {' '.join(cmd)}\n{out}\n")
    w = parse_wrk(out)
    if rc != 0 or w["rps"] is None or w["p99_ms"] is None or w["requests"] is None:
        die(f"{a.name} c{a.conns}: wrk failed (rc={rc}) or output not parsed:\n{out}", 2)
    if w["errors"]:
        die(f"{a.name} c{a.conns} round {a.round}: wrk reported errors: {'; '.join(w['errors'])}\n{out}", 2)
    if lost:
        die(f"{a.name}: server process(es) {lost} exited during the window", 2)
    if cpu <= 0:
        die(f"{a.name}: zero server CPU measured (wrong pid {a.root}?)", 2)
    row = dict(round=a.round, server=a.name, conns=a.conns, rps=w["rps"], p50_ms=w["p50_ms"],
               p99_ms=w["p99_ms"], requests=w["requests"], wall=wall, cpu=cpu,
               req_per_cpu=w["requests"] / cpu, srv_util=cpu / wall, wrk_util=wrk_cpu / wall,
               nprocs=len(after), other_srv_core=max(0.0, busy_srv_core - cpu) / wall,
               irq_srv_core=irq_srv_core / wall, steal=steal / wall,
               srv_wait=srv_delay / wall, wrk_wait=wrk_delay / wall)
    # noisy = the server or wrk waited for a CPU (others ran while they were runnable), or the
    # hypervisor stole time. Others merely using the server core's idle time is not noise.
    noisy = row["srv_wait"] > NOISY or row["wrk_wait"] > NOISY or row["steal"] > NOISY
    retry = noisy and a.retry_noisy
    row["noisy"] = noisy
    with open(a.rejected if retry else a.tsv, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"  round {a.round} {a.name:<13} c{a.conns:<4} {w['rps']:>10.0f} req/s  p99 {w['p99_ms']:7.3f} ms  "
          f"server CPU {cpu:6.2f} s ({100 * cpu / wall:3.0f}% of a core, {len(after)} proc)  "
          f"{w['requests'] / cpu:>9.0f} req/CPU-s  wrk CPU {100 * wrk_cpu / wall:3.0f}%  "
          f"waited for CPU: server {100 * row['srv_wait']:4.1f}% wrk {100 * row['wrk_wait']:4.1f}%  "
          f"core {a.server_core}: others {100 * row['other_srv_core']:3.0f}% irq {100 * row['irq_srv_core']:3.0f}%  steal {100 * row['steal']:3.0f}%"
          + (("  <-- NOISY, discarded, redone" if retry else "  <-- NOISY (kept)") if noisy else ""), flush=True)
    if retry:
        sys.exit(3)


# --------------------------------------------------------------- report ----

def cmd_report(a):
    rows = [json.loads(l) for l in open(a.tsv) if l.strip()]
    servers = list(dict.fromkeys(r["server"] for r in rows))
    conns = sorted(set(r["conns"] for r in rows))
    med = {}
    print("Medians over rounds (range min..max in brackets):")
    print(f"{'server':<13} {'conns':>5} {'n':>2} {'req/s':>24} {'p99 ms':>24} {'req per server CPU-s':>24}{'srv CPU':>9}{'wrk CPU':>9}")
    for c in conns:
        for s in servers:
            rs = [r for r in rows if r["server"] == s and r["conns"] == c]
            if not rs:
                continue
            m = {k: statistics.median(r[k] for r in rs) for k in ("rps", "p99_ms", "req_per_cpu", "srv_util", "wrk_util")}
            med[(s, c)] = m
            rng = {k: (min(r[k] for r in rs), max(r[k] for r in rs)) for k in ("rps", "p99_ms", "req_per_cpu")}
            def cell(k, fmt):
                return " " + (fmt.format(m[k]) + " [" + fmt.format(rng[k][0]) + ".." + fmt.format(rng[k][1]) + "]").rjust(24)
            print(f"{s:<13} {c:>5} {len(rs):>2}" + cell("rps", "{:.0f}") + cell("p99_ms", "{:.3f}") +
                  cell("req_per_cpu", "{:.0f}") + f"{100 * m['srv_util']:>8.0f}%{100 * m['wrk_util']:>8.0f}%")
    noisy = [r for r in rows if r.get("noisy")]
    print("  srv CPU = server utime+stime / wall (100% = server saturates core 1); "
          "wrk CPU = wrk on core 0 (near 100% = client-bound, then req/s says little, req/CPU-s still does)")
    if noisy:
        print(f"  WARNING: {len(noisy)} of {len(rows)} windows were NOISY (server or wrk runnable but waiting for a CPU "
              f">{100 * NOISY:.0f}% of the window, or hypervisor steal >{100 * NOISY:.0f}%): " +
              ", ".join(f"r{r['round']} {r['server']} c{r['conns']} (server {100 * r['srv_wait']:.0f}%, wrk {100 * r['wrk_wait']:.0f}%, "
                        f"steal {100 * r['steal']:.0f}%)" for r in noisy) +
              ". Rerun on a quiet box before quoting these figures.")
    else:
        print(f"  all {len(rows)} windows quiet: server and wrk waited for a CPU <= {100 * NOISY:.0f}% of the window, steal <= {100 * NOISY:.0f}%")
    print()
    subject = "khamsin" if "khamsin" in servers else (servers[0] if servers else None)
    anchors = [s for s in servers if s != subject]
    if subject and anchors:
        print(f"Ratios {subject} / anchor (medians of this run; >1 = {subject} better for req/s and req/CPU-s):")
        for c in conns:
            for an in anchors:
                if (subject, c) in med and (an, c) in med:
                    x, y = med[(subject, c)], med[(an, c)]
                    print(f"  c{c:<4} vs {an:<13} req/s x{x['rps'] / y['rps']:.2f}   "
                          f"req per CPU-s x{x['req_per_cpu'] / y['req_per_cpu']:.2f}   "
                          f"p99 {x['p99_ms']:.3f} vs {y['p99_ms']:.3f} ms (x{x['p99_ms'] / y['p99_ms']:.2f}, <1 = lower latency)")
        cmax = max(conns)
        print(f"p99 at c{cmax}: " + ", ".join(f"{s} {med[(s, cmax)]['p99_ms']:.3f} ms" for s in servers if (s, cmax) in med))


# ----------------------------------------------------------------- idle ----

def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_idle(port, n, concurrency, timeout):
    """Open n connections, one GET each, read the full response, keep them open."""
    sel = selectors.DefaultSelector()
    done, started, inflight = [], 0, 0
    state = {}
    deadline = time.monotonic() + timeout

    def start_one():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        state[s] = [b"", None]
        sel.register(s, selectors.EVENT_WRITE)

    while len(done) < n:
        while started < n and inflight < concurrency:
            start_one()
            started += 1
            inflight += 1
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(done)}/{n} connections completed in {timeout}s")
        for key, ev in sel.select(timeout=1.0):
            s = key.fileobj
            if ev & selectors.EVENT_WRITE:
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise ConnectionError(f"connect failed: {os.strerror(err)} after {len(done)} connections")
                s.send(REQ)  # 27 bytes always fit an empty send buffer
                sel.modify(s, selectors.EVENT_READ)
                continue
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError(f"server closed a connection before answering (after {len(done)})")
            st = state[s]
            st[0] += chunk
            if st[1] is None and b"\r\n\r\n" in st[0]:
                head, _ = st[0].split(b"\r\n\r\n", 1)
                if not head.startswith(b"HTTP/1.1 200"):
                    raise ConnectionError("bad answer: %r" % head[:200])
                m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if not m:
                    raise ConnectionError("no content-length: %r" % head)
                st[1] = len(head) + 4 + int(m.group(1))
            if st[1] is not None and len(st[0]) >= st[1]:
                if st[0][len(st[0]) - 13:] != BODY or len(st[0]) != st[1]:
                    raise ConnectionError("bad body / extra bytes: %r" % st[0][-40:])
                sel.unregister(s)
                del state[s]
                done.append(s)
                inflight -= 1
    sel.close()
    return done


def count_closed(socks):
    closed = 0
    for s in socks:
        try:
            if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    return closed


def cmd_idle(a):
    lim = raise_nofile()
    if lim < a.n + 100:
        die(f"client RLIMIT_NOFILE {lim} < {a.n + 100}; raise the hard limit")
    os.sched_setaffinity(0, {a.client_core})
    base, per0 = pss_kib(a.root)
    t0 = time.monotonic()
    try:
        socks = open_idle(a.port, a.n, a.concurrency, a.timeout)
    except (OSError, TimeoutError) as e:
        alive = os.path.exists(f"/proc/{a.root}") and ") Z" not in open(f"/proc/{a.root}/stat").read()
        die(f"{a.name}: idle-connection client failed: {e} (server pid {a.root} "
            f"{'still alive' if alive else 'is GONE'})", 2)
    t_open = time.monotonic() - t0
    time.sleep(a.settle)
    after, per1 = pss_kib(a.root)
    closed = count_closed(socks)
    delta = (after - base) * 1024
    print(f"  {a.name:<13} PSS before {base / 1024:8.1f} MiB ({len(per0)} proc)  after {a.n} idle conns "
          f"{after / 1024:8.1f} MiB  delta {delta / 1048576:7.1f} MiB  => {delta / a.n:7.0f} bytes/conn  "
          f"(opened in {t_open:.1f} s, settle {a.settle}s, {closed} closed by server at measurement)", flush=True)
    for s in socks:
        s.close()
    if closed:
        die(f"{a.name}: server closed {closed} of {a.n} idle connections before the measurement; figure invalid", 2)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(dict(server=a.name, n=a.n, pss_before_kib=base, pss_after_kib=after,
                                    bytes_per_conn=delta / a.n)) + "\n")


# -------------------------------------------------------------- startup ----

def cmd_startup(a):
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    times = []
    log = open(a.log, "ab") if a.log else subprocess.DEVNULL
    for i in range(a.runs):
        # busy-port guard: nothing may answer before we spawn
        try:
            socket.create_connection(("127.0.0.1", a.port), timeout=0.2).close()
            die(f"startup: something already answers on port {a.port}")
        except OSError:
            pass
        # the child inherits core 1 from us; we poll from core 0
        os.sched_setaffinity(0, {a.server_core})
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=log, stderr=log, close_fds=True)
        os.sched_setaffinity(0, {a.client_core})
        answered = None
        while True:
            t = time.perf_counter()
            if t - t0 > a.timeout:
                break
            if p.poll() is not None:
                die(f"startup: {cmd[0]} exited with {p.returncode} before answering")
            try:
                s = socket.socket()
                s.settimeout(1.0)
                s.connect(("127.0.0.1", a.port))
                s.sendall(REQ)
                st, _, body, _ = read_response(s, time.monotonic() + 1.0)
                s.close()
                if st == 200 and body == BODY:
                    answered = time.perf_counter()
                    break
            except OSError:
                s.close()
            except Exception:  # noqa: BLE001
                s.close()
            time.sleep(0.0002)
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            for pid in tree(p.pid)[::-1]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            p.wait()
        if answered is None:
            die(f"startup: no answer within {a.timeout}s")
        times.append((answered - t0) * 1e3)
        # wait until the port is free again (children may linger a moment)
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", a.port), timeout=0.2).close()
                time.sleep(0.01)
            except OSError:
                break
    print(f"  {a.name:<13} exec -> first 200: median {statistics.median(times):7.2f} ms  "
          f"(min {min(times):.2f}, max {max(times):.2f}, n={len(times)})", flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(dict(server=a.name, startup_ms=times)) + "\n")


def cmd_startup_floor(a):
    """The floor under every startup figure: an empty program spawned exactly as cmd_startup
    spawns a server (pinned to the server core, Popen with close_fds, output to the log), with
    its exit polled at the same 0.2 ms cadence as the server's answer."""
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    times = []
    log = open(a.log, "ab") if a.log else subprocess.DEVNULL
    for i in range(a.runs):
        os.sched_setaffinity(0, {a.server_core})
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=log, stderr=log, close_fds=True)
        os.sched_setaffinity(0, {a.client_core})
        while p.poll() is None:
            time.sleep(0.0002)
        done = time.perf_counter()
        if p.returncode != 0:
            die(f"startup-floor: {cmd[0]} exited with {p.returncode}")
        times.append((done - t0) * 1e3)
    print(f"  {a.name:<13} exec -> exit:      median {statistics.median(times):7.2f} ms  "
          f"(min {min(times):.2f}, max {max(times):.2f}, n={len(times)})", flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(dict(server=a.name, exit_ms=times)) + "\n")


# ----------------------------------------------------------------- main ----

def main():
    # die *by* SIGINT/SIGTERM (no KeyboardInterrupt traceback + exit 1), so that the calling
    # bash sees a signal death and stops too
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ap = argparse.ArgumentParser()
    sp = ap.add_subparsers(dest="cmd", required=True)
    p = sp.add_parser("portfree"); p.add_argument("ports", type=int, nargs="+"); p.set_defaults(f=cmd_portfree)
    p = sp.add_parser("check"); p.add_argument("port", type=int); p.set_defaults(f=cmd_check)
    p = sp.add_parser("waitready"); p.add_argument("port", type=int); p.add_argument("pid", type=int)
    p.add_argument("secs", type=float); p.set_defaults(f=cmd_waitready)
    p = sp.add_parser("tree"); p.add_argument("pid", type=int); p.set_defaults(f=cmd_tree)
    p = sp.add_parser("window")
    for k in ("name", "tsv", "rawlog"):
        p.add_argument("--" + k, required=True)
    for k in ("port", "root", "conns", "round"):
        p.add_argument("--" + k, type=int, required=True)
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--wrk-core", type=int, default=0)
    p.add_argument("--server-core", type=int, default=1)
    p.add_argument("--quiet-wait", type=float, default=0)
    p.add_argument("--waited-log", help="append the seconds waited for quiet here")
    p.add_argument("--retry-noisy", type=int, default=0, help="1: a noisy window goes to --rejected and exits 3")
    p.add_argument("--rejected", default="/dev/null")
    p.add_argument("--header", action="append", default=[], help="extra request header for wrk (-H), repeatable")
    p.set_defaults(f=cmd_window)
    p = sp.add_parser("report"); p.add_argument("tsv"); p.set_defaults(f=cmd_report)
    p = sp.add_parser("idle")
    p.add_argument("--name", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--root", type=int, required=True)
    p.add_argument("--n", type=int, default=10000)
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--settle", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--client-core", type=int, default=0)
    p.add_argument("--json")
    p.set_defaults(f=cmd_idle)
    p = sp.add_parser("startup")
    p.add_argument("--name", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--timeout", type=float, default=10)
    p.add_argument("--server-core", type=int, default=1)
    p.add_argument("--client-core", type=int, default=0)
    p.add_argument("--log")
    p.add_argument("--json")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p.set_defaults(f=cmd_startup)
    p = sp.add_parser("startup-floor")
    p.add_argument("--name", required=True)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--server-core", type=int, default=1)
    p.add_argument("--client-core", type=int, default=0)
    p.add_argument("--log")
    p.add_argument("--json")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p.set_defaults(f=cmd_startup_floor)
    a = ap.parse_args()
    a.f(a)


if __name__ == "__main__":
    main()
