"""bench/split.sh PARTS=tail: reads `perf script -F tid,time,event,trace` of one server under load
(sys_exit_epoll_wait / sys_enter_epoll_wait, sched:sched_switch, and for khamsin uprobes on
lj_gc_step / lj_gc_step_jit and their returns) on stdin, and prints, for the busiest thread:
the time from an epoll_wait's return to the next call (one batch of ready events served: what a
request that became ready just after the return waits for at most, beside the kernel's own work),
the events per batch, and the duration of each GC step. An interval during which the thread was
switched out (a sched_switch with it as prev: another task took the core) is left out and
counted, since it measures the box, not the server."""
import collections
import sys


def pct(v, p):
    return v[min(len(v) - 1, int(len(v) * p))]


def main():
    rows = []
    for line in sys.stdin:
        f = line.split(None, 3)
        if len(f) < 3:
            continue
        rows.append((f[0], float(f[1].rstrip(":")), f[2].rstrip(":"), f[3] if len(f) > 3 else ""))
    calls = collections.Counter(r[0] for r in rows if r[2].endswith("sys_exit_epoll_wait"))
    if not calls:
        print("  no epoll_wait seen")
        return
    tid = calls.most_common(1)[0][0]
    batch, events, gc = [], [], collections.defaultdict(list)
    dropped = collections.Counter()
    t_exit = None
    open_gc = {}
    switched = False  # the thread was switched out since the interval began
    for t_id, t, ev, trace in rows:
        if ev == "sched:sched_switch":
            if ("prev_pid=%s " % tid) in trace:
                switched = True
                for k in open_gc:
                    open_gc[k] = None
            continue
        if t_id != tid:
            continue
        if ev.endswith("sys_exit_epoll_wait"):
            t_exit, switched = t, False
            v = int(trace.split()[-1], 16) if trace.strip() else 0
            if v < 1 << 63:
                events.append(v)
        elif ev.endswith("sys_enter_epoll_wait"):
            if t_exit is not None:
                if switched:
                    dropped["batch"] += 1
                else:
                    batch.append(t - t_exit)
            t_exit = None
        elif ev.startswith("probe_"):
            name = ev.split(":")[1]
            if name.endswith("__return"):
                base = name[: -len("__return")]
                t0 = open_gc.pop(base, None)
                if t0 is None:
                    dropped[base] += 1
                else:
                    gc[base].append(t - t0)
            else:
                open_gc[name] = t
    def show(label, v, scale=1e6, unit="us"):
        if not v:
            print("  %-34s none" % label)
            return
        v.sort()
        print("  %-34s n=%-7d median %8.1f  p90 %8.1f  p99 %8.1f  p99.9 %8.1f  max %8.1f %s" % (
            label, len(v), pct(v, 0.5) * scale, pct(v, 0.9) * scale, pct(v, 0.99) * scale,
            pct(v, 0.999) * scale, v[-1] * scale, unit))
    show("batch (epoll_wait return -> call)", batch)
    show("events per epoll_wait", [float(x) for x in events], 1, "events")
    for k in sorted(gc):
        show(k + " (incl. probe cost)", gc[k])
    if dropped:
        print("  left out (thread switched out meanwhile): " + ", ".join("%s %d" % kv for kv in sorted(dropped.items())))


main()
