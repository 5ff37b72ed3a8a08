/* kh_http_decode.c: streaming gzip/deflate (zlib) and zstd (libzstd) decoding of response
 * bodies, bounded by max_out.
 * Owns:  the z_stream or ZSTD_DStream of one body and a 16 KiB output block on the stack.
 * In:    encoded bytes; the end of the body.
 * Out:   decoded bytes through the caller's callback.
 * Never: grows past max_out decoded bytes; accepts bytes after the end of the compressed stream
 *        (a second gzip member is decoded, as gzip(1) does; trailing garbage is KH_HD_EDATA);
 *        decodes a zstd frame that RFC 8878 does not define: Debian's libzstd also reads the
 *        pre-1.0 "legacy" formats, whose streaming decoder gave a different verdict for the same
 *        bytes fed whole or split (found by fuzz_h2_client), so each frame's magic number is
 *        checked here before libzstd sees the frame. */
#include "kh_http_decode.h"

#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "kh_common.h"

struct kh_hd {
    int kind;
    int ended; /* the compressed stream ended */
    uint64_t max_out, total;
    z_stream z;
    ZSTD_DStream *zs;
    /* zstd: the start of a frame (at the start and after each frame's end) is held here until
     * its 4-byte magic number is known */
    int at_frame;
    unsigned char magic[4];
    size_t magic_len;
};

/* RFC 8878 §3.1.1 (a zstd frame) and §3.1.2 (a skippable frame, 0x184D2A50..5F), little-endian */
static int zstd_magic_ok(const unsigned char *m)
{
    uint32_t v = (uint32_t)m[0] | (uint32_t)m[1] << 8 | (uint32_t)m[2] << 16 | (uint32_t)m[3] << 24;
    return v == 0xFD2FB528u || (v & 0xFFFFFFF0u) == 0x184D2A50u;
}

int kh_hd_kind_of(const char *v, size_t len)
{
    kh_str s = {v, len};
    if (len == 0 || kh_str_ieq_lower(s, "identity", 8))
        return KH_HD_NONE;
    if (kh_str_ieq_lower(s, "gzip", 4) || kh_str_ieq_lower(s, "x-gzip", 6))
        return KH_HD_GZIP;
    if (kh_str_ieq_lower(s, "deflate", 7))
        return KH_HD_DEFLATE;
    if (kh_str_ieq_lower(s, "zstd", 4))
        return KH_HD_ZSTD;
    return -1;
}

kh_hd *kh_hd_new(int kind, uint64_t max_out)
{
    kh_hd *d = kh_xcalloc(1, sizeof(*d));
    d->kind = kind;
    d->max_out = max_out;
    if (kind == KH_HD_ZSTD) {
        d->zs = ZSTD_createDStream();
        if (d->zs == NULL)
            abort();
        ZSTD_initDStream(d->zs);
        d->at_frame = 1;
    } else {
        /* 32 + 15: gzip or zlib header detected; deflate: zlib-wrapped (RFC 9110 §8.4.1.2) */
        if (inflateInit2(&d->z, kind == KH_HD_GZIP ? 16 + MAX_WBITS : 32 + MAX_WBITS) != Z_OK)
            abort();
    }
    return d;
}

static int emit(kh_hd *d, const char *p, size_t n, kh_hd_out out, void *arg)
{
    if (n == 0)
        return 0;
    if (d->total + n > d->max_out)
        return KH_HD_ETOOBIG;
    d->total += n;
    out(arg, p, n);
    return 0;
}

