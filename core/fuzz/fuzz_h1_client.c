/* fuzz_h1_client.c: libFuzzer target for the HTTP/1.1 response reader and request serializer.
 * Owns:  exact-size heap copies of the input (so ASan sees any read past len).
 * In:    data[0] = mode: bits 0-1 pick the limits (tiny, small, default, big), bit 2 = the request
 *        was HEAD, bit 3 = the peer closes after the input, bit 7 = serializer mode;
 *        data[1] picks the split point; data[2..] is the wire input.
 * Out:   a trap on any broken property:
 *        - the verdict (error code, or status + body + reusable + leftover) is the same whether
 *          the input arrives whole, in two pieces split at data[1], or byte by byte;
 *        - every DATA slice and every head slice lies inside the bytes given to that call; the
 *          consumed count never exceeds the input; the body never exceeds body_bytes;
 *        - a head has status 200..999 and at most header_fields fields;
 *        - serializer mode: the rest is split at NULs into method, target, host, name, value; the
 *          serializer either refuses (KH_H1C_EREQ) or writes a head that the request parser
 *          (kh_h1_parse_request) accepts with the same method and target and the given field
 *          plus Host (unless given) and Content-Length: 0 (POST/PUT/PATCH without a body).
 * Never: keeps state between inputs. */
#include "kh_err.h"
#include "kh_h1_client.h"
#include "kh_h1_parse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

static const kh_h1c_limits limits[4] = {
    {32, 2, 8},
    {256, 6, 300},
    {16384, 100, 8388608},
    {65536, 1000, UINT64_MAX},
};

#define MAXF 1000

typedef struct verdict {
    int err;
    int status;
    uint64_t body_len;
    uint64_t body_sum; /* cheap digest of the body bytes */
    int reusable;
    size_t leftover;
} verdict;

static int inside(kh_str s, const char *buf, size_t n)
{
    if (s.len == 0)
        return 1;
    return s.ptr >= buf && s.ptr + s.len <= buf + n;
}

/* Feeds in[0..len) starting with a first piece of `first` bytes, then `step` bytes at a time. */
static void run(const uint8_t *in, size_t len, size_t first, size_t step, unsigned mode, verdict *v)
{
    static kh_h1_field fields[MAXF];
    const kh_h1c_limits *lim = &limits[mode & 3];
    char *buf = malloc(len ? len : 1);
    size_t have = 0, fed = 0;
    kh_h1c r;
    memset(v, 0, sizeof(*v));
    kh_h1c_init(&r, lim, fields, (mode >> 2) & 1);
    int done = 0, start = 1;
    while (!done) {
        size_t piece = start ? first : step;
        start = 0;
        if (piece > len - fed)
            piece = len - fed;
        memcpy(buf + have, in + fed, piece);
        have += piece;
        fed += piece;
        for (;;) {
            int ev;
            kh_str d;
            /* an exact-size window so ASan catches a read past what was given */
            char *win = malloc(have ? have : 1);
            memcpy(win, buf, have);
            ssize_t n = kh_h1c_feed(&r, win, have, &ev, &d);
            if (n < 0) {
                free(win);
                v->err = (int)n;
                goto out;
            }
            CHECK((size_t)n <= have);
            if (ev == KH_H1C_HEAD) {
                CHECK(r.head.status >= 200 && r.head.status <= 999);
                CHECK(r.head.num_fields <= lim->header_fields);
                CHECK(inside(r.head.reason, win, have));
                for (size_t i = 0; i < r.head.num_fields; i++) {
                    CHECK(r.head.fields[i].name.len > 0);
                    CHECK(inside(r.head.fields[i].name, win, have));
                    CHECK(inside(r.head.fields[i].value, win, have));
                }
                v->status = r.head.status;
            } else if (ev == KH_H1C_DATA) {
                CHECK(d.len > 0 && inside(d, win, have));
                v->body_len += d.len;
                CHECK(v->body_len <= lim->body_bytes);
                for (size_t i = 0; i < d.len; i++)
                    v->body_sum = v->body_sum * 31 + (uint8_t)d.ptr[i];
            }
            free(win);
            memmove(buf, buf + n, have - (size_t)n);
            have -= (size_t)n;
            if (ev == KH_H1C_DONE) {
                done = 1;
                break;
            }
            if (ev == KH_H1C_NEED_MORE)
                break;
        }
        if (!done && fed == len) {
            if (!((mode >> 3) & 1)) {
                v->err = KH_EAGAIN; /* still waiting for bytes */
                goto out;
            }
            int e = kh_h1c_eof(&r);
            if (e != KH_H1C_DONE) {
                v->err = e;
                goto out;
            }
            done = 1;
        }
    }
    v->reusable = r.reusable;
    v->leftover = have + (len - fed);
out:
    free(buf);
}

