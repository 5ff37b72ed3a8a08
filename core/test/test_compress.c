/* test_compress.c: kh_compress: Accept-Encoding negotiation (q-values, "*", q=0, ties), the
 * compressible types, the eligibility rules, and for each coding a body written in chunks with a
 * flush per write: after every flush the bytes so far decode (zlib inflate, BrotliDecoder,
 * ZSTD_decompressStream, fed incrementally) to exactly everything written so far, and the
 * finished stream decodes to the whole body. */
#include <brotli/decode.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "kh_compress.h"
#include "kh_stream.h"
#include "kh_test.h"

static kh_str S(const char *s)
{
    return s ? (kh_str){s, strlen(s)} : (kh_str){NULL, 0};
}

static void neg(const char *ae, int want)
{
    kh_is_int(kh_compress_negotiate(S(ae)), want, "Accept-Encoding: %s", ae ? ae : "(none)");
}

/* an incremental decoder of one coding */
typedef struct dec {
    int coding;
    z_stream gz;
    BrotliDecoderState *br;
    ZSTD_DStream *zs;
    char out[1 << 20];
    size_t len;
} dec;

static void dec_init(dec *d, int coding)
{
    memset(d, 0, sizeof *d);
    d->coding = coding;
    if (coding == KH_CODING_GZIP)
        inflateInit2(&d->gz, 15 + 16);
    else if (coding == KH_CODING_BR)
        d->br = BrotliDecoderCreateInstance(NULL, NULL, NULL);
    else
        d->zs = ZSTD_createDStream();
}

static int dec_feed(dec *d, const char *p, size_t n)
{
    if (d->coding == KH_CODING_GZIP) {
        d->gz.next_in = (Bytef *)(uintptr_t)p;
        d->gz.avail_in = (uInt)n;
        d->gz.next_out = (Bytef *)d->out + d->len;
        d->gz.avail_out = (uInt)(sizeof d->out - d->len);
        int r = inflate(&d->gz, Z_SYNC_FLUSH);
        d->len = sizeof d->out - d->gz.avail_out;
        return (r == Z_OK || r == Z_STREAM_END || (r == Z_BUF_ERROR && n == 0)) && d->gz.avail_in == 0;
    }
    if (d->coding == KH_CODING_BR) {
        const uint8_t *in = (const uint8_t *)p;
        size_t ai = n, ao = sizeof d->out - d->len;
        uint8_t *o = (uint8_t *)d->out + d->len;
        BrotliDecoderResult r = BrotliDecoderDecompressStream(d->br, &ai, &in, &ao, &o, NULL);
        d->len = sizeof d->out - ao;
        return r != BROTLI_DECODER_RESULT_ERROR && ai == 0;
    }
    ZSTD_inBuffer in = {p, n, 0};
    ZSTD_outBuffer out = {d->out + d->len, sizeof d->out - d->len, 0};
    while (in.pos < in.size) {
        size_t r = ZSTD_decompressStream(d->zs, &out, &in);
        if (ZSTD_isError(r))
            return 0;
    }
    d->len += out.pos;
    return 1;
}

static void dec_free(dec *d)
{
    if (d->coding == KH_CODING_GZIP)
        inflateEnd(&d->gz);
    else if (d->coding == KH_CODING_BR)
        BrotliDecoderDestroyInstance(d->br);
    else
        ZSTD_freeDStream(d->zs);
}

static dec D;

