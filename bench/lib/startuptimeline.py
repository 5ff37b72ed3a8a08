#!/usr/bin/python3
"""bench/startup.sh's PARTS=timeline: where the wall clock goes from exec to the first answer,
phase by phase, from kernel tracepoints (an ftrace instance of its own, tracefs: root).

  startuptimeline.py --gate GATE [--runs 20] [--port P] NAME=CMD ...
      (PORT in CMD replaced; a case named 'true' exits by itself and is not polled)

Each run, per case (the cases alternate within a run): GATE (bench/lib/startup_gate.c, pinned
to the server core) waits on a pipe, the trace is set to follow its pid and every thread it
makes (set_event_pid, event-fork), then it execs CMD; a client thread on the client core
connects every 0.2 ms and sends GET / (as bench/lib/startupbench.py does). Traced: execve,
sched_process_exec/exit, every syscall's entry and exit, every user page fault, sched_switch,
sched_wakeup, task_newtask (each costs a little: the times are a few % above an untraced run).
Printed per case, medians over the runs: ms from the execve to each mark (exec: the new image
runs; main: the first rt_sigaction, i.e. main's signal(SIGPIPE); listen; thread: the first
clone3; loop: worker 0's first epoll_wait; accept; answer: the first write/sendto after it;
client: the client has the answer), and per phase the page faults and syscalls of the main
thread, the time it was off cpu (R: preempted, S: sleeping, D: waiting in the kernel) and the
time the process's other threads ran in it. On a busy box run it under `chrt -f 10` (RT=1 in
bench/startup.sh): other processes then do not preempt it.
"""
import argparse, collections, os, re, socket, statistics, subprocess, sys, threading, time

T = "/sys/kernel/tracing/instances/khamsin-startup"
REQ = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
SYS = {0: "read", 1: "write", 3: "close", 9: "mmap", 10: "mprotect", 11: "munmap", 12: "brk",
       13: "rt_sigaction", 14: "rt_sigprocmask", 20: "writev", 41: "socket", 49: "bind", 50: "listen",
       54: "setsockopt", 59: "execve", 202: "futex", 232: "epoll_wait", 281: "epoll_pwait", 288: "accept4",
       435: "clone3", 56: "clone", 231: "exit_group", 60: "exit", 257: "openat", 262: "newfstatat",
       44: "sendto", 45: "recvfrom", 46: "sendmsg", 233: "epoll_ctl", 291: "epoll_create1", 290: "eventfd2",
       293: "pipe2", 28: "madvise", 318: "getrandom", 16: "ioctl", 21: "access", 17: "pread64"}


def w(path, s):
    with open(os.path.join(T, path), "w") as f:
        f.write(s)


def setup():
    if not os.path.isdir(T):
        os.mkdir(T)
    w("tracing_on", "0")
    w("trace_clock", "mono")
    w("buffer_size_kb", "8192")
    w("options/event-fork", "1")
    for ev in ["sched/sched_process_exec", "sched/sched_process_exit", "sched/sched_switch",
               "sched/sched_wakeup", "task/task_newtask", "raw_syscalls/sys_enter", "raw_syscalls/sys_exit",
               "exceptions/page_fault_user"]:
        w("events/%s/enable" % ev, "1")


def teardown():
    try:
        w("tracing_on", "0")
        w("events/enable", "0")
        os.rmdir(T)
    except OSError as e:
        print("teardown:", e, file=sys.stderr)


def poke(port, out, stop):
    while not stop.is_set():
        s = socket.socket()
        try:
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            out["connected"] = time.monotonic()
            s.sendall(REQ)
            s.recv(4096)
            out["answered"] = time.monotonic()
            s.close()
            return
        except OSError:
            s.close()
            time.sleep(0.0002)


def one(a, name, cmd):
    w("trace", "")
    os.sched_setaffinity(0, {a.server_core})
    p = subprocess.Popen([a.gate] + cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, close_fds=True)
    os.sched_setaffinity(0, {a.client_core})
    w("set_event_pid", str(p.pid))
    w("tracing_on", "1")
    out = {}
    stop = threading.Event()
    th = None
    if name != "true":
        th = threading.Thread(target=poke, args=(a.port, out, stop))
        th.start()
    p.stdin.write(b"g")
    p.stdin.flush()
    if th:
        th.join(10)
        time.sleep(0.01)
    else:
        p.wait()
    if a.dump:  # the mappings, to place the faults' addresses
        with open(os.path.join(a.dump, "maps-%s.txt" % name), "w") as f:
            f.write(open("/proc/%d/maps" % p.pid).read() if p.poll() is None else "")
    w("tracing_on", "0")
    stop.set()
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    p.stdin.close()
    with open(os.path.join(T, "trace")) as f:
        txt = f.read()
    if a.dump:
        with open(os.path.join(a.dump, "trace-%s.txt" % name), "w") as f:
            f.write(txt)
    for _ in range(500):  # the port free again
        try:
            socket.create_connection(("127.0.0.1", a.port), timeout=0.2).close()
            time.sleep(0.01)
        except OSError:
            break
    return p.pid, out, txt


LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+):\s+(\w+):\s*(.*)$")


