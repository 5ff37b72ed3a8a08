#!/usr/bin/python3
"""The noisy-box method every bench/ script shares (stdlib only; run with /usr/bin/python3).

bench/lib/common.sh wraps it (bench_round_begin / bench_round_end / bench_summary); see
bench/README.md "Method". In short:
  - servers alternate within each round (A B A B ...), >= 5 rounds (BENCH_ROUNDS or the
    script's ROUNDS);
  - a round is DISCARDED (and the script says so, and redoes it, up to BENCH_MAX_REDO extra
    rounds) when the box was disturbed while it ran: CPU time used by *other* processes above
    BENCH_MAX_FOREIGN (default 0.10 = 10% of the box's CPU time over the round), or hypervisor
    steal above BENCH_MAX_STEAL (default 0.05, from /proc/stat). "Other" = every user process
    that is not the bench itself (the process tree under BENCH_ROOT_PID: bench/all.sh, or the
    script; common.sh exports it): the bench's own servers and clients are never disturbance,
    however many there are (the 1-minute load average counted them: 4 s_time clients alone
    raised it above cores + 1). Per process, utime+stime+cutime+cstime (/proc/<pid>/stat), so a
    foreign `make` is charged for the compilers it reaped during the round; a process started
    during the round counts whole; kernel threads (softirq work for our own loopback traffic)
    are shown but not counted. The load average is printed for information; BENCH_MAX_LOAD
    (unset by default) adds the old check on the load average at the round's start;
  - each figure is the median over the kept rounds with its spread (min..max, and the IQR from
    4 rounds on); the ratio to the anchor (nginx + lua) is computed per round (paired: the two
    servers ran back to back in the same round) and reported as the median of those per-round
    ratios, their min..max, and a 95% bootstrap interval of the ratio of medians (rounds
    resampled with replacement, 2000 draws, fixed seed);
  - if no round is clean, all rounds are used and the figure is flagged ALL-DISTURBED.

Subcommands:
  snap FILE                         record loadavg + /proc/stat (start of a round)
  verdict FILE --round R --log F    compare with now; exit 0 = clean, 3 = disturbed (appended to F)
  summary ROWS --metric K ...       table of medians, spreads and ratios from a JSONL of rows
                                    {"round": r, "server": s, <group field>: g, K: value}
  cpu-model                         the CPU model line for result files
  rule                              the discard rule in words, with the thresholds in force
  pidcpu PID...                     utime+stime seconds of the processes (and their threads)
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def ncpu():
    return os.cpu_count() or 1


def max_load():
    """None unless BENCH_MAX_LOAD is set: the load average counts the bench's own clients."""
    v = os.environ.get("BENCH_MAX_LOAD")
    return float(v) if v else None


def max_foreign():
    return float(os.environ.get("BENCH_MAX_FOREIGN", "0.10"))


def max_steal():
    return float(os.environ.get("BENCH_MAX_STEAL", "0.05"))


