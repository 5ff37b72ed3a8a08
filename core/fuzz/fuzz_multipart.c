/* fuzz_multipart.c: libFuzzer target for kh_multipart (kh_mp_init, kh_mp_next, kh_mp_finish).
 * Owns:  exact-size heap copies of each chunk (ASan sees a read outside it) and the transcripts.
 * In:    data[0]: boundary length (1-16) and data[1..]: its bytes (mapped onto bchars); then one
 *        byte of chunking seed; the rest is the body.
 * Out:   a trap on any broken property:
 *        - the body fed whole and fed in seeded pieces (cuts anywhere, 1-byte pieces included)
 *          gives the same transcript of events (data merged; data after the last event dropped
 *          when it ends in an error, since how much comes before an error depends on the cuts);
 *        - no DATA event is empty, each points into the current chunk or the delimiter, and the
 *          offset never goes back nor past the chunk;
 *        - a part's data never holds the delimiter, a header name is a non-empty token and a
 *          value has no CR, LF or NUL;
 *        - small limits (parts, header bytes, part bytes, total) are never exceeded silently.
 * Never: keeps state between inputs. */
#include "kh_multipart.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

typedef struct out {
    char *p;
    size_t len, cap;
} out;

static void put(out *o, const void *s, size_t n)
{
    if (o->len + n + 1 > o->cap) {
        o->cap = (o->len + n + 1) * 2;
        o->p = realloc(o->p, o->cap);
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
    o->p[o->len] = 0;
}

static const kh_mp_limits LIM = {8, 256, 4096, 1 << 16};

static int contains(const char *h, size_t hl, const char *n, size_t nl)
{
    if (nl > hl)
        return 0;
    for (size_t i = 0; i + nl <= hl; i++)
        if (memcmp(h + i, n, nl) == 0)
            return 1;
    return 0;
}

/* step 0: the whole body at once; else pieces whose sizes come from seed */
static out transcript(const char *bnd, size_t blen, const uint8_t *body, size_t len, unsigned seed,
                      int whole)
{
    out o = {0};
    put(&o, "", 0);
    kh_multipart p;
    char hbuf[256];
    if (kh_mp_init(&p, bnd, blen, hbuf, &LIM) != 0) {
        put(&o, "!", 1);
        return o;
    }
    out part = {0}; /* the current part's data, for the delimiter check */
    put(&part, "", 0);
    size_t pos = 0, total = 0;
    int err = 0, in_data = 0;
    uint64_t parts = 0;
    unsigned r = seed * 2654435761u + 1;
    while (!err && (pos < len || pos == 0)) {
        size_t n = len - pos;
        if (!whole) {
            r = r * 1103515245u + 12345u;
            size_t k = (r >> 16) % 8 == 0 ? 1 : (r >> 16) % 97;
            if (k < n)
                n = k;
        }
        char *chunk = malloc(n ? n : 1);
        memcpy(chunk, body + pos, n);
        size_t off = 0;
        for (;;) {
            size_t before = off;
            int ev = kh_mp_next(&p, chunk, n, &off);
            CHECK(off >= before && off <= n);
            total += off - before;
            if (ev != KH_MP_DATA && ev != KH_MP_NEED_MORE && in_data) {
                put(&o, "]", 1);
                in_data = 0;
            }
            if (ev == KH_MP_NEED_MORE) {
                CHECK(off == n);
                break;
            }
            if (ev == KH_MP_ERROR) {
                CHECK(p.error != NULL);
                err = 1;
                break;
            }
            switch (ev) {
            case KH_MP_HEADER:
                CHECK(p.name_len > 0);
                CHECK(!memchr(p.value, '\r', p.value_len) && !memchr(p.value, '\n', p.value_len));
                CHECK(!memchr(p.value, 0, p.value_len) && !memchr(p.name, ':', p.name_len));
                put(&o, "H", 1);
                put(&o, p.name, p.name_len);
                put(&o, "=", 1);
                put(&o, p.value, p.value_len);
                put(&o, "|", 1);
                break;
            case KH_MP_HEADERS_END:
                CHECK(++parts <= LIM.max_parts);
                part.len = 0;
                put(&o, "E|", 2);
                break;
            case KH_MP_DATA:
                CHECK(p.len > 0);
                CHECK((p.data >= chunk && p.data + p.len <= chunk + n) ||
                      (p.data >= p.delim && p.data + p.len <= p.delim + sizeof p.delim));
                if (!in_data)
                    put(&o, "[", 1);
                in_data = 1;
                put(&o, p.data, p.len);
                put(&part, p.data, p.len);
                CHECK(part.len <= LIM.max_part_bytes);
                break;
            case KH_MP_PART_END:
                CHECK(!contains(part.p, part.len, p.delim, p.dlen));
                put(&o, "P|", 2);
                break;
            case KH_MP_DONE:
                put(&o, "Z|", 2);
                break;
            default:
                CHECK(0);
            }
        }
        CHECK(total <= LIM.max_total_bytes || err);
        free(chunk);
        pos += n;
        if (len == 0)
            break;
    }
    if (in_data)
        put(&o, "]", 1);
    if (!err && kh_mp_finish(&p) == 0) {
        put(&o, "F", 1);
    } else {
        char *bar = strrchr(o.p, '|');
        o.len = bar ? (size_t)(bar - o.p) + 1 : 0;
        o.p[o.len] = 0;
        put(&o, "!", 1);
        put(&o, p.error, strlen(p.error));
    }
    free(part.p);
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char bchars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                 "'()+_,-./:=? ";
    if (size < 2)
        return 0;
    size_t blen = (size_t)(data[0] % 16) + 1;
    if (size < 1 + blen + 1)
        return 0;
    char bnd[16];
    for (size_t i = 0; i < blen; i++)
        bnd[i] = bchars[data[1 + i] % (sizeof bchars - 1)];
    unsigned seed = data[1 + blen];
    const uint8_t *body = data + 2 + blen;
    size_t len = size - 2 - blen;
    out a = transcript(bnd, blen, body, len, 0, 1);
    out b = transcript(bnd, blen, body, len, seed, 0);
    CHECK(a.len == b.len && memcmp(a.p, b.p, a.len) == 0);
    free(a.p);
    free(b.p);
    return 0;
}
