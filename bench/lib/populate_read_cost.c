/* bench/lib/populate_read_cost.c: what the binary's code pages cost at start-up, taken by
 * trapping page faults against made present by one MADV_POPULATE_READ (issue 15 item 5, the
 * figures core/main.c's prefault_code quotes). FILE's first PAGES pages (page cache warm) are
 * mapped as a program's text is (private, read + exec), 60 times each way: touched one byte
 * every STEP pages (one trapping fault each; the kernel's fault-around maps the 16 pages of a
 * 64 KiB block per fault), or populated with one madvise. Medians [10th..90th percentile].
 *   cc -O2 -o /tmp/populate_read_cost bench/lib/populate_read_cost.c
 *   /tmp/populate_read_cost build-release/khamsin 248 16
 * On the 2-core VM of 2026-12-02 (other builds running), three runs: 16 faults 174-320 us, the
 * same 248 pages populated 24-45 us; 58 pages: 4 faults 70 us, populated 21 us. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: populate_read_cost FILE PAGES STEP\n");
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    size_t len = (size_t)atol(argv[2]) * 4096, step = (size_t)atol(argv[3]) * 4096;
    if (fd < 0 || len == 0 || step == 0) {
        perror(argv[1]);
        return 1;
    }
    enum { ROUNDS = 60 };
    double touch[ROUNDS], populate[ROUNDS];
    volatile char sink = 0;
    for (int r = 0; r < ROUNDS; r++) {
        char *p = mmap(NULL, len, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
        double t0 = now_us();
        for (size_t o = 0; o < len; o += step)
            sink += p[o];
        touch[r] = now_us() - t0;
        munmap(p, len);
        p = mmap(NULL, len, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
        t0 = now_us();
        if (madvise(p, len, MADV_POPULATE_READ) != 0) {
            perror("madvise(MADV_POPULATE_READ)");
            return 1;
        }
        populate[r] = now_us() - t0;
        munmap(p, len);
    }
    qsort(touch, ROUNDS, sizeof touch[0], cmp);
    qsort(populate, ROUNDS, sizeof populate[0], cmp);
    printf("%zu pages: touched every %zu pages (%zu faults) %.1f us [%.1f..%.1f]; populated %.1f us "
           "[%.1f..%.1f]\n", len / 4096, step / 4096, (len + step - 1) / step, touch[ROUNDS / 2],
           touch[ROUNDS / 10], touch[ROUNDS * 9 / 10], populate[ROUNDS / 2], populate[ROUNDS / 10],
           populate[ROUNDS * 9 / 10]);
    return 0;
}
