/* kh_compress.c: response compression (see kh_compress.h).
 * Owns:  z_stream / BrotliEncoderState / ZSTD_CCtx and a malloc'd output buffer per encoder.
 * In:    Accept-Encoding and response fields (choice); body bytes (encoding).
 * Out:   a coding, compressed bytes.
 * Never: touches I/O or a stream. */
#include "kh_compress.h"

#include <brotli/encode.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "kh_err.h"
#include "kh_stream.h"

const char *kh_compress_name(int coding)
{
    switch (coding) {
    case KH_CODING_GZIP: return "gzip";
    case KH_CODING_BR: return "br";
    case KH_CODING_ZSTD: return "zstd";
    default: return NULL;
    }
}

static int ieq(const char *p, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    if (n != m)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c | 0x20);
        if (c != lit[i])
            return 0;
    }
    return 1;
}

/* qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] ), in thousandths; -1 if bad */
static int qvalue(const char *p, size_t n)
{
    if (n == 0 || (p[0] != '0' && p[0] != '1') || n > 5 || (n > 1 && p[1] != '.'))
        return -1;
    int v = (p[0] - '0') * 1000, scale = 100;
    for (size_t i = 2; i < n; i++, scale /= 10) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        v += (p[i] - '0') * scale;
    }
    return v > 1000 ? -1 : v;
}

int kh_compress_negotiate(kh_str ae)
{
    if (ae.ptr == NULL)
        return KH_CODING_NONE;
    int q[4] = {-1, -1, -1, -1}, star = -1; /* by coding; -1: not named */
    const char *p = ae.ptr, *end = ae.ptr + ae.len;
    while (p < end) {
        const char *e = memchr(p, ',', (size_t)(end - p));
        if (e == NULL)
            e = end;
        /* one element: token *( OWS ";" OWS param ) */
        const char *semi = memchr(p, ';', (size_t)(e - p));
        const char *ne = semi ? semi : e;
        while (p < ne && (*p == ' ' || *p == '\t'))
            p++;
        while (ne > p && (ne[-1] == ' ' || ne[-1] == '\t'))
            ne--;
        int weight = 1000;
        if (semi) {
            const char *a = semi + 1;
            while (a < e && (*a == ' ' || *a == '\t'))
                a++;
            const char *b = e;
            while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
                b--;
            if (b - a >= 2 && (a[0] == 'q' || a[0] == 'Q') && a[1] == '=')
                weight = qvalue(a + 2, (size_t)(b - a - 2));
            if (weight < 0)
                weight = 0; /* a malformed weight: treat the coding as refused */
        }
        size_t tl = (size_t)(ne - p);
        if (ieq(p, tl, "gzip") || ieq(p, tl, "x-gzip"))
            q[KH_CODING_GZIP] = weight;
        else if (ieq(p, tl, "br"))
            q[KH_CODING_BR] = weight;
        else if (ieq(p, tl, "zstd"))
            q[KH_CODING_ZSTD] = weight;
        else if (tl == 1 && *p == '*')
            star = weight;
        p = e + 1;
    }
    static const int pref[] = {KH_CODING_ZSTD, KH_CODING_BR, KH_CODING_GZIP};
    int best = KH_CODING_NONE, best_q = 0;
    for (size_t i = 0; i < 3; i++) {
        int c = pref[i], w = q[c] >= 0 ? q[c] : star;
        if (w > best_q) {
            best = c;
            best_q = w;
        }
    }
    return best;
}

static int prefix(const char *p, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    return n >= m && ieq(p, m, lit);
}

static int suffix(const char *p, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    return n >= m && ieq(p + n - m, m, lit);
}

