/* fuzz_h1_parse.c: libFuzzer target for kh_h1_parse_request, kh_h1_chunked_decode and
 * kh_h1_h2_settings.
 * Owns:  exact-size heap copies of the input (so ASan sees any read past len) and of the body.
 * In:    data[0] = mode: bits 0-1 pick the limits (tiny, small, default, no body limit), bit 7
 *        feeds the whole rest to the chunked decoder instead of the head parser, bits 5-7 = 011
 *        to kh_h1_h2_settings; data[1] picks the split point; data[2..] is the wire input.
 * Out:   a trap on any broken property:
 *        - the one-shot parse equals a parse fed in two pieces (prefix with prev_len 0, then the
 *          whole with prev_len = prefix length), heads included, slice for slice;
 *        - a prefix gives KH_EAGAIN or the one-shot result (an error, or the same head length);
 *        - the result is KH_EAGAIN, a KH_H1_E* code, or a length <= len and <= header_bytes;
 *        - on an error, a method slice (if set) is a tchar run inside the input, then SP;
 *        - every slice lies inside the head (even the "/" of an absolute-form without a path),
 *          num_fields <= header_fields, body_kind/target_form/minor_version are in range;
 *        - an accepted head is strict, checked without the parser's tables (check_strict);
 *        - when the head says chunked, the bytes after it decode the same in one piece and in
 *          two pieces: same result, same consumed count, same payload;
 *        - the chunked decoder never writes past the input nor reports more output than input,
 *          and agrees with a plain reference reader (ref_decode) on the verdict, the consumed
 *          count and the payload, the sum of the chunk sizes included (body_bytes);
 *        - kh_h1_h2_settings accepts only what base64url-encodes back to the same value, 6 bytes
 *          per 8 characters.
 * Never: keeps state between inputs. */
#include "kh_err.h"
#include "kh_h1_parse.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

static const kh_h1_limits limits[4] = {
    {40, 2, 8, 16},                 /* tiny: every limit is easy to hit */
    {256, 6, 48, 300},              /* small */
    {16384, 100, 8192, 8388608},    /* the engine's defaults */
    {16384, 100, 8192, UINT64_MAX}, /* no body limit: chunk sizes up to 16 hex digits */
};

#define MAXF 100

static int is_code(ssize_t r)
{
    return r == KH_EAGAIN || (r <= KH_H1_EBADREQ && r >= KH_H1_EH2SETTINGS);
}

static int slice_inside(kh_str s, const char *buf, size_t n)
{
    if (s.len == 0)
        return 1;
    if (s.ptr == NULL)
        return 0;
    return s.ptr >= buf && s.ptr <= buf + n && s.len <= (size_t)(buf + n - s.ptr);
}

static int slice_same(kh_str a, kh_str b)
{
    return a.len == b.len && (a.len == 0 || a.ptr == b.ptr);
}

static int tchar(uint8_t c)
{
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static int ci_eq(kh_str s, const char *lower)
{
    size_t n = strlen(lower);
    if (s.len != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (((uint8_t)s.ptr[i] | 0x20) != (uint8_t)lower[i])
            return 0;
    return 1;
}

/* An accepted head must be strict, checked here without the parser's tables: CRLF only, the
 * blank line at the end, token method and names, visible-ASCII target, clean trimmed values,
 * one Host on HTTP/1.1, and a body kind that agrees with the framing fields. */
static void check_strict(const kh_h1_head *h, const char *buf, size_t n)
{
    CHECK(n >= 4 && memcmp(buf + n - 4, "\r\n\r\n", 4) == 0);
    size_t lines = 0;
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            CHECK(i > 0 && buf[i - 1] == '\r');
            lines++;
        }
        if (buf[i] == '\r')
            CHECK(i + 1 < n && buf[i + 1] == '\n');
    }
    size_t lead = (size_t)(h->method.ptr - buf);
    CHECK(lead % 2 == 0);
    CHECK(lines == lead / 2 + 1 + h->num_fields + 1);
    for (size_t i = 0; i < h->method.len; i++)
        CHECK(tchar((uint8_t)h->method.ptr[i]));
    CHECK(h->method.ptr + h->method.len + 1 == h->target.ptr);
    for (size_t i = 0; i < h->target.len; i++)
        CHECK(h->target.ptr[i] > 0x20 && h->target.ptr[i] < 0x7f && h->target.ptr[i] != '#');
    size_t hosts = 0, cls = 0, tes = 0;
    for (size_t i = 0; i < h->num_fields; i++) {
        kh_str nm = h->fields[i].name, v = h->fields[i].value;
        for (size_t j = 0; j < nm.len; j++)
            CHECK(tchar((uint8_t)nm.ptr[j]));
        CHECK(nm.ptr[nm.len] == ':');
        for (size_t j = 0; j < v.len; j++) {
            uint8_t c = (uint8_t)v.ptr[j];
            CHECK(c == '\t' || c >= 0x20);
            CHECK(c != 0x7f);
        }
        if (v.len)
            CHECK(v.ptr[0] != ' ' && v.ptr[0] != '\t' && v.ptr[v.len - 1] != ' ' &&
                  v.ptr[v.len - 1] != '\t');
        hosts += ci_eq(nm, "host");
        cls += ci_eq(nm, "content-length");
        tes += ci_eq(nm, "transfer-encoding");
    }
    CHECK(hosts <= 1 && (h->minor_version == 0 || hosts == 1));
    CHECK(!(cls && tes));
    CHECK((h->body_kind == KH_H1_BODY_CHUNKED) == (tes > 0));
    CHECK((h->body_kind == KH_H1_BODY_LENGTH) == (cls > 0));
    CHECK(!tes || h->minor_version == 1);
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

/* A plain reference for RFC 9112 §7.1 with the same limits, written as a recursive-descent
 * reader over the whole input: 1 = done (consumed, payload), 0 = needs more, -1 = error. Only
 * the verdict, the consumed count and the payload are compared, not the error codes. */
typedef struct ref {
    const uint8_t *p;
    size_t n, i;
} ref;

#define REF_MORE -2
static int ref_peek(ref *r)
{
    return r->i < r->n ? r->p[r->i] : REF_MORE;
}

static int ref_ws(int c)
{
    return c == ' ' || c == '\t';
}

static int ref_qdtext(int c)
{
    return c == '\t' || c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5b) ||
           (c >= 0x5d && c <= 0x7e) || c >= 0x80;
}

