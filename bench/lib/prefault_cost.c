/* bench/lib/prefault_cost.c: what a page fault costs on this machine, against making the same
 * pages present with one MADV_POPULATE_WRITE (issue 15 item 5, the figures core/main.c's
 * prefault_main_thread quotes). For 8 to 64 fresh anonymous pages, 20 times each: the time to
 * populate them with one madvise, and the time to touch them one by one (one trapping fault
 * per page); then a read of the zero page (a fault that allocates nothing) for comparison.
 *   cc -O2 -o /tmp/prefault_cost bench/lib/prefault_cost.c && /tmp/prefault_cost
 * On the 2-core VM of 2026-12-02: populate 0.5-3 us a page, touch 11-30 us a page (the zero-page
 * read too: the trap is the cost, not the zeroing). */
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(void)
{
    const int rounds = 20;
    for (int n = 8; n <= 64; n *= 2) {
        size_t len = (size_t)n * 4096;
        double populate = 0, touch = 0, zero = 0;
        for (int r = 0; r < rounds; r++) {
            char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            double t0 = now_us();
            if (madvise(p, len, MADV_POPULATE_WRITE) != 0) {
                perror("madvise(MADV_POPULATE_WRITE)");
                return 1;
            }
            populate += now_us() - t0;
            munmap(p, len);
            p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            t0 = now_us();
            for (int i = 0; i < n; i++)
                p[(size_t)i * 4096] = 1;
            touch += now_us() - t0;
            munmap(p, len);
            volatile char *q = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            char s = 0;
            t0 = now_us();
            for (int i = 0; i < n; i++)
                s += q[(size_t)i * 4096];
            zero += now_us() - t0;
            (void)s;
            munmap((void *)q, len);
        }
        printf("%2d pages: populate %5.2f us/page, touch (write fault) %5.2f us/page, read of the "
               "zero page %5.2f us/page\n",
               n, populate / rounds / n, touch / rounds / n, zero / rounds / n);
    }
    return 0;
}