static void stream_coding(int coding, const kh_limits *l)
{
    const char *name = kh_compress_name(coding);
    kh_compress *z = kh_compress_new(coding, l, -1);
    kh_ok(z != NULL, "%s: encoder", name);
    dec_init(&D, coding);
    char body[64 * 1024];
    size_t total = 0;
    int ok = 1;
    for (int i = 0; i < 40; i++) {
        char chunk[512];
        int m = snprintf(chunk, sizeof chunk, "data: {\"event\":%d,\"text\":\"tick tock %d\"}\n\n", i, i * 7);
        memcpy(body + total, chunk, (size_t)m);
        total += (size_t)m;
        ok &= kh_compress_write(z, chunk, (size_t)m, 0) == 0;
        size_t len;
        const char *out = kh_compress_out(z, &len);
        ok &= len > 0;
        ok &= dec_feed(&D, out, len);
        kh_compress_consumed(z);
        /* after each flush, everything written so far has come out of the decoder */
        ok &= D.len == total && memcmp(D.out, body, total) == 0;
    }
    kh_ok(ok, "%s: every flush decodes to all bytes written so far", name);
    kh_is_int(kh_compress_write(z, NULL, 0, 1), 0, "%s: finish", name);
    size_t len;
    const char *out = kh_compress_out(z, &len);
    kh_ok(dec_feed(&D, out, len) && D.len == total, "%s: the finished stream decodes", name);
    dec_free(&D);
    kh_compress_free(z);

    /* a whole body in one write with fin, as kh_stream_respond does */
    char big[200000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = "{\"k\":\"value\",\"n\":12345}\n"[i % 25];
    z = kh_compress_new(coding, l, (int64_t)sizeof big);
    kh_is_int(kh_compress_write(z, big, sizeof big, 1), 0, "%s: whole body", name);
    out = kh_compress_out(z, &len);
    kh_ok(len < sizeof big / 10, "%s: %zu -> %zu bytes", name, sizeof big, len);
    dec_init(&D, coding);
    kh_ok(dec_feed(&D, out, len) && D.len == sizeof big && memcmp(D.out, big, sizeof big) == 0,
          "%s: whole body decodes", name);
    dec_free(&D);
    kh_compress_free(z);
}

int main(void)
{
    kh_subtest("negotiation");
    neg(NULL, KH_CODING_NONE);
    neg("", KH_CODING_NONE);
    neg("identity", KH_CODING_NONE);
    neg("gzip", KH_CODING_GZIP);
    neg("x-gzip", KH_CODING_GZIP);
    neg(" GZip ;  Q=0.5 ", KH_CODING_GZIP);
    neg("gzip, deflate, br, zstd", KH_CODING_ZSTD);
    neg("gzip, br", KH_CODING_BR);
    neg("gzip;q=0.5, br;q=0.8", KH_CODING_BR);
    neg("gzip;q=1, br;q=0.999, zstd;q=0.001", KH_CODING_GZIP);
    neg("zstd;q=0, *", KH_CODING_BR);
    neg("*;q=0", KH_CODING_NONE);
    neg("*;q=0.1, gzip;q=0", KH_CODING_ZSTD);
    neg("gzip;q=0", KH_CODING_NONE);
    neg("gzip;q=2", KH_CODING_NONE);
    neg("gzip;q=0.1234", KH_CODING_NONE);
    neg("br;q=abc, gzip", KH_CODING_GZIP);
    neg(",,gzip,,", KH_CODING_GZIP);

    kh_subtest("types");
    const char *yes[] = {"text/html", "text/plain; charset=utf-8", "application/json",
                         "Application/JSON ;charset=utf-8", "application/problem+json",
                         "application/atom+xml", "image/svg+xml", "application/javascript",
                         "text/event-stream"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        kh_ok(kh_compress_type_ok(S(yes[i])), "%s compresses", yes[i]);
    const char *no[] = {"image/png", "application/octet-stream", "video/mp4", "application/zip",
                        "application/jsonx", "", "font/woff2"};
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        kh_ok(!kh_compress_type_ok(S(no[i])), "%s does not", no[i]);

    kh_subtest("eligibility");
    kh_limits l;
    kh_limits_init(&l);
    l.compress = 1;
    kh_header h[] = {{KH_STR_LIT("Content-Type"), KH_STR_LIT("text/html")},
                     {KH_STR_LIT("Content-Encoding"), KH_STR_LIT("br")}};
    int c;
    kh_ok(kh_compress_choose(&l, 200, 0, S("gzip"), h, 1, 5000, &c) && c == KH_CODING_GZIP, "200");
    kh_ok(kh_compress_choose(&l, 200, 0, S("gzip"), h, 1, -1, &c) && c == KH_CODING_GZIP, "streamed");
    kh_ok(kh_compress_choose(&l, 200, 0, S("deflate"), h, 1, 5000, &c) && c == 0, "eligible, identity");
    kh_ok(!kh_compress_choose(&l, 200, 0, S("gzip"), h, 1, 100, &c), "below compress_min_bytes");
    kh_ok(!kh_compress_choose(&l, 200, 0, S("gzip"), h, 2, 5000, &c), "already coded");
    kh_ok(!kh_compress_choose(&l, 200, 1, S("gzip"), h, 1, 5000, &c), "HEAD");
    kh_ok(!kh_compress_choose(&l, 204, 0, S("gzip"), h, 1, -1, &c), "204");
    kh_ok(!kh_compress_choose(&l, 206, 0, S("gzip"), h, 1, 5000, &c), "206");
    kh_ok(!kh_compress_choose(&l, 304, 0, S("gzip"), h, 1, 5000, &c), "304");
    kh_ok(!kh_compress_choose(&l, 200, 0, S("gzip"), h + 1, 1, 5000, &c), "no Content-Type");
    l.compress = 0;
    kh_ok(!kh_compress_choose(&l, 200, 0, S("gzip"), h, 1, 5000, &c), "compress=0");
    l.compress = 1;

    kh_subtest("streams with a flush per write");
    stream_coding(KH_CODING_GZIP, &l);
    stream_coding(KH_CODING_BR, &l);
    stream_coding(KH_CODING_ZSTD, &l);
    return kh_test_done();
}
