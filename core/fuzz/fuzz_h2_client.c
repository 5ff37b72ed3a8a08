/* fuzz_h2_client.c: libFuzzer target for the HTTP/2 client session (kh_h2_client) fed arbitrary
 * server bytes, and for the Content-Encoding decoders (kh_http_decode).
 * Owns:  one session (or decoder) per input.
 * In:    data[0] = mode: bit 7 set -> decoder mode (bits 0-1 pick gzip, deflate, zstd, gzip;
 *        bit 2 a tiny max_out); else bits 0-1 pick the limits, bit 2 forgets the streamed
 *        upload halfway, bit 3 gives it a content-length. data[1] = split point.
 *        data[2..] = what the server sends after its SETTINGS (a valid empty SETTINGS frame is
 *        prepended so the input reaches the frame layer past the preface check).
 * Out:   a trap on any broken property:
 *        - every stream ends in exactly one state: done, an error, or still waiting; a done stream
 *          has a final status 200..999; body bytes never exceed body_bytes;
 *        - taking the body twice gives the second time nothing new unless more input came;
 *        - kh_h2c_send never fails after an error (the GOAWAY still goes out);
 *        - a streamed upload never has more unsent than was written, takes no write after its
 *          last piece, and may be forgotten while nghttp2 still holds its DATA;
 *        - decoder: the output never exceeds max_out; the verdict is the same whole and split.
 * Never: keeps state between inputs. */
#include "kh_h2_client.h"
#include "kh_http_decode.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

static const kh_h2c_limits limits[4] = {
    {65535, 65535, 64, 4, 16},
    {65535, 1 << 20, 16384, 100, 1 << 20},
    {16384, 65535, 1024, 10, 100000},
    {1 << 20, 1 << 24, 65536, 1000, UINT64_MAX},
};

static size_t sink_total;
static void sink(void *arg, const char *p, size_t n)
{
    (void)arg;
    (void)p;
    sink_total += n;
}

static int decode_all(int kind, uint64_t max, const uint8_t *in, size_t len, size_t split,
                      size_t *out)
{
    kh_hd *d = kh_hd_new(kind, max);
    sink_total = 0;
    int e = kh_hd_feed(d, (const char *)in, split, sink, NULL);
    if (e == 0)
        e = kh_hd_feed(d, (const char *)in + split, len - split, sink, NULL);
    if (e == 0)
        e = kh_hd_finish(d);
    kh_hd_free(d);
    *out = sink_total;
    CHECK(sink_total <= max);
    return e;
}

static void decoder(unsigned mode, const uint8_t *in, size_t len, size_t split)
{
    static const int kinds[4] = {KH_HD_GZIP, KH_HD_DEFLATE, KH_HD_ZSTD, KH_HD_GZIP};
    int kind = kinds[mode & 3];
    uint64_t max = (mode & 4) ? 100 : (1u << 24);
    size_t a, b;
    int ea = decode_all(kind, max, in, len, len, &a);
    int eb = decode_all(kind, max, in, len, split, &b);
    /* a split may only move the point where a size or data error is seen, not the verdict
     * between success and failure */
    CHECK((ea == 0) == (eb == 0));
    if (ea == 0)
        CHECK(a == b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    unsigned mode = data[0];
    const uint8_t *in = data + 2;
    size_t len = size - 2;
    size_t split = len ? data[1] % (len + 1) : 0;
    if (mode & 0x80) {
        decoder(mode, in, len, split);
        return 0;
    }
    const kh_h2c_limits *lim = &limits[mode & 3];
    kh_h2c *s = kh_h2c_new(lim);
    kh_h1_field f[1] = {{KH_STR_LIT("accept"), KH_STR_LIT("*/*")}};
    int32_t a = kh_h2c_submit(s, KH_STR_LIT("GET"), KH_STR_LIT("https"), KH_STR_LIT("a"),
                              KH_STR_LIT("/"), f, 1, NULL, 0);
    int32_t b = kh_h2c_submit(s, KH_STR_LIT("POST"), KH_STR_LIT("https"), KH_STR_LIT("a"),
                              KH_STR_LIT("/p"), NULL, 0, "body", 4);
    /* a streamed body: written in pieces around the input, bigger than the initial window */
    int32_t c = kh_h2c_submit_streamed(s, KH_STR_LIT("PUT"), KH_STR_LIT("https"), KH_STR_LIT("a"),
                                       KH_STR_LIT("/s"), NULL, 0, (mode & 8) ? 70000 : -1);
    CHECK(a == 1 && b == 3 && c == 5);
    static char piece[35000];
    size_t written = 0;
    CHECK(kh_h2c_write(s, c, piece, sizeof(piece), 0) == 0);
    written += sizeof(piece);
    const uint8_t *p;
    while (kh_h2c_send(s, &p) > 0) {
    }
    CHECK(kh_h2c_unsent(s, c) <= written);
    static const uint8_t settings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
    kh_h2c_recv(s, settings, sizeof(settings));
    kh_h2c_recv(s, in, split);
    while (kh_h2c_send(s, &p) > 0) {
    }
    if (mode & 4) {
        kh_h2c_forget(s, c); /* the caller left with DATA still queued */
        CHECK(kh_h2c_write(s, c, piece, 1, 1) == KH_H2C_EREQ);
    } else {
        int w = kh_h2c_write(s, c, piece, sizeof(piece), 1);
        CHECK(w == 0 || w <= -5180);
        if (w == 0)
            written += sizeof(piece);
        CHECK(kh_h2c_write(s, c, piece, 1, 0) != 0); /* finished: no more */
    }
    while (kh_h2c_send(s, &p) > 0) {
    }
    CHECK(kh_h2c_unsent(s, c) <= written);
    kh_h2c_recv(s, in + split, len - split);
    while (kh_h2c_send(s, &p) > 0) {
    }
    int32_t ids[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        kh_h2c_info inf;
        kh_h2c_info_get(s, ids[i], &inf);
        CHECK(inf.known);
        CHECK(!(inf.done && inf.err));
        if (inf.done)
            CHECK(inf.status >= 200 && inf.status <= 999);
        CHECK(inf.body_total <= lim->body_bytes);
        const char *bp;
        size_t n = kh_h2c_take(s, ids[i], &bp);
        CHECK(n == inf.body_len);
        CHECK(kh_h2c_take(s, ids[i], &bp) == 0);
        for (size_t k = 0; k < inf.num_fields; k++) {
            kh_str nm, v;
            CHECK(kh_h2c_field(s, ids[i], k, &nm, &v));
        }
    }
    kh_h2c_eof(s);
    kh_h2c_forget(s, a);
    kh_h2c_free(s);
    return 0;
}
