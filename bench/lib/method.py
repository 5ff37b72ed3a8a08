#!/usr/bin/python3
"""The noisy-box method every bench/ script shares (stdlib only; run with /usr/bin/python3).

bench/lib/common.sh wraps it (bench_round_begin / bench_round_end / bench_summary); see
bench/README.md "Method". In short:
  - servers alternate within each round (A B A B ...), >= 5 rounds (BENCH_ROUNDS or the
    script's ROUNDS);
  - a round is DISCARDED (and the script says so, and redoes it, up to BENCH_MAX_REDO extra
    rounds) when the box was disturbed while it ran: the 1-minute load average at its start or
    end above BENCH_MAX_LOAD (default: cores + 1, i.e. more than the bench's own server and
    client plus one foreign runnable task), or hypervisor steal above BENCH_MAX_STEAL (default
    0.05 = 5% of the box's CPU time over the round, from /proc/stat);
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
    v = os.environ.get("BENCH_MAX_LOAD")
    return float(v) if v else ncpu() + 1.0


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

def cmd_snap(a):
    tot, st = stat_all()
    with open(a.file, "w") as f:
        json.dump(dict(t=time.time(), load=loadavg1(), total=tot, steal=st), f)


def cmd_verdict(a):
    with open(a.file) as f:
        s0 = json.load(f)
    tot, st = stat_all()
    load_end = loadavg1()
    steal = (st - s0["steal"]) / max(1, tot - s0["total"])
    load = max(s0["load"], load_end)
    why = []
    if load > max_load():
        why.append(f"load average {load:.2f} > {max_load():.2f}")
    if steal > max_steal():
        why.append(f"steal {100 * steal:.1f}% > {100 * max_steal():.1f}%")
    rec = dict(round=a.round, load_start=s0["load"], load_end=load_end, steal=round(steal, 4),
               secs=round(time.time() - s0["t"], 1), discarded=bool(why), why="; ".join(why))
    if a.log:
        with open(a.log, "a") as f:
            f.write(json.dumps(rec) + "\n")
    if why:
        print(f"  round {a.round} DISCARDED: disturbed ({rec['why']}; BENCH_MAX_LOAD / BENCH_MAX_STEAL set the thresholds)", flush=True)
        sys.exit(3)
    print(f"  round {a.round} kept (load {s0['load']:.2f} -> {load_end:.2f}, steal {100 * steal:.1f}%)", flush=True)


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
                f"and redone (<= {self.max_redo} extra) if load average > {max_load():.0f} or steal > {max_steal()}; "
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
    p = sp.add_parser("pidcpu"); p.add_argument("pids", type=int, nargs="+")
    p.set_defaults(f=lambda a: print(f"{sum(pid_cpu_seconds(x) for x in a.pids):.3f}"))
    a = ap.parse_args()
    a.f(a)


if __name__ == "__main__":
    main()