def analyse(pid, out, txt):
    evs = []
    for line in txt.splitlines():
        m = LINE.match(line)
        if m:
            evs.append((float(m.group(4)), int(m.group(2)), m.group(5), m.group(6)))
    tids = {pid}
    marks = {}
    t0 = None
    for t, tid, ev, info in evs:
        if ev == "task_newtask" and tid in tids:
            tids.add(int(re.search(r"pid=(\d+)", info).group(1)))
        if ev == "sys_enter":
            nr = int(re.search(r"NR (-?\d+)", info).group(1))
            n = SYS.get(nr, str(nr))
            if tid not in tids:
                continue
            if n == "execve" and t0 is None:
                t0 = t
            if t0 is None:
                continue
            if n == "rt_sigaction":
                marks.setdefault("main", t)
            if n == "clone3":
                marks.setdefault("thread", t)
            if n in ("epoll_wait", "epoll_pwait") and tid == pid:
                marks.setdefault("loop", t)
            if n in ("write", "writev", "sendmsg", "sendto") and "accept" in marks:
                marks.setdefault("answer", t)
        elif ev == "sys_exit" and tid in tids and t0 is not None:
            nr = int(re.search(r"NR (-?\d+)", info).group(1))
            n = SYS.get(nr, str(nr))
            if n == "listen":
                marks.setdefault("listen", t)
            if n == "accept4" and not re.search(r"= -", info):
                marks.setdefault("accept", t)
        elif ev == "sched_process_exec" and tid == pid:
            marks.setdefault("exec", t)
        elif ev == "sched_process_exit" and tid == pid and t0 is not None:
            marks.setdefault("exit", t)
    if "answered" in out:
        marks["client"] = out["answered"]
    if "connected" in out:
        marks["connected"] = out["connected"]
    rel = {k: (v - t0) * 1e3 for k, v in marks.items()}
    # phases on the ordered marks that exist
    order = ["exec", "main", "listen", "thread", "loop", "accept", "answer", "exit"]
    order = [k for k in order if k in marks]
    bounds = [("execve", t0)] + [(k, marks[k]) for k in order]
    phases = collections.OrderedDict()
    for i in range(1, len(bounds)):
        a0, a1 = bounds[i - 1][1], bounds[i][1]
        st = collections.Counter()
        offat = {}
        for t, tid, ev, info in evs:
            if t < a0 or t >= a1:
                continue
            if ev == "page_fault_user" and tid in tids:
                st["faults" if tid == pid else "faults.other"] += 1
            elif ev == "sys_enter" and tid in tids:
                st["sys" if tid == pid else "sys.other"] += 1
        # off-cpu of the main thread / on-cpu of the others, by sched_switch
        last_in = {}
        out_at = None
        state = None
        for t, tid, ev, info in evs:
            if ev != "sched_switch" or t < bounds[0][1]:
                continue
            m = re.search(r"prev_pid=(\d+) .*prev_state=(\S+) ==> .*next_pid=(\d+)", info)
            pp, ps, np_ = int(m.group(1)), m.group(2), int(m.group(3))
            if pp == pid:
                out_at, state = t, ps
            if np_ == pid and out_at is not None:
                x, y = max(out_at, a0), min(t, a1)
                if y > x:
                    st["off." + state[0]] += (y - x) * 1e3
                out_at = None
            if np_ in tids and np_ != pid:
                last_in[np_] = t
            if pp in last_in:
                x, y = max(last_in.pop(pp), a0), min(t, a1)
                if y > x:
                    st["otherthr"] += (y - x) * 1e3
        phases["%s->%s" % (bounds[i - 1][0], bounds[i][0])] = ((a1 - a0) * 1e3, st)
    return rel, phases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--port", type=int, default=23297)
    ap.add_argument("--server-core", type=int, default=1)
    ap.add_argument("--client-core", type=int, default=0)
    ap.add_argument("--gate", required=True, help="bench/lib/startup_gate.c, built")
    ap.add_argument("--dump", help="a directory: the last run's trace and maps of each case")
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    cases = []
    for c in a.cases:
        name, cmd = c.split("=", 1)
        cases.append((name, cmd.replace("PORT", str(a.port)).split()))
    setup()
    res = collections.defaultdict(list)
    try:
        for r in range(a.runs):
            for name, cmd in cases:
                pid, out, txt = one(a, name, cmd)
                res[name].append(analyse(pid, out, txt))
    finally:
        teardown()
    for name, _ in cases:
        rs = res[name]
        print("%s (median of %d)" % (name, len(rs)))
        keys = []
        for rel, _ in rs:
            for k in rel:
                if k not in keys:
                    keys.append(k)
        keys.sort(key=lambda k: statistics.median(r[0][k] for r in rs if k in r[0]))
        print("  marks (ms after execve): " + "  ".join(
            "%s %.3f" % (k, statistics.median(r[0][k] for r in rs if k in r[0])) for k in keys))
        pn = []
        for _, ph in rs:
            for k in ph:
                if k not in pn:
                    pn.append(k)
        for k in pn:
            xs = [ph[k] for _, ph in rs if k in ph]
            med = lambda f: statistics.median([f(x) for x in xs])
            print("  %-16s %7.3f ms  faults %5.1f sys %5.1f | off-cpu R %.3f S %.3f D %.3f | other threads ran %.3f (faults %.0f sys %.0f)" % (
                k, med(lambda x: x[0]), med(lambda x: x[1]["faults"]), med(lambda x: x[1]["sys"]),
                med(lambda x: x[1]["off.R"]), med(lambda x: x[1]["off.S"]), med(lambda x: x[1]["off.D"]),
                med(lambda x: x[1]["otherthr"]), med(lambda x: x[1]["faults.other"]), med(lambda x: x[1]["sys.other"])))


if __name__ == "__main__":
    main()