def loadavg1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def stat_all():
    """(total ticks, steal ticks) of the aggregate 'cpu' line of /proc/stat."""
    with open("/proc/stat") as f:
        v = f.readline().split()
    n = [int(x) for x in v[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
    return sum(n[:8]), n[7]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + f", {ncpu()} cores"
    except OSError:
        pass
    return f"unknown CPU, {ncpu()} cores"


def pid_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    fl = data[data.rindex(b")") + 2:].split()
    return (int(fl[11]) + int(fl[12])) / CLK_TCK


# ------------------------------------------------------------- rounds ----

PF_KTHREAD = 0x00200000


def procs():
    """{pid: (ppid, starttime, cpu ticks incl. reaped children, is kernel thread, comm)}"""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        i = data.rindex(b")")
        fl = data[i + 2:].split()
        comm = data[data.index(b"(") + 1:i].decode(errors="replace")
        out[int(d)] = (int(fl[1]), int(fl[19]), sum(int(x) for x in fl[11:15]),
                       bool(int(fl[6]) & PF_KTHREAD), comm)
    return out


def own_tree(ps, root):
    kids = {}
    for pid, v in ps.items():
        kids.setdefault(v[0], []).append(pid)
    seen, todo = set(), [root]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(kids.get(p, ()))
    return seen


def bench_root():
    v = os.environ.get("BENCH_ROOT_PID")
    return int(v) if v and v.isdigit() else os.getppid()


def foreign_procs(ps, root, own_before=()):
    """{"pid:start": [ticks, comm, ppid]} of user processes outside the bench's tree (processes of
    the tree at the round's start, own_before, stay ours when orphaned), and the kernel threads'
    ticks. ticks = utime+stime+cutime+cstime, except for init (pid 1): it reaps orphans, the bench's
    own among them (an nginx worker whose master was killed first)."""
    own = own_tree(ps, root)
    user, kern = {}, 0
    for pid, (ppid, start, ticks, kthread, comm) in ps.items():
        key = f"{pid}:{start}"
        if pid in own or key in own_before:
            continue
        if kthread:
            kern += ticks
            continue
        if pid == 1:
            ticks = pid_cpu_seconds(1) * CLK_TCK
        user[key] = [ticks, comm, ppid]
    return user, kern, own


def cmd_snap(a):
    tot, st = stat_all()
    root = bench_root()
    ps = procs()
    user, kern, own = foreign_procs(ps, root)
    own_keys = [f"{p}:{ps[p][1]}" for p in own if p in ps]
    with open(a.file, "w") as f:
        json.dump(dict(t=time.time(), load=loadavg1(), total=tot, steal=st, root=root, foreign=user,
                       own=own_keys, kthreads=kern), f)


def foreign_delta(before, now):
    """CPU ticks used by foreign processes between two foreign_procs() maps, by command name.
    A process's ticks include its reaped children's (cutime), so the total is the change of the
    sum, except for a process gone since the start whose ticks went to an ancestor that is not
    alive any more, or to init (not counted): those are not subtracted."""
    alive_pid = {int(k.split(":")[0]): k for k in now}
    per = {}
    for k, (t, comm, _) in now.items():
        d = t - before.get(k, (0,))[0]
        per[comm] = per.get(comm, 0) + d
    for k, (t, comm, ppid) in before.items():
        if k in now:
            continue
        anc, hops = ppid, 0
        while anc not in (0, 1) and hops < 64:   # the nearest ancestor still alive reaped it
            ka = alive_pid.get(anc)
            if ka is not None:
                per[now[ka][1]] = per.get(now[ka][1], 0) - t
                break
            pk = next((x for x in before if x.startswith(f"{anc}:")), None)
            if pk is None:
                break
            anc, hops = before[pk][2], hops + 1
    return per


def cmd_verdict(a):
    with open(a.file) as f:
        s0 = json.load(f)
    tot, st = stat_all()
    load_end = loadavg1()
    secs = max(0.001, time.time() - s0["t"])
    steal = (st - s0["steal"]) / max(1, tot - s0["total"])
    user, kern, _ = foreign_procs(procs(), s0.get("root", bench_root()), set(s0.get("own", ())))
    per = foreign_delta(s0.get("foreign", {}), user)
    box = CLK_TCK * secs * ncpu()
    foreign = max(0.0, sum(per.values())) / box
    kthreads = max(0, kern - s0.get("kthreads", 0)) / box
    top = ", ".join(f"{c} {100 * t / box:.1f}%" for c, t in sorted(per.items(), key=lambda x: -x[1])[:3] if t > 0)
    why = []
    if foreign > max_foreign():
        why.append(f"other processes used {100 * foreign:.1f}% of the box > {100 * max_foreign():.0f}% ({top})")
    if steal > max_steal():
        why.append(f"steal {100 * steal:.1f}% > {100 * max_steal():.1f}%")
    if max_load() is not None and s0["load"] > max_load():
        why.append(f"load average at start {s0['load']:.2f} > {max_load():.2f}")
    rec = dict(round=a.round, load_start=s0["load"], load_end=load_end, steal=round(steal, 4),
               foreign=round(foreign, 4), foreign_top=top, kthreads=round(kthreads, 4),
               secs=round(secs, 1), discarded=bool(why), why="; ".join(why))
    if a.log:
        with open(a.log, "a") as f:
            f.write(json.dumps(rec) + "\n")
    if why:
        print(f"  round {a.round} DISCARDED ({rec['secs']:.0f} s): disturbed ({rec['why']}; BENCH_MAX_FOREIGN / BENCH_MAX_STEAL set the thresholds)", flush=True)
        sys.exit(3)
    print(f"  round {a.round} kept ({rec['secs']:.0f} s; other processes {100 * foreign:.1f}% of the box"
          f"{' (' + top + ')' if top else ''}, kernel threads {100 * kthreads:.1f}%, steal {100 * steal:.1f}%;"
          f" load {s0['load']:.2f} -> {load_end:.2f})", flush=True)


def method_rule():
    r = f"other processes (not the bench's own tree) used > {100 * max_foreign():.0f}% of the box's CPU or steal > {max_steal()}"
    if max_load() is not None:
        r += f" or load average at the round's start > {max_load()}"
    return r


# ------------------------------------------------------------ summary ----

def spread(xs):
    xs = sorted(xs)
    out = dict(n=len(xs), med=statistics.median(xs), lo=xs[0], hi=xs[-1])
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4)
        out["q1"], out["q3"] = q[0], q[2]
    return out


def bootstrap_ratio(pairs, draws=2000, seed=1):
    """95% interval of median(subject)/median(anchor), rounds (pairs) resampled together."""
    if len(pairs) < 3:
        return None
    rng = random.Random(seed)
    rs = []
    for _ in range(draws):
        smp = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        b = statistics.median(p[1] for p in smp)
        if b:
            rs.append(statistics.median(p[0] for p in smp) / b)
    rs.sort()
    return rs[int(0.025 * len(rs))], rs[min(len(rs) - 1, int(0.975 * len(rs)))]


def fmt(v):
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def cell(s):
    txt = f"{fmt(s['med'])} [{fmt(s['lo'])}..{fmt(s['hi'])}]"
    if "q1" in s:
        txt += f" IQR {fmt(s['q1'])}..{fmt(s['q3'])}"
    return txt


def cmd_summary(a):
    rows = [json.loads(l) for l in open(a.rows) if l.strip()]
    disc = set()
    if a.discarded and os.path.exists(a.discarded):
        for l in open(a.discarded):
            if l.strip():
                d = json.loads(l)
                if d.get("discarded"):
                    disc.add(d["round"])
    all_rounds = sorted(set(r["round"] for r in rows))
    kept = [r for r in rows if r["round"] not in disc]
    flag = ""
    if not kept:
        kept, flag = rows, "ALL-DISTURBED"
    nk = len(set(r["round"] for r in kept))
    print(f"Summary over {nk} kept round(s) of {len(all_rounds)}"
          + (f" (discarded as disturbed: {', '.join(str(x) for x in sorted(disc))})" if disc else "")
          + (" -- every round was disturbed: all are used, figures flagged ALL-DISTURBED" if flag else ""))
    groups = list(dict.fromkeys(r.get(a.group, "") for r in kept)) if a.group else [""]
    servers = list(dict.fromkeys(r["server"] for r in kept))
    md = []
    for metric in a.metric:
        better = "lower" if metric in a.lower else "higher"
        for g in groups:
            gr = [r for r in kept if (not a.group or r.get(a.group, "") == g) and r.get(metric) is not None]
            if not gr:
                continue
            case = f"{a.group}={g}" if a.group else ""
            print(f"  {metric}{' ' + case if case else ''} ({better} is better): median [min..max] over rounds")
            per = {}
            for s in servers:
                xs = [r[metric] for r in gr if r["server"] == s]
                if xs:
                    per[s] = spread(xs)
                    print(f"    {s:<16} n={per[s]['n']}  {cell(per[s])}")
            ratio_txt = "-"
            if a.subject in per and a.anchor in per:
                by = {}
                for r in gr:
                    if r["server"] in (a.subject, a.anchor):
                        by.setdefault(r["round"], {})[r["server"]] = r[metric]
                pairs = [(v[a.subject], v[a.anchor]) for v in by.values() if a.subject in v and a.anchor in v and v[a.anchor]]
                if pairs:
                    rat = [x / y for x, y in pairs]
                    rs = spread(rat)
                    ci = bootstrap_ratio(pairs)
                    ratio_txt = (f"x{rs['med']:.2f} [{rs['lo']:.2f}..{rs['hi']:.2f}]"
                                 + (f" CI95 {ci[0]:.2f}..{ci[1]:.2f}" if ci else ""))
                    print(f"    ratio {a.subject}/{a.anchor}: per-round median {ratio_txt} (n={len(pairs)} paired rounds; "
                          f"{'>1' if better == 'higher' else '<1'} = {a.subject} better)")
            md.append("| " + " | ".join([
                a.label or "-", case or "-", metric + ("" if better == "higher" else " (lower better)"),
                cell(per[a.subject]) if a.subject in per else "-",
                cell(per[a.anchor]) if a.anchor in per else "-",
                ratio_txt, f"{nk}/{len(all_rounds)}" + (f" {flag}" if flag else "")]) + " |")
    out = a.summary or os.environ.get("BENCH_SUMMARY")
    if out and md:
        with open(out, "a") as f:
            f.write("\n".join(md) + "\n")


# ------------------------------------------------- the same, for Python drivers ----

class Rounds:
    """The round loop of common.sh for a Python driver:

        rounds = method.Rounds(tmpdir)          # ROUNDS / BENCH_ROUNDS wanted, BENCH_MAX_REDO extra
        for r in rounds:                         # r counts every round run, kept or not
            ... every server once, A B A B (flip the order on odd r), rows tagged "round": r ...
        method.summarize(rows, rounds, metric=["req_per_cpu"], group="case", label="...")
    A round whose verdict is 'disturbed' is said, logged and redone (common.sh's rules)."""

    def __init__(self, tmpdir, want=None):
        self.want = int(want or os.environ.get("ROUNDS") or os.environ.get("BENCH_ROUNDS") or 5)
        v = os.environ.get("BENCH_MAX_REDO")
        self.max_redo = int(v) if v not in (None, "") else self.want
        self.snapfile = os.path.join(tmpdir, "round.snap")
        self.log = os.path.join(tmpdir, "discarded.jsonl")
        open(self.log, "w").close()
        self.round = 0
        self.kept = 0

    def __iter__(self):
        while self.kept < self.want and self.round < self.want + self.max_redo:
            self.round += 1
            cmd_snap(argparse.Namespace(file=self.snapfile))
            yield self.round
            try:
                cmd_verdict(argparse.Namespace(file=self.snapfile, round=self.round, log=self.log))
                self.kept += 1
            except SystemExit as e:
                if e.code != 3:
                    raise
                if self.round >= self.want + self.max_redo and self.kept < self.want:
                    print(f"  (redo budget spent: {self.kept} clean round(s) of {self.want} wanted)", flush=True)

    def line(self):
        return (f"method:   rounds wanted {self.want} (servers alternate within each round), a round is discarded "
                f"and redone (<= {self.max_redo} extra) if {method_rule()}; "
                f"medians [min..max], ratio = per-round paired ratios + bootstrap CI95; "
                f"loadavg now {open('/proc/loadavg').read().split()[0]}")


def summarize(rows, rounds, metric, lower=(), group="", subject="khamsin", anchor="nginx-lua", label="",
              summary=None):
    """cmd_summary over a list of row dicts (see `summary` above)."""
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        path = f.name
    try:
        cmd_summary(argparse.Namespace(rows=path, metric=list(metric), lower=list(lower), group=group,
                                       subject=subject, anchor=anchor, discarded=rounds.log if rounds else None,
                                       label=label, summary=summary))
    finally:
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser()
    sp = ap.add_subparsers(dest="cmd", required=True)
    p = sp.add_parser("snap"); p.add_argument("file"); p.set_defaults(f=cmd_snap)
    p = sp.add_parser("verdict"); p.add_argument("file"); p.add_argument("--round", type=int, required=True)
    p.add_argument("--log"); p.set_defaults(f=cmd_verdict)
    p = sp.add_parser("summary"); p.add_argument("rows")
    p.add_argument("--metric", action="append", required=True)
    p.add_argument("--lower", action="append", default=[], help="metrics where lower is better (p99)")
    p.add_argument("--group", default="")
    p.add_argument("--subject", default="khamsin")
    p.add_argument("--anchor", default="nginx-lua")
    p.add_argument("--discarded")
    p.add_argument("--label", default="")
    p.add_argument("--summary", help="append markdown rows here (default $BENCH_SUMMARY)")
    p.set_defaults(f=cmd_summary)
    p = sp.add_parser("cpu-model"); p.set_defaults(f=lambda a: print(cpu_model()))
    p = sp.add_parser("rule"); p.set_defaults(f=lambda a: print(method_rule()))
    p = sp.add_parser("pidcpu"); p.add_argument("pids", type=int, nargs="+")
    p.set_defaults(f=lambda a: print(f"{sum(pid_cpu_seconds(x) for x in a.pids):.3f}"))
    a = ap.parse_args()
    a.f(a)


if __name__ == "__main__":
    main()
