/* fuzz_h1_parse.c: libFuzzer target for kh_h1_parse_request and kh_h1_chunked_decode.
 * Owns:  exact-size heap copies of the input (so ASan sees any read past len) and of the body.
 * In:    data[0] = mode: bits 0-1 pick the limits (tiny, small, default), bit 7 feeds the whole
 *        rest to the chunked decoder instead of the head parser; data[1] picks the split point;
 *        data[2..] is the wire input.
 * Out:   a trap on any broken property:
 *        - the one-shot parse equals a parse fed in two pieces (prefix with prev_len 0, then the
 *          whole with prev_len = prefix length), heads included, slice for slice;
 *        - a prefix gives KH_EAGAIN or the one-shot result (an error, or the same head length);
 *        - the result is KH_EAGAIN, a KH_H1_E* code, or a length <= len and <= header_bytes;
 *        - every slice lies inside the head (the "/" of an absolute-form without path aside),
 *          num_fields <= header_fields, body_kind/target_form/minor_version are in range;
 *        - when the head says chunked, the bytes after it decode the same in one piece and in
 *          two pieces: same result, same consumed count, same payload;
 *        - the chunked decoder never writes past the input nor reports more output than input.
 * Never: keeps state between inputs. */
#include "kh_err.h"
#include "kh_h1_parse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

static const kh_h1_limits limits[4] = {
    {40, 2, 8},          /* tiny: every limit is easy to hit */
    {256, 6, 48},        /* small */
    {16384, 100, 8192},  /* the engine's defaults */
    {16384, 100, 8192},
};

#define MAXF 100

static int is_code(ssize_t r)
{
    return r == KH_EAGAIN || (r <= KH_H1_EBADREQ && r >= KH_H1_ECHUNK);
}

static int slice_inside(kh_str s, const char *buf, size_t n)
{
    if (s.len == 0)
        return 1;
    if (s.ptr == NULL)
        return 0;
    if (s.len == 1 && s.ptr[0] == '/' && (s.ptr < buf || s.ptr >= buf + n))
        return 1; /* absolute-form without a path: the parser's own "/" */
    return s.ptr >= buf && s.ptr <= buf + n && s.len <= (size_t)(buf + n - s.ptr);
}

static int slice_same(kh_str a, kh_str b)
{
    return a.len == b.len && (a.len == 0 || a.ptr == b.ptr);
}

static void check_head(const kh_h1_head *h, const char *buf, size_t n, const kh_h1_limits *lim)
{
    CHECK(h->method.len > 0 && slice_inside(h->method, buf, n));
    CHECK(h->target.len > 0 && slice_inside(h->target, buf, n));
    CHECK(slice_inside(h->path, buf, n));
    CHECK(h->query.ptr == NULL ? h->query.len == 0 : slice_inside(h->query, buf, n));
    CHECK(slice_inside(h->authority, buf, n));
    CHECK(slice_inside(h->host, buf, n));
    CHECK(slice_inside(h->upgrade, buf, n));
    CHECK(h->target.len <= lim->target_bytes);
    CHECK(h->minor_version == 0 || h->minor_version == 1);
    CHECK(h->target_form >= KH_H1_ORIGIN_FORM && h->target_form <= KH_H1_AUTHORITY_FORM);
    CHECK(h->body_kind >= KH_H1_BODY_NONE && h->body_kind <= KH_H1_BODY_CHUNKED);
    CHECK(h->body_kind == KH_H1_BODY_LENGTH || h->content_length == 0);
    CHECK(h->content_length <= (UINT64_C(1) << 53));
    CHECK(h->num_fields <= lim->header_fields);
    CHECK(!!(h->flags & KH_H1_F_HAS_UPGRADE) == (h->upgrade.ptr != NULL));
    for (size_t i = 0; i < h->num_fields; i++) {
        CHECK(h->fields[i].name.len > 0 && slice_inside(h->fields[i].name, buf, n));
        CHECK(slice_inside(h->fields[i].value, buf, n));
    }
}

