/* kh_common.h: small shared vocabulary for every core file.
 * Owns:  nothing.
 * In:    -
 * Out:   kh_str slices, branch hints, container/array macros, unaligned loads, kh_xmalloc.
 * Never: allocates behind the caller's back (kh_xmalloc aborts on failure, by design). */
#ifndef KH_COMMON_H
#define KH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KH_LIKELY(x) __builtin_expect(!!(x), 1)
#define KH_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define KH_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define KH_CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#define KH_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KH_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KH_UNUSED(x) ((void)(x))
#define KH_EXPORT __attribute__((visibility("default")))

/* A borrowed byte range. Who owns the bytes is said by whoever hands the slice out. */
typedef struct kh_str {
    const char *ptr;
    size_t len;
} kh_str;

#define KH_STR_LIT(s) ((kh_str){(s), sizeof(s) - 1})

static inline int kh_str_eq(kh_str a, const char *b, size_t blen)
{
    return a.len == blen && (blen == 0 || memcmp(a.ptr, b, blen) == 0);
}

/* 8 and 4 bytes at p, unaligned, in the machine's order (one load once compiled): the word-at-a-
 * time scans of kh_h1_parse.c and kh_h2_fields.c. */
static inline uint64_t kh_load_u64(const void *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t kh_load_u32(const void *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* v in decimal at o, no NUL; returns the end. Without printf: every response head writes a
 * status and a length (bench/callgrind.sh: snprintf was ~1,100 of ~8,000 instructions per h1
 * hello request, ~1,500 per h3 one). o needs room for 20 digits. The length is counted first so
 * that the digits go straight to their place, two at a time from a table of 00..99: a digit at a
 * time through a reversed copy cost ~250 instructions per h1 hello request (status, length and
 * the request id's two numbers); this took it from 5,701 to 5,577 (REQUESTS=20000 CONNS=64
 * bench/callgrind.sh). */
static inline char *kh_put_u64(char *o, uint64_t v)
{
    static const char pairs[201] = "00010203040506070809101112131415161718192021222324"
                                   "25262728293031323334353637383940414243444546474849"
                                   "50515253545556575859606162636465666768697071727374"
                                   "75767778798081828384858687888990919293949596979899";
    static const uint64_t pow10[20] = {1u, 10u, 100u, 1000u, 10000u, 100000u, 1000000u,
        10000000u, 100000000u, 1000000000u, 10000000000u, 100000000000u, 1000000000000u,
        10000000000000u, 100000000000000u, 1000000000000000u, 10000000000000000u,
        100000000000000000u, 1000000000000000000u, 10000000000000000000u};
    size_t n = 1;
    while (n < 20 && v >= pow10[n])
        n++;
    char *end = o + n, *p = end;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        p -= 2;
        p[0] = pairs[2 * r];
        p[1] = pairs[2 * r + 1];
    }
    if (v >= 10) {
        p[-2] = pairs[2 * v];
        p[-1] = pairs[2 * v + 1];
    } else {
        p[-1] = (char)('0' + v);
    }
    return end;
}

/* Case-insensitive ASCII comparison; b must already be lower case. */
static inline int kh_str_ieq_lower(kh_str a, const char *b, size_t blen)
{
    if (a.len != blen)
        return 0;
    for (size_t i = 0; i < blen; i++) {
        unsigned char c = (unsigned char)a.ptr[i];
        if (c >= 'A' && c <= 'Z')
            c |= 0x20;
        if (c != (unsigned char)b[i])
            return 0;
    }
    return 1;
}

/* Small bookkeeping allocations abort on failure (h2o's h2o_mem_alloc): a peer cannot drive them. */
void *kh_xmalloc(size_t n);
void *kh_xcalloc(size_t n, size_t size);
void *kh_xrealloc(void *p, size_t n);
char *kh_xstrndup(const char *s, size_t n);

#endif
