#!/usr/bin/env python3
"""bench/lib/h3memtrace.py DUMP N: where an idle h3 connection's memory goes, per allocation
site of ngtcp2 / nghttp3 (bench/lib/h3-memtrace.patch writes DUMP: one line per live block,
"lib+offset size mapped resident_bytes"). Prints, per site and size, the blocks, the bytes
allocated and the bytes resident (pages in core for an mmap'd block, its size for a heap one),
divided by N (the idle connections held when the dump was taken); sites held by fewer than
N/2 blocks (the connection the dump was taken in, the process) are summed in the total only."""
import collections
import sys


def main():
    dump, n = sys.argv[1], int(sys.argv[2])
    agg = collections.defaultdict(lambda: [0, 0, 0])
    for line in open(dump):
        site, size, mapped, res = line.split()
        size, mapped, res = int(size), int(mapped), int(res)
        a = agg[(site, size, mapped)]
        a[0] += 1
        a[1] += size
        a[2] += res if mapped else size
    tot = [0, 0, 0]
    print(f"{'site':34s} {'size':>6s} {'where':5s} {'blocks':>7s} {'alloc B':>8s} {'resident B':>10s}  (per connection)")
    for k, v in sorted(agg.items(), key=lambda kv: (-kv[1][2], kv[0])):
        for i in range(3):
            tot[i] += v[i]
        if v[0] < n // 2:
            continue
        print(f"{k[0]:34s} {k[1]:6d} {'mmap' if k[2] else 'heap':5s} {v[0] / n:7.2f} {v[1] / n:8.0f} {v[2] / n:10.0f}")
    print(f"{'total':34s} {'':6s} {'':5s} {tot[0] / n:7.2f} {tot[1] / n:8.0f} {tot[2] / n:10.0f}")


if __name__ == "__main__":
    main()
