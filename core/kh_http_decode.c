/* kh_http_decode.c: streaming gzip/deflate (zlib) and zstd (libzstd) decoding of response
 * bodies, bounded by max_out.
 * Owns:  the z_stream or ZSTD_DStream of one body and a 16 KiB output block on the stack.
 * In:    encoded bytes; the end of the body.
 * Out:   decoded bytes through the caller's callback.
 * Never: grows past max_out decoded bytes; accepts bytes after the end of the compressed stream
 *        (a second gzip member is decoded, as gzip(1) does; trailing garbage is KH_HD_EDATA);
 *        gives a verdict on a zstd body that depends on how its bytes were split. libzstd
 *        decodes a frame found whole in one call's input in a single pass, with other checks
 *        than its streaming path (a dictionary ID it has no dictionary for fails there and
 *        passes streamed; so does a window over its limit), and Debian's build also reads the
 *        pre-1.0 "legacy" formats, which have streaming quirks of their own (fuzz_h2_client
 *        found both). So each frame's header is held here until whole, checked (RFC 8878's
 *        magic or a skippable frame, no dictionary, the reserved bit clear, a window of at most
 *        8 MiB: RFC 9659's bound for HTTP) and fed to libzstd alone: the frame is then always
 *        streamed. */
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
    /* zstd: a frame's header (at the start and after each frame's end) is held here until
     * whole (at most 18 bytes) */
    int at_frame;
    unsigned char hdr[18];
    size_t hdr_len;
};

/* RFC 9659 §3: HTTP's zstd decoders support windows up to 8 MiB and encoders make none larger */
#define ZSTD_HTTP_WINDOW_LOG 23
#define ZSTD_HTTP_WINDOW_MAX ((uint64_t)1 << ZSTD_HTTP_WINDOW_LOG)

static uint64_t le(const unsigned char *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;)
        v = v << 8 | p[i];
    return v;
}

/* The frame header held in h[0..n): the bytes the whole header takes (more than n: wait for
 * them), or 0 when it is whole and acceptable, or -1 when it is refused. RFC 8878 §3.1.1.1. */
static int zstd_header(const unsigned char *h, size_t n, size_t *need)
{
    if (n < 4) {
        *need = 4;
        return 1;
    }
    uint32_t magic = (uint32_t)le(h, 4);
    if ((magic & 0xFFFFFFF0u) == 0x184D2A50u) { /* skippable: magic, 4-byte size, data */
        *need = 8;
        return n < 8;
    }
    if (magic != 0xFD2FB528u)
        return -1; /* the legacy formats' magics among others */
    if (n < 5) {
        *need = 5;
        return 1;
    }
    unsigned fhd = h[4], fcs_flag = fhd >> 6, single = (fhd >> 5) & 1, did_flag = fhd & 3;
    static const size_t did_size[4] = {0, 1, 2, 4}, fcs_size[4] = {0, 2, 4, 8};
    size_t wd = single ? 0 : 1, did = did_size[did_flag];
    size_t fcs = fcs_flag == 0 && single ? 1 : fcs_size[fcs_flag];
    *need = 5 + wd + did + fcs;
    if (n < *need)
        return 1;
    if (fhd & 8)
        return -1; /* the reserved bit */
    if (le(h + 5 + wd, did) != 0)
        return -1; /* a dictionary: HTTP's zstd coding has none */
    uint64_t window;
    if (single) {
        window = le(h + 5 + did, fcs);
        if (fcs == 2)
            window += 256; /* RFC 8878 §3.1.1.1.4: the 2-byte field is offset by 256 */
    } else {
        unsigned exp = h[5] >> 3, mant = h[5] & 7;
        uint64_t base = (uint64_t)1 << (10 + exp);
        window = base + base / 8 * mant;
    }
    return window <= ZSTD_HTTP_WINDOW_MAX ? 0 : -1;
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
        /* what zstd_header allows: libzstd's own check then never refuses what it let through */
        ZSTD_DCtx_setParameter(d->zs, ZSTD_d_windowLogMax, ZSTD_HTTP_WINDOW_LOG);
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
                /* a frame starts: hold its header until whole, check it, then feed it alone */
                d->ended = 0;
                size_t need;
                int h;
                while ((h = zstd_header(d->hdr, d->hdr_len, &need)) > 0 && ib.pos < ib.size)
                    while (d->hdr_len < need && ib.pos < ib.size)
                        d->hdr[d->hdr_len++] = ((const unsigned char *)in)[ib.pos++];
                if (h < 0)
                    return KH_HD_EDATA;
                if (h > 0)
                    break; /* the rest of the header is in a later piece */
                /* a header and no block: libzstd takes all of it and gives nothing yet */
                ZSTD_inBuffer hb = {d->hdr, d->hdr_len, 0};
                ZSTD_outBuffer ob = {buf, sizeof(buf), 0};
                size_t r = ZSTD_decompressStream(d->zs, &ob, &hb);
                if (ZSTD_isError(r) || hb.pos != hb.size || ob.pos != 0)
                    return KH_HD_EDATA;
                d->at_frame = 0;
                d->hdr_len = 0;
                if (r == 0) { /* an empty skippable frame ends with its header */
                    d->ended = 1;
                    d->at_frame = 1;
                }
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
