#!/usr/bin/python3
"""bench/startup.sh PARTS=steps: the wall time of each step of worker 0's Lua state load.

  startupsteps.py --runs N --port P [--server-core 1 --client-core 0] -- CMD...

CMD is a khamsin built with -DKH_STARTUP_STEPS=ON (lua/kh_lua_state.c writes
"startup-step NAME MS" on stderr for each step of worker_init); PORT in it is replaced. Each run
starts it, polls GET / exactly as startupbench.py does, stops it, and reads the steps it wrote.
Prints per step the median [min..max] over the runs, their sum, and the median exec -> answer
of the same runs (the steps' own clock reads and writes are in it: a few us).
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import startupbench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    startupbench.run_options(ap)
    ap.add_argument("cmd", nargs="+")
    a = ap.parse_args()
    a.log = "the server's stderr"
    cmd = [w.replace("PORT", str(a.port)) for w in a.cmd]
    steps, order, answers = {}, [], []
    for _ in range(a.runs):
        with tempfile.TemporaryFile("w+") as log:
            answers.append(startupbench.run_case(a, cmd, False, log))
            log.seek(0)
            seen = 0
            for line in log:
                w = line.split()
                if len(w) == 3 and w[0] == "startup-step":
                    if w[1] not in steps:
                        steps[w[1]] = []
                        order.append(w[1])
                    steps[w[1]].append(float(w[2]))
                    seen += 1
            if seen == 0:
                sys.exit("startupsteps.py: no startup-step lines: is %s built with -DKH_STARTUP_STEPS=ON?" % cmd[0])
    total = 0.0
    print("  %-28s %8s  %s" % ("step (worker 0's state)", "ms", "[min..max] over %d runs" % a.runs))
    for name in order:
        xs = steps[name]
        m = statistics.median(xs)
        total += m
        print("  %-28s %8.3f  [%.3f..%.3f]" % (name, m, min(xs), max(xs)))
    print("  %-28s %8.3f  (sum of the medians)" % ("all steps", total))
    print("  %-28s %8.3f  [%.3f..%.3f] (the same runs)" % ("exec -> answer", statistics.median(answers), min(answers), max(answers)))


if __name__ == "__main__":
    main()
