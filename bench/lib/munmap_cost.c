/* bench/lib/munmap_cost.c: what ld.so's unmapping of /etc/ld.so.cache costs on this machine
 * (issue 15 item 5; the figure CMakeLists.txt's KH_LIBC_RUNPATH quotes). Every dynamically
 * linked program whose libraries ld.so looks up in the cache maps it, reads a page or two and
 * unmaps it before main. 50 times: mmap of the cache, two pages read, munmap; then for
 * comparison mprotect (as for RELRO) and munmap of 7 present anonymous pages.
 *   cc -O2 -o /tmp/munmap_cost bench/lib/munmap_cost.c && /tmp/munmap_cost
 * On the 2-core VM of 2026-12-02: the cache's munmap 250-350 us, mprotect of 7 pages 24-59 us,
 * munmap of 7 anonymous pages 23-97 us (a getppid: 2-6 us). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(void)
{
    int fd = open("/etc/ld.so.cache", O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < 8192) {
        perror("/etc/ld.so.cache");
        return 1;
    }
    size_t len = (size_t)st.st_size;
    const int rounds = 50;
    double map = 0, unmap = 0, prot = 0, unmap_anon = 0;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_us();
        volatile char *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        map += now_us() - t0;
        char c = p[0];
        c += p[len - 4096];
        (void)c;
        t0 = now_us();
        munmap((void *)p, len);
        unmap += now_us() - t0;
        char *q = mmap(NULL, 7 * 4096, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        t0 = now_us();
        mprotect(q, 7 * 4096, PROT_READ);
        prot += now_us() - t0;
        t0 = now_us();
        munmap(q, 7 * 4096);
        unmap_anon += now_us() - t0;
    }
    printf("ld.so.cache (%zu bytes): mmap %.1f us, munmap %.1f us; 7 anonymous pages: mprotect "
           "%.1f us, munmap %.1f us (means of %d)\n",
           len, map / rounds, unmap / rounds, prot / rounds, unmap_anon / rounds, rounds);
    close(fd);
    return 0;
}