/* Returns 1 past a chunk-ext run ending at the CR, 0 if more input is needed, -1 on error. */
static int ref_exts(ref *r)
{
    for (;;) {
        int c = ref_peek(r), saw_ws = 0;
        while (ref_ws(c)) {
            r->i++, saw_ws = 1;
            c = ref_peek(r);
        }
        if (c == REF_MORE)
            return 0;
        if (c == '\r' && !saw_ws)
            return 1;
        if (c != ';')
            return -1;
        r->i++;
        while (ref_ws(c = ref_peek(r)))
            r->i++;
        if (c == REF_MORE)
            return 0;
        if (!tchar((uint8_t)c))
            return -1;
        while (c >= 0 && tchar((uint8_t)c)) {
            r->i++;
            c = ref_peek(r);
        }
        size_t save = r->i;
        while (ref_ws(c)) {
            r->i++;
            c = ref_peek(r);
        }
        if (c == REF_MORE)
            return 0;
        if (c != '=') {
            if (r->i != save && c != ';')
                return -1; /* BWS after a name leads to '=' or ';' only */
            r->i = save;
            continue;
        }
        r->i++;
        while (ref_ws(c = ref_peek(r)))
            r->i++;
        if (c == REF_MORE)
            return 0;
        if (c == '"') {
            r->i++;
            for (;;) {
                c = ref_peek(r);
                if (c == REF_MORE)
                    return 0;
                r->i++;
                if (c == '"')
                    break;
                if (c == '\\') {
                    c = ref_peek(r);
                    if (c == REF_MORE)
                        return 0;
                    if (!(c == '\t' || c >= 0x20) || c == 0x7f)
                        return -1;
                    r->i++;
                } else if (!ref_qdtext(c)) {
                    return -1;
                }
            }
        } else if (tchar((uint8_t)c)) {
            while ((c = ref_peek(r)) >= 0 && tchar((uint8_t)c))
                r->i++;
        } else {
            return -1;
        }
    }
}