int kh_compress_type_ok(kh_str ct)
{
    const char *p = ct.ptr;
    size_t n = ct.len;
    if (p == NULL)
        return 0;
    const char *semi = memchr(p, ';', n);
    if (semi)
        n = (size_t)(semi - p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;
    if (prefix(p, n, "text/"))
        return 1;
    static const char *const exact[] = {
        "application/json",       "application/javascript", "application/x-javascript",
        "application/ecmascript", "application/xml",        "image/svg+xml",
        "application/wasm",       "font/ttf",               "font/otf",
        "application/x-ndjson",   "application/graphql-response+json",
    };
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (ieq(p, n, exact[i]))
            return 1;
    return (prefix(p, n, "application/") && (suffix(p, n, "+json") || suffix(p, n, "+xml")));
}

int kh_compress_choose(const kh_limits *l, int status, int head_method, kh_str ae,
                       const kh_header *h, size_t n, int64_t content_length, int *coding)
{
    *coding = KH_CODING_NONE;
    if (!l->compress || head_method || status < 200 || status == 204 || status == 206 ||
        status == 304)
        return 0;
    if (content_length >= 0 && (uint64_t)content_length < l->compress_min_bytes)
        return 0;
    int typed = 0;
    for (size_t i = 0; i < n; i++) {
        kh_str nm = h[i].name;
        if (nm.len == 12 && kh_str_ieq_lower(nm, "content-type", 12))
            typed = kh_compress_type_ok(h[i].value);
        else if (nm.len == 16 && kh_str_ieq_lower(nm, "content-encoding", 16))
            return 0; /* never twice, never over the app's own coding */
        else if (nm.len == 13 && kh_str_ieq_lower(nm, "content-range", 13))
            return 0;
    }
    if (!typed)
        return 0;
    *coding = kh_compress_negotiate(ae);
    return 1;
}

struct kh_compress {
    int coding;
    char *out;
    size_t len, cap;
    union {
        z_stream gz;
        BrotliEncoderState *br;
        ZSTD_CCtx *zs;
    } u;
};

static int grow(kh_compress *z, size_t want)
{
    if (z->cap - z->len >= want)
        return 0;
    size_t cap = z->cap ? z->cap : 4096;
    while (cap - z->len < want)
        cap *= 2;
    char *p = realloc(z->out, cap);
    if (p == NULL)
        return KH_ENOMEM;
    z->out = p;
    z->cap = cap;
    return 0;
}

kh_compress *kh_compress_new(int coding, const kh_limits *l, int64_t size_hint)
{
    kh_compress *z = calloc(1, sizeof *z);
    if (z == NULL)
        return NULL;
    z->coding = coding;
    int ok = 0;
    switch (coding) {
    case KH_CODING_GZIP:
        /* windowBits 15 + 16: a gzip wrapper (RFC 1952); memLevel 8, zlib's default */
        ok = deflateInit2(&z->u.gz, (int)l->compress_gzip_level, Z_DEFLATED, 15 + 16, 8,
                          Z_DEFAULT_STRATEGY) == Z_OK;
        break;
    case KH_CODING_BR:
        z->u.br = BrotliEncoderCreateInstance(NULL, NULL, NULL);
        if (z->u.br) {
            BrotliEncoderSetParameter(z->u.br, BROTLI_PARAM_QUALITY, (uint32_t)l->compress_br_level);
            /* a 256 KiB window (the default 4 MiB one costs that much per open stream) */
            BrotliEncoderSetParameter(z->u.br, BROTLI_PARAM_LGWIN, 18);
            if (size_hint > 0)
                BrotliEncoderSetParameter(z->u.br, BROTLI_PARAM_SIZE_HINT,
                                          size_hint > (1 << 30) ? 1u << 30 : (uint32_t)size_hint);
            ok = 1;
        }
        break;
    case KH_CODING_ZSTD:
        z->u.zs = ZSTD_createCCtx();
        if (z->u.zs) {
            ZSTD_CCtx_setParameter(z->u.zs, ZSTD_c_compressionLevel, (int)l->compress_zstd_level);
            /* a known size lets zstd pick a window no larger than the input */
            if (size_hint >= 0)
                ZSTD_CCtx_setPledgedSrcSize(z->u.zs, (unsigned long long)size_hint);
            else
                ZSTD_CCtx_setParameter(z->u.zs, ZSTD_c_windowLog, 19);
            ok = 1;
        }
        break;
    }
    if (!ok) {
        free(z);
        return NULL;
    }
    return z;
}

static int write_gzip(kh_compress *z, const char *p, size_t n, int fin)
{
    z_stream *s = &z->u.gz;
    s->next_in = (Bytef *)(uintptr_t)p;
    s->avail_in = (uInt)n;
    int mode = fin ? Z_FINISH : Z_SYNC_FLUSH;
    for (;;) {
        if (grow(z, deflateBound(s, s->avail_in) + 64) != 0)
            return KH_ENOMEM;
        s->next_out = (Bytef *)z->out + z->len;
        s->avail_out = (uInt)(z->cap - z->len);
        int r = deflate(s, mode);
        z->len = z->cap - s->avail_out;
        if (r == Z_STREAM_END)
            return 0;
        if (r != Z_OK && r != Z_BUF_ERROR)
            return KH_EPROTO;
        if (s->avail_in == 0 && s->avail_out != 0)
            return 0; /* flushed: deflate had room to spare */
    }
}

static int write_br(kh_compress *z, const char *p, size_t n, int fin)
{
    const uint8_t *in = (const uint8_t *)p;
    size_t avail_in = n;
    BrotliEncoderOperation op = fin ? BROTLI_OPERATION_FINISH : BROTLI_OPERATION_FLUSH;
    for (;;) {
        if (grow(z, n / 2 + 1024) != 0)
            return KH_ENOMEM;
        uint8_t *out = (uint8_t *)z->out + z->len;
        size_t avail_out = z->cap - z->len;
        if (!BrotliEncoderCompressStream(z->u.br, op, &avail_in, &in, &avail_out, &out, NULL))
            return KH_EPROTO;
        z->len = z->cap - avail_out;
        if (avail_in == 0 && !BrotliEncoderHasMoreOutput(z->u.br) &&
            (!fin || BrotliEncoderIsFinished(z->u.br)))
            return 0;
    }
}

static int write_zstd(kh_compress *z, const char *p, size_t n, int fin)
{
    ZSTD_inBuffer in = {p, n, 0};
    ZSTD_EndDirective op = fin ? ZSTD_e_end : ZSTD_e_flush;
    for (;;) {
        if (grow(z, ZSTD_compressBound(in.size - in.pos) + 64) != 0)
            return KH_ENOMEM;
        ZSTD_outBuffer out = {z->out + z->len, z->cap - z->len, 0};
        size_t left = ZSTD_compressStream2(z->u.zs, &out, &in, op);
        z->len += out.pos;
        if (ZSTD_isError(left))
            return KH_EPROTO;
        if (left == 0 && in.pos == in.size)
            return 0;
    }
}

int kh_compress_write(kh_compress *z, const char *p, size_t n, int fin)
{
    switch (z->coding) {
    case KH_CODING_GZIP: return write_gzip(z, p, n, fin);
    case KH_CODING_BR: return write_br(z, p, n, fin);
    case KH_CODING_ZSTD: return write_zstd(z, p, n, fin);
    default: return KH_EPROTO;
    }
}

const char *kh_compress_out(const kh_compress *z, size_t *len)
{
    *len = z->len;
    return z->out ? z->out : "";
}

void kh_compress_consumed(kh_compress *z)
{
    z->len = 0;
}

void kh_compress_free(kh_compress *z)
{
    if (z == NULL)
        return;
    switch (z->coding) {
    case KH_CODING_GZIP: deflateEnd(&z->u.gz); break;
    case KH_CODING_BR: BrotliEncoderDestroyInstance(z->u.br); break;
    case KH_CODING_ZSTD: ZSTD_freeCCtx(z->u.zs); break;
    }
    free(z->out);
    free(z);
}