static int same(const verdict *a, const verdict *b)
{
    if (a->err || b->err)
        return a->err == b->err;
    return a->status == b->status && a->body_len == b->body_len && a->body_sum == b->body_sum &&
           a->reusable == b->reusable && a->leftover == b->leftover;
}

static void serializer(const uint8_t *in, size_t len)
{
    kh_str part[5] = {{0}};
    size_t k = 0, s = 0;
    for (size_t i = 0; i <= len && k < 5; i++) {
        if (i == len || in[i] == 0) {
            part[k++] = (kh_str){(const char *)in + s, i - s};
            s = i + 1;
        }
    }
    kh_h1_field f = {part[3], part[4]};
    size_t nf = part[3].len ? 1 : 0;
    const char *bad;
    ssize_t need = kh_h1c_write_request(NULL, 0, part[0], part[1], part[2], &f, nf, -1, &bad);
    if (need == KH_H1C_EREQ) {
        CHECK(bad != NULL);
        return;
    }
    CHECK(need > 0);
    char *out = malloc((size_t)need);
    CHECK(kh_h1c_write_request(out, (size_t)need, part[0], part[1], part[2], &f, nf, -1, &bad) ==
          need);
    kh_h1_field pf[4];
    kh_h1_head h;
    memset(&h, 0, sizeof(h));
    h.fields = pf;
    kh_h1_limits pl = {1u << 20, 4, 1u << 20, 0};
    ssize_t r = kh_h1_parse_request(out, (size_t)need, 0, &h, &pl);
    /* the request parser is stricter (Host syntax, target form): only a success is compared */
    if (r > 0) {
        CHECK(r == need);
        CHECK(kh_str_eq(h.method, part[0].ptr, part[0].len));
        CHECK(kh_str_eq(h.target, part[1].ptr, part[1].len));
        size_t want = nf + (nf && kh_str_ieq_lower(f.name, "host", 4) ? 0 : 1);
        if (kh_str_eq(part[0], "POST", 4) || kh_str_eq(part[0], "PUT", 3) ||
            kh_str_eq(part[0], "PATCH", 5))
            want++; /* Content-Length: 0 */
        CHECK(h.num_fields == want);
    } else {
        /* never a framing or bare-LF/CR problem: the serializer made those impossible */
        CHECK(r != KH_H1_EBARELF && r != KH_H1_EBARECR && r != KH_H1_EOBSFOLD &&
              r != KH_H1_EFRAMING && r != KH_EAGAIN);
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    unsigned mode = data[0];
    const uint8_t *in = data + 2;
    size_t len = size - 2;
    if (mode & 0x80) {
        serializer(in, len);
        return 0;
    }
    size_t split = len ? data[1] % (len + 1) : 0;
    verdict whole, two, bytes;
    run(in, len, len, 1, mode, &whole);
    run(in, len, split, len, mode, &two);
    CHECK(same(&whole, &two));
    if (len <= 512) {
        run(in, len, 1, 1, mode, &bytes);
        CHECK(same(&whole, &bytes));
    }
    return 0;
}