int kh_hd_feed(kh_hd *d, const char *in, size_t n, kh_hd_out out, void *arg)
{
    char buf[16384];
    if (d->kind == KH_HD_ZSTD) {
        ZSTD_inBuffer ib = {in, n, 0};
        while (ib.pos < ib.size) {
            if (d->at_frame) {
                /* a frame starts: hold its first bytes until the magic number is whole */
                d->ended = 0;
                while (d->magic_len < 4 && ib.pos < ib.size)
                    d->magic[d->magic_len++] = ((const unsigned char *)in)[ib.pos++];
                if (d->magic_len < 4)
                    break;
                if (!zstd_magic_ok(d->magic))
                    return KH_HD_EDATA;
                /* 4 bytes are less than any frame header (6 or 8): libzstd keeps them all */
                ZSTD_inBuffer mb = {d->magic, 4, 0};
                ZSTD_outBuffer ob = {buf, sizeof(buf), 0};
                if (ZSTD_isError(ZSTD_decompressStream(d->zs, &ob, &mb)) || mb.pos != 4)
                    return KH_HD_EDATA;
                d->at_frame = 0;
                d->magic_len = 0;
                continue;
            }
            ZSTD_outBuffer ob = {buf, sizeof(buf), 0};
            size_t r = ZSTD_decompressStream(d->zs, &ob, &ib);
            if (ZSTD_isError(r))
                return KH_HD_EDATA;
            d->ended = r == 0;
            int e = emit(d, buf, ob.pos, out, arg);
            if (e)
                return e;
            if (r == 0)
                d->at_frame = 1; /* libzstd stops at a frame's end: what follows is a new one */
        }
        /* flush what zstd holds back */
        for (;;) {
            ZSTD_outBuffer ob = {buf, sizeof(buf), 0};
            ZSTD_inBuffer none = {NULL, 0, 0};
            size_t r = ZSTD_decompressStream(d->zs, &ob, &none);
            if (ZSTD_isError(r))
                return KH_HD_EDATA;
            int e = emit(d, buf, ob.pos, out, arg);
            if (e)
                return e;
            if (ob.pos < sizeof(buf))
                break;
        }
        return 0;
    }
    d->z.next_in = (Bytef *)(uintptr_t)in;
    d->z.avail_in = (uInt)n;
    while (d->z.avail_in > 0) {
        if (d->ended) {
            if (d->kind != KH_HD_GZIP)
                return KH_HD_EDATA;
            /* another gzip member */
            if (inflateReset(&d->z) != Z_OK)
                return KH_HD_EDATA;
            d->ended = 0;
        }
        d->z.next_out = (Bytef *)buf;
        d->z.avail_out = sizeof(buf);
        int r = inflate(&d->z, Z_NO_FLUSH);
        if (r != Z_OK && r != Z_STREAM_END && r != Z_BUF_ERROR)
            return KH_HD_EDATA;
        int e = emit(d, buf, sizeof(buf) - d->z.avail_out, out, arg);
        if (e)
            return e;
        if (r == Z_STREAM_END)
            d->ended = 1;
        else if (r == Z_BUF_ERROR && d->z.avail_out == sizeof(buf))
            break; /* no progress: needs more input */
    }
    /* output still inside zlib (input all taken, output block was full) */
    while (!d->ended) {
        d->z.next_out = (Bytef *)buf;
        d->z.avail_out = sizeof(buf);
        int r = inflate(&d->z, Z_NO_FLUSH);
        if (r != Z_OK && r != Z_STREAM_END && r != Z_BUF_ERROR)
            return KH_HD_EDATA;
        size_t got = sizeof(buf) - d->z.avail_out;
        int e = emit(d, buf, got, out, arg);
        if (e)
            return e;
        if (r == Z_STREAM_END)
            d->ended = 1;
        if (got == 0)
            break;
    }
    return 0;
}

int kh_hd_finish(kh_hd *d)
{
    return d->ended ? 0 : KH_HD_ETRUNC;
}

void kh_hd_free(kh_hd *d)
{
    if (d == NULL)
        return;
    if (d->kind == KH_HD_ZSTD)
        ZSTD_freeDStream(d->zs);
    else
        inflateEnd(&d->z);
    free(d);
}

const char *kh_hd_error_reason(int err)
{
    switch (err) {
    case KH_HD_EDATA:
        return "corrupt compressed body";
    case KH_HD_ETOOBIG:
        return "response body too large";
    case KH_HD_ETRUNC:
        return "truncated compressed body";
    default:
        return "decode error";
    }
}
