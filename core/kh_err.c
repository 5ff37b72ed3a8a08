/* kh_err.c: text for KH_E* codes; everything else is handed to libuv's uv_strerror. */
#include "kh_err.h"
#include "kh_common.h"

#include <stdio.h>
#include <uv.h>

const char *kh_strerror(int err)
{
    switch (err) {
    case KH_EAGAIN:
        return "need more input";
    case KH_EPROTO:
        return "protocol error";
    case KH_ELIMIT:
        return "limit exceeded";
    case KH_ENOMEM:
        return "out of memory";
    case KH_ECLOSED:
        return "closed";
    case KH_EFULL:
        return "queue full";
    case KH_ETIMEDOUT:
        return "timed out";
    case KH_EINVAL:
        return "invalid argument";
    default:
        return uv_strerror(err);
    }
}

void *kh_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (KH_UNLIKELY(p == NULL)) {
        fputs("khamsin: out of memory\n", stderr);
        abort();
    }
    return p;
}

void *kh_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (KH_UNLIKELY(p == NULL)) {
        fputs("khamsin: out of memory\n", stderr);
        abort();
    }
    return p;
}

void *kh_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (KH_UNLIKELY(q == NULL)) {
        fputs("khamsin: out of memory\n", stderr);
        abort();
    }
    return q;
}

char *kh_xstrndup(const char *s, size_t n)
{
    char *p = kh_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}