static int ref_decode(const uint8_t *p, size_t n, const kh_h1_limits *lim, uint8_t *out,
                      size_t *olen, size_t *consumed)
{
    ref r = {p, n, 0};
    uint64_t total = 0;
    *olen = 0;
    for (;;) {
        size_t line0 = r.i;
        uint64_t size = 0;
        unsigned digits = 0;
        int c;
        while ((c = ref_peek(&r)) >= 0 && isxdigit(c)) {
            if (++digits > 16)
                return -1;
            size = size * 16 + (uint64_t)(isdigit(c) ? c - '0' : (c | 0x20) - 'a' + 10);
            r.i++;
        }
        if (c == REF_MORE)
            return r.i - line0 > 4096 ? -1 : 0;
        if (digits == 0)
            return -1;
        int e = ref_exts(&r);
        if (r.i - line0 + (e == 1) > 4096)
            return -1; /* the size line, its CR included, is capped */
        if (e <= 0)
            return e;
        r.i++; /* CR */
        if ((c = ref_peek(&r)) == REF_MORE)
            return 0;
        if (c != '\n')
            return -1;
        r.i++;
        if (size > lim->body_bytes - total)
            return -1; /* the sizes may not add up past body_bytes, checked at each size line */
        total += size;
        if (size == 0)
            break;
        if (size > r.n - r.i) {
            memcpy(out + *olen, p + r.i, r.n - r.i);
            *olen += r.n - r.i;
            return 0;
        }
        memcpy(out + *olen, p + r.i, size);
        *olen += size;
        r.i += size;
        if ((c = ref_peek(&r)) == REF_MORE)
            return 0;
        if (c != '\r')
            return -1;
        r.i++;
        if ((c = ref_peek(&r)) == REF_MORE)
            return 0;
        if (c != '\n')
            return -1;
        r.i++;
    }
    /* trailer-section: field lines as in a head, then CRLF */
    size_t t0 = r.i, fields = 0;
    for (;;) {
        int c = ref_peek(&r);
        if (c == REF_MORE)
            return r.i - t0 > lim->header_bytes ? -1 : 0;
        if (c == '\r') {
            if (r.i + 1 - t0 > lim->header_bytes)
                return -1;
            r.i++;
            if ((c = ref_peek(&r)) == REF_MORE)
                return 0;
            if (c != '\n' || r.i + 1 - t0 > lim->header_bytes)
                return -1;
            *consumed = r.i + 1;
            return 1;
        }
        if (!tchar((uint8_t)c) || ++fields > lim->header_fields)
            return -1;
        while ((c = ref_peek(&r)) >= 0 && tchar((uint8_t)c))
            r.i++;
        if (c == REF_MORE)
            return r.i - t0 > lim->header_bytes ? -1 : 0;
        if (c != ':')
            return -1;
        r.i++;
        while ((c = ref_peek(&r)) >= 0 && (c == '\t' || c >= 0x20) && c != 0x7f)
            r.i++;
        if (c == REF_MORE)
            return r.i - t0 > lim->header_bytes ? -1 : 0;
        if (c != '\r' || r.i + 1 - t0 > lim->header_bytes)
            return -1;
        r.i++;
        if ((c = ref_peek(&r)) == REF_MORE)
            return 0;
        if (c != '\n' || r.i + 1 - t0 > lim->header_bytes)
            return -1;
        r.i++;
    }
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
    size_t t3, c3 = 0;
    int r3 = ref_decode((const uint8_t *)body, n, lim, (uint8_t *)o2, &t3, &c3);
    CHECK(r3 == (r1 < 0 ? -1 : (int)r1));
    if (r3 >= 0)
        CHECK(t3 == t1 && memcmp(o1, o2, t1) == 0 && (r3 == 0 || c3 == c1));
    free(o1);
    free(o2);
}

/* HTTP2-Settings: an accepted value is exactly the base64url of what came out. */
static void fuzz_h2_settings(const char *v, size_t n)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    uint8_t out[KH_H1_H2_SETTINGS_MAX * 6];
    ssize_t r = kh_h1_h2_settings((kh_str){v, n}, out);
    if (r < 0) {
        CHECK(r == KH_H1_EH2SETTINGS);
        return;
    }
    CHECK(n % 8 == 0 && (size_t)r == n / 8 * 6 && r > 0);
    for (size_t i = 0, j = 0; i < (size_t)r; i += 3, j += 4) {
        uint32_t acc = (uint32_t)out[i] << 16 | (uint32_t)out[i + 1] << 8 | out[i + 2];
        for (int k = 0; k < 4; k++)
            CHECK(v[j + (size_t)k] == abc[(acc >> (18 - 6 * k)) & 63]);
    }
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
    if ((data[0] & 0xe0) == 0x60) {
        fuzz_h2_settings(buf, len);
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
    if (r1 < 0 && r1 != KH_EAGAIN && h1.method.len) {
        /* an error leaves the method it got to (kh_h1 answers HEAD without content): a tchar
         * run inside the input, followed by SP */
        CHECK(slice_inside(h1.method, buf, len) && h1.method.ptr + h1.method.len < buf + len);
        CHECK(h1.method.ptr[h1.method.len] == ' ');
        for (size_t i = 0; i < h1.method.len; i++)
            CHECK(tchar((uint8_t)h1.method.ptr[i]));
    }
    if (r1 > 0) {
        check_head(&h1, buf, (size_t)r1, lim);
        check_strict(&h1, buf, (size_t)r1);
        same_head(&h1, &h2);
        if (h1.body_kind == KH_H1_BODY_CHUNKED)
            fuzz_chunked(buf + r1, len - (size_t)r1, seed ^ 0x5a, lim);
    }
    free(buf);
    return 0;
}
