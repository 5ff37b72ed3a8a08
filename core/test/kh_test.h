/* kh_test.h: TAP output for C unit tests, in the spirit of libuv's TEST_IMPL counters.
 * Owns:  the per-process test counters (a test binary is single-threaded).
 * Out:   "ok N - name" / "not ok N - name" lines, a plan at the end, and the exit code via kh_test_done(). */
#ifndef KH_TEST_H
#define KH_TEST_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int kh_test_n, kh_test_failed;

static inline int kh_ok_at(int cond, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    kh_test_n++;
    printf("%s %d - ", cond ? "ok" : "not ok", kh_test_n);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!cond) {
        kh_test_failed++;
        printf("#   failed at %s:%d\n", file, line);
    }
    return cond;
}

#define kh_ok(cond, ...) kh_ok_at(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

#define kh_is_int(got, want, ...)                                                                  \
    do {                                                                                           \
        long long g_ = (long long)(got), w_ = (long long)(want);                                   \
        if (!kh_ok_at(g_ == w_, __FILE__, __LINE__, __VA_ARGS__))                                  \
            printf("#   got %lld, want %lld\n", g_, w_);                                           \
    } while (0)

#define kh_is_str(got_ptr, got_len, want, ...)                                                     \
    do {                                                                                           \
        const char *w_ = (want);                                                                   \
        size_t gl_ = (size_t)(got_len);                                                            \
        int same_ = (got_ptr) != NULL && strlen(w_) == gl_ && memcmp((got_ptr), w_, gl_) == 0;     \
        if (!kh_ok_at(same_, __FILE__, __LINE__, __VA_ARGS__))                                     \
            printf("#   got '%.*s', want '%s'\n", (got_ptr) ? (int)gl_ : 6,                        \
                   (got_ptr) ? (const char *)(got_ptr) : "(null)", w_);                           \
    } while (0)

#define kh_subtest(name) printf("# %s\n", (name))

static inline int kh_test_done(void)
{
    printf("1..%d\n", kh_test_n);
    if (kh_test_failed)
        printf("# %d of %d failed\n", kh_test_failed, kh_test_n);
    return kh_test_failed ? 1 : 0;
}

/* pico's guard page: copy len bytes so that they end exactly where a PROT_NONE page begins,
 * so a one-byte over-read faults even without ASan. Free with kh_test_guarded_free(). */
static inline char *kh_test_guarded_copy(const void *src, size_t len, void **base_out, size_t *map_len_out)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t data_pages = (len + page - 1) / page;
    if (data_pages == 0)
        data_pages = 1;
    size_t map_len = (data_pages + 1) * page;
    char *base = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        abort();
    if (mprotect(base + data_pages * page, page, PROT_NONE) != 0)
        abort();
    char *p = base + data_pages * page - len;
    memcpy(p, src, len);
    *base_out = base;
    *map_len_out = map_len;
    return p;
}

static inline void kh_test_guarded_free(void *base, size_t map_len)
{
    munmap(base, map_len);
}

#endif