static void same_head(const kh_h1_head *a, const kh_h1_head *b)
{
    CHECK(slice_same(a->method, b->method) && slice_same(a->target, b->target));
    CHECK(slice_same(a->path, b->path) && slice_same(a->query, b->query));
    CHECK(a->query.ptr == b->query.ptr);
    CHECK(slice_same(a->authority, b->authority) && slice_same(a->host, b->host));
    CHECK(slice_same(a->upgrade, b->upgrade));
    CHECK(a->minor_version == b->minor_version && a->target_form == b->target_form);
    CHECK(a->body_kind == b->body_kind && a->content_length == b->content_length);
    CHECK(a->flags == b->flags && a->num_fields == b->num_fields);
    for (size_t i = 0; i < a->num_fields; i++) {
        CHECK(slice_same(a->fields[i].name, b->fields[i].name));
        CHECK(slice_same(a->fields[i].value, b->fields[i].value));
    }
}

/* Decodes body[0..n) in pieces cut at cut (n when whole). Returns the result and fills the
 * payload and the consumed count. */
static ssize_t decode(const char *body, size_t n, size_t cut, const kh_h1_limits *lim, char *out,
                      size_t *out_total, size_t *consumed)
{
    kh_h1_chunked d;
    memset(&d, 0, sizeof(d));
    size_t from = 0, cuts[2] = {cut, n};
    *out_total = 0;
    *consumed = 0;
    for (int i = 0; i < 2 && from <= n; i++) {
        size_t len = cuts[i] - from;
        char *piece = malloc(len ? len : 1);
        memcpy(piece, body + from, len);
        size_t olen = 0;
        ssize_t r = kh_h1_chunked_decode(&d, piece, len, &olen, lim);
        if (r >= 0) {
            CHECK((size_t)r <= len && olen <= (size_t)r);
            CHECK(d.done || (size_t)r == len);
            memcpy(out + *out_total, piece, olen);
            *out_total += olen;
        } else {
            CHECK(is_code(r) && r != KH_EAGAIN);
        }
        free(piece);
        if (r < 0)
            return r;
        if (d.done) {
            *consumed = from + (size_t)r;
            return 1;
        }
        from = cuts[i];
        if (cuts[i] == n)
            break;
    }
    *consumed = n;
    return 0;
}

static void fuzz_chunked(const char *body, size_t n, size_t seed, const kh_h1_limits *lim)
{
    char *o1 = malloc(n + 1), *o2 = malloc(n + 1);
    size_t t1, t2, c1, c2;
    ssize_t r1 = decode(body, n, n, lim, o1, &t1, &c1);
    ssize_t r2 = decode(body, n, n ? seed % (n + 1) : 0, lim, o2, &t2, &c2);
    CHECK(r1 == r2);
    if (r1 >= 0) {
        CHECK(c1 == c2 && t1 == t2 && memcmp(o1, o2, t1) == 0);
        CHECK(t1 <= c1);
    }
    free(o1);
    free(o2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const kh_h1_limits *lim = &limits[data[0] & 3];
    size_t seed = data[1];
    size_t len = size - 2;
    char *buf = malloc(len ? len : 1);
    memcpy(buf, data + 2, len);

    if (data[0] & 0x80) {
        fuzz_chunked(buf, len, seed, lim);
        free(buf);
        return 0;
    }

    kh_h1_field f1[MAXF], f2[MAXF];
    kh_h1_head h1, h2;
    memset(&h1, 0, sizeof(h1));
    memset(&h2, 0, sizeof(h2));
    h1.fields = f1;
    h2.fields = f2;

    ssize_t r1 = kh_h1_parse_request(buf, len, 0, &h1, lim);
    CHECK(is_code(r1) || (r1 > 0 && (size_t)r1 <= len && (size_t)r1 <= lim->header_bytes));

    size_t k = len ? (seed * (len + 1)) / 256 : 0; /* 0..len */
    ssize_t a = kh_h1_parse_request(buf, k, 0, &h2, lim);
    if (a != KH_EAGAIN) {
        CHECK(a == r1); /* prefix invariant */
    } else {
        ssize_t b = kh_h1_parse_request(buf, len, k, &h2, lim);
        CHECK(b == r1);
    }
    if (r1 > 0) {
        check_head(&h1, buf, (size_t)r1, lim);
        same_head(&h1, &h2);
        if (h1.body_kind == KH_H1_BODY_CHUNKED)
            fuzz_chunked(buf + r1, len - (size_t)r1, seed ^ 0x5a, lim);
    }
    free(buf);
    return 0;
}
