/* kh_h2_fields.c: the RFC 9113 §8 checks of a request's fields, made by us, not nghttp2.
 *
 * Why ours: nghttp2's HTTP messaging checks (nghttp2_http_on_header and friends, on unless
 * nghttp2_option_set_no_http_messaging) cost ~1,340 instructions an h2c request (bench/h2.sh
 * PARTS=ir, h2load -c 64 -m 10; nghttp2_http_on_header alone 1,143): a lookup table per byte of
 * every name and value, a call per field, flags kept on nghttp2's stream. kh_h2.c's on_header sees
 * every field anyway; here the same rules cost ~440 (pseudo 189, regular 109, value_ok 87, the
 * rest 57): values go through the HTTP/1.1 parser's own value scan (kh_h1_value_bytes_ok, 16
 * bytes a round; it replaced a word scan of ours at no cost: 12,340 -> 12,332 a request,
 * bench/results/h2-20261202-142643.txt, -142650.txt), names of a-z and '-' 8 bytes at a time,
 * a pseudo-header's name is compared whole (no byte check), a regular name's length picks the few
 * names that need a second look, and the block's state is one word on the connection. Whole request: 14,455 -> 13,508 (bench/README.md).
 *
 * The rules, as nghttp2 1.52 made them for a server with no on_invalid_header callback (every
 * breach a stream error, PROTOCOL_ERROR):
 *  - a name is lower-case tchar (RFC 9110 §5.6.2); a pseudo-header is ':' and one or more of
 *    them. (nghttp2 also refused '*', which tchar allows: we take it.)
 *  - a value has no NUL, CR, LF, other control byte but HTAB, or DEL, and no leading or
 *    trailing SP or HTAB (RFC 9113 §8.2.1); :method is a token, :path is visible bytes (and
 *    obs-text), :scheme is a URI scheme; :authority and host take what HTTP/1.1 takes in Host
 *    (kh_h1_host_ok: no userinfo, a port up to 65535; nghttp2 only checked their bytes, and
 *    kh_h2.c made this check at the head's end, so the outcome is the one we had).
 *  - :method, :scheme, :path, :authority, :protocol and host at most once each and never empty;
 *    pseudo-headers before every regular field and never in trailers; no other pseudo-header.
 *  - connection, keep-alive, proxy-connection, transfer-encoding and upgrade are refused; te
 *    is "trailers" or nothing (§8.2.2); content-length is one decimal number that fits int64.
 *  - at the head's end (kh_h2_fields_request_end): a CONNECT without :protocol has :authority
 *    and neither :scheme nor :path (§8.5); any other request has :method, :scheme, :path and
 *    :authority or host, a :protocol only on CONNECT with :authority (RFC 8441 §4), and for
 *    http/https a :path starting with '/' or "*" on OPTIONS (§8.3.1).
 * The frame-level ones (trailers end the stream; the DATA add up to content-length) are in
 * kh_h2.c, where the frames are. */
#include "kh_h2_fields.h"

#include <string.h>

#include "kh_h1_parse.h"

enum { C_NAME = 1, C_METHOD = 2, C_PATH = 4 };

/* Per byte: C_NAME lower-case tchar, C_METHOD tchar, C_PATH 0x21-0x7e and obs-text (a value's
 * bytes are kh_h1_value_bytes_ok's). */
static const uint8_t cls[256] = {
    0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0, /*  */
    0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0, /*  */
    0,  7,  4,  7,  7,  7,  7,  7,  4,  4,  7,  7,  4,  7,  7,  4, /*   !"#$%&'()*+,-./ */
    7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  4,  4,  4,  4,  4,  4, /* 0-9:;<=>? */
    4,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6, /* @A-O */
    6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  4,  4,  4,  7,  7, /* P-Z[\]^_ */
    7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7, /* `a-o */
    7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  4,  7,  4,  7,  0, /* p-z{|}~ DEL */
    4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4, /* obs-text */
    4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4, /*  */
    4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4, /*  */
    4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4, /*  */
    4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4, /*  */
    4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4, /*  */
    4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4, /*  */
    4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4, /*  */
};

static int all_of(const uint8_t *p, size_t n, unsigned c)
{
    for (size_t i = 0; i < n; i++)
        if (!(cls[p[i]] & c))
            return 0;
    return 1;
}

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull
#define LOWS 0x7f7f7f7f7f7f7f7full


/* p[0..n) equals lit (n == strlen(lit), 4 <= n <= 24): two or three word loads, overlapping;
 * inlined with n constant (libc's memcmp was called, ~170 instructions a request) */
static inline int is(const uint8_t *p, size_t n, const char *lit)
{
    if (n < 8)
        return kh_load_u32(p) == kh_load_u32(lit) &&
               kh_load_u32(p + n - 4) == kh_load_u32(lit + n - 4);
    if (n > 16 && kh_load_u64(p + 8) != kh_load_u64(lit + 8))
        return 0;
    return kh_load_u64(p) == kh_load_u64(lit) && kh_load_u64(p + n - 8) == kh_load_u64(lit + n - 8);
}

/* Eight bytes of a name, each a-z or '-' (the usual names' alphabet): exact per byte (the
 * additions carry into no neighbour: every byte is masked to 7 bits first). */
static inline int word_lower(uint64_t x)
{
    uint64_t lo = x & LOWS;
    uint64_t ge_a = lo + (0x80 - 'a') * ONES;     /* high bit: byte >= 'a' */
    uint64_t gt_z = lo + (0x80 - 'z' - 1) * ONES; /* high bit: byte > 'z' */
    uint64_t d = (x ^ ('-' * ONES)) & LOWS;
    uint64_t not_dash = ((d + LOWS) | x) & HIGHS; /* high bit: byte != '-' */
    return (((ge_a & ~gt_z & ~x) | ~not_dash) & HIGHS) == HIGHS;
}

/* A regular field name: lower-case tchar. Words of a-z and '-' pass 8 bytes at a time (the
 * last one overlapping); the table sees the rest. */
static int name_ok(const uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        if (!word_lower(kh_load_u64(p + i)))
            return all_of(p + i, n - i, C_NAME);
    if (i == n || (n >= 8 && word_lower(kh_load_u64(p + n - 8))))
        return 1;
    return all_of(p + i, n - i, C_NAME);
}

/* A field value (§8.2.1): no leading or trailing SP or HTAB, and the bytes HTTP/1.1 takes in a
 * value (kh_h1_value_bytes_ok: no control byte but HTAB, no DEL; obs-text is fine). */
static int value_ok(const uint8_t *p, size_t n)
{
    if (n == 0)
        return 1;
    if (p[0] == ' ' || p[0] == '\t' || p[n - 1] == ' ' || p[n - 1] == '\t')
        return 0;
    return kh_h1_value_bytes_ok((const char *)p, n);
}

static int ieq(const uint8_t *p, size_t n, const char *lit, size_t litlen)
{
    if (n != litlen)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((p[i] | (p[i] >= 'A' && p[i] <= 'Z' ? 0x20 : 0)) != (uint8_t)lit[i])
            return 0;
    return 1;
}

/* Sets bit once; -1 if it was set already or the value is empty. */
static int once(kh_h2_fields *f, uint32_t bit, size_t vlen)
{
    if ((f->flags & bit) || vlen == 0)
        return -1;
    f->flags |= bit;
    return 0;
}

/* :path bytes: visible ASCII and obs-text, 8 at a time (no byte <= 0x20, none 0x7f) */
static int path_ok(const uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x = kh_load_u64(p + i), y = x ^ (0x7f * ONES);
        if (((x - 0x21 * ONES) & ~x & HIGHS) | ((y - ONES) & ~y & HIGHS))
            return 0;
    }
    return all_of(p + i, n - i, C_PATH);
}

static int scheme_ok(const uint8_t *p, size_t n)
{
    if (n == 0 || !((p[0] | 0x20) >= 'a' && (p[0] | 0x20) <= 'z'))
        return 0;
    for (size_t i = 1; i < n; i++) {
        uint8_t ch = p[i];
        if (!(((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z') || (ch >= '0' && ch <= '9') ||
              ch == '+' || ch == '-' || ch == '.'))
            return 0;
    }
    return 1;
}

/* (pseudo and regular are kept apart, not inlined into kh_h2_fields_check: each call then saves
 * only the registers its own path uses; ~40 instructions an h2load request, bench/h2.sh PARTS=ir) */
__attribute__((noinline)) static int pseudo(kh_h2_fields *f, const uint8_t *name, size_t nlen,
                                            const uint8_t *v, size_t vlen)
{
    if (f->flags & (KH_H2F_REGULAR | KH_H2F_TRAILER))
        return -1;
    switch (nlen) {
    case 5:
        if (!is(name, 5, ":path") || once(f, KH_H2F_PATH, vlen) || !path_ok(v, vlen))
            return -1;
        if (v[0] == '/')
            f->flags |= KH_H2F_SLASH;
        else if (vlen == 1 && v[0] == '*')
            f->flags |= KH_H2F_STAR;
        return 0;
    case 7:
        if (is(name, 7, ":method")) {
            if (once(f, KH_H2F_METHOD, vlen) || !all_of(v, vlen, C_METHOD))
                return -1;
            if (vlen == 7 && is(v, 7, "CONNECT"))
                f->flags |= KH_H2F_CONNECT;
            else if (vlen == 7 && is(v, 7, "OPTIONS"))
                f->flags |= KH_H2F_OPTIONS;
            return 0;
        }
        if (!is(name, 7, ":scheme") || once(f, KH_H2F_SCHEME, vlen))
            return -1;
        /* http or https, any case: one word compare, no byte loop */
        if ((vlen == 4 || (vlen == 5 && (v[4] | 0x20) == 's')) &&
            (kh_load_u32(v) | 0x20202020u) == kh_load_u32("http")) {
            f->flags |= KH_H2F_HTTP;
            return 0;
        }
        return scheme_ok(v, vlen) ? 0 : -1;
    case 9: /* RFC 8441: we always send SETTINGS_ENABLE_CONNECT_PROTOCOL */
        if (!is(name, 9, ":protocol") || once(f, KH_H2F_PROTOCOL, vlen) || !value_ok(v, vlen))
            return -1;
        return 0;
    case 10:
        /* RFC 9113 §8.3.1: what HTTP/1.1 takes in Host (no userinfo, a port up to 65535):
         * stricter than nghttp2's authority bytes, and the same stream error */
        if (!is(name, 10, ":authority") || once(f, KH_H2F_AUTHORITY, vlen) ||
            !kh_h1_host_ok((kh_str){(const char *)v, vlen}))
            return -1;
        return 0;
    default:
        return -1; /* :status and every unknown one */
    }
}

/* content-length: one decimal number that fits int64 (and only one such field). */
static int content_length(kh_h2_fields *f, const uint8_t *v, size_t vlen)
{
    if (f->clen != -1 || vlen == 0)
        return -1;
    int64_t n = 0;
    for (size_t i = 0; i < vlen; i++) {
        unsigned d = (unsigned)v[i] - '0';
        if (d > 9 || n > (INT64_MAX - (int64_t)d) / 10)
            return -1;
        n = n * 10 + (int64_t)d;
    }
    f->clen = n;
    return 0;
}

void kh_h2_fields_begin(kh_h2_fields *f, int trailer)
{
    f->flags = trailer ? KH_H2F_TRAILER : 0;
    f->urgency = 3;
    f->incremental = 0;
    if (!trailer)
        f->clen = -1;
}

__attribute__((noinline)) static int regular(kh_h2_fields *f, const uint8_t *name, size_t nlen,
                                             const uint8_t *value, size_t vlen)
{
    f->flags |= KH_H2F_REGULAR;
    if (!name_ok(name, nlen))
        return -1;
    /* the names that need more than the value check, told apart by length first */
    switch (nlen) {
    case 2:
        if (name[0] == 't' && name[1] == 'e')
            return ieq(value, vlen, "trailers", 8) ? 0 : -1;
        break;
    case 4:
        if (is(name, 4, "host"))
            return once(f, KH_H2F_HOST, vlen) || !kh_h1_host_ok((kh_str){(const char *)value, vlen})
                       ? -1
                       : 0;
        break;
    case 7:
        if (is(name, 7, "upgrade"))
            return -1;
        break;
    case 8:
        if (!is(name, 8, "priority"))
            break;
        if (!value_ok(value, vlen))
            return -1;
        /* RFC 9218 in the head, as nghttp2 read it (trailers' are not); one that does not
         * parse leaves the stream at the defaults */
        if (!(f->flags & (KH_H2F_TRAILER | KH_H2F_BAD_PRIORITY))) {
            if (kh_h2_fields_priority(value, vlen, &f->urgency, &f->incremental) == 0)
                f->flags |= KH_H2F_PRIORITY;
            else
                f->flags = (f->flags & ~(uint32_t)KH_H2F_PRIORITY) | KH_H2F_BAD_PRIORITY;
        }
        return 0;
    case 10:
        if (is(name, 10, "connection") || is(name, 10, "keep-alive"))
            return -1;
        break;
    case 14:
        if (is(name, 14, "content-length"))
            return content_length(f, value, vlen);
        break;
    case 16:
        if (is(name, 16, "proxy-connection"))
            return -1;
        break;
    case 17:
        if (is(name, 17, "transfer-encoding"))
            return -1;
        break;
    default:
        break;
    }
    return value_ok(value, vlen) ? 0 : -1;
}

int kh_h2_fields_check(kh_h2_fields *f, const uint8_t *name, size_t nlen, const uint8_t *value,
                       size_t vlen)
{
    if (nlen == 0)
        return -1;
    if (name[0] == ':') /* one of five names, compared whole: no byte check */
        return pseudo(f, name, nlen, value, vlen);
    return regular(f, name, nlen, value, vlen);
}

int kh_h2_fields_request_end(kh_h2_fields *f, int end_stream)
{
    uint32_t fl = f->flags;
    if ((fl & (KH_H2F_CONNECT | KH_H2F_PROTOCOL)) == KH_H2F_CONNECT) {
        if ((fl & (KH_H2F_SCHEME | KH_H2F_PATH)) || !(fl & KH_H2F_AUTHORITY))
            return -1;
        f->clen = -1;
    } else {
        const uint32_t need = KH_H2F_METHOD | KH_H2F_SCHEME | KH_H2F_PATH;
        if ((fl & need) != need || !(fl & (KH_H2F_AUTHORITY | KH_H2F_HOST)))
            return -1;
        if ((fl & KH_H2F_PROTOCOL) &&
            (fl & (KH_H2F_CONNECT | KH_H2F_AUTHORITY)) != (KH_H2F_CONNECT | KH_H2F_AUTHORITY))
            return -1;
        if ((fl & KH_H2F_HTTP) && !(fl & KH_H2F_SLASH) &&
            (fl & (KH_H2F_OPTIONS | KH_H2F_STAR)) != (KH_H2F_OPTIONS | KH_H2F_STAR))
            return -1;
    }
    if (end_stream && f->clen > 0)
        return -1;
    return 0;
}

/* ---- RFC 9218 priority: a Structured Fields dictionary (RFC 8941 §3.2) ---- */

static size_t sf_key(const uint8_t *p, size_t n, size_t i)
{
    if (i >= n || !((p[i] >= 'a' && p[i] <= 'z') || p[i] == '*'))
        return 0;
    size_t j = i + 1;
    while (j < n && ((p[j] >= 'a' && p[j] <= 'z') || (p[j] >= '0' && p[j] <= '9') || p[j] == '_' ||
                     p[j] == '-' || p[j] == '.' || p[j] == '*'))
        j++;
    return j - i;
}

/* A bare item at p[*i] (integer, decimal, string, token, byte sequence, boolean). Returns 0 and
 * moves *i past it, or -1. *kind: 'i' integer (value in *num), 'b' boolean (*num 0/1), else '?'. */
static int sf_bare(const uint8_t *p, size_t n, size_t *i, int *kind, int64_t *num)
{
    size_t j = *i;
    *kind = '?';
    if (j >= n)
        return -1;
    uint8_t ch = p[j];
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        int neg = ch == '-';
        j += (size_t)neg;
        size_t d0 = j;
        int64_t v = 0;
        while (j < n && p[j] >= '0' && p[j] <= '9' && j - d0 < 15)
            v = v * 10 + (p[j++] - '0');
        if (j == d0 || (j < n && p[j] >= '0' && p[j] <= '9'))
            return -1;
        if (j < n && p[j] == '.') { /* decimal: at most 12 integer and 3 fraction digits */
            size_t f0 = ++j;
            while (j < n && p[j] >= '0' && p[j] <= '9' && j - f0 < 3)
                j++;
            if (j == f0 || j - 1 - d0 > 16 || f0 - 1 - d0 > 12 || (j < n && p[j] >= '0' && p[j] <= '9'))
                return -1;
        } else {
            *kind = 'i';
            *num = neg ? -v : v;
        }
    } else if (ch == '"') {
        for (j++;; j++) {
            if (j >= n || p[j] < 0x20 || p[j] > 0x7e)
                return -1;
            if (p[j] == '\\') {
                if (++j >= n || (p[j] != '"' && p[j] != '\\'))
                    return -1;
            } else if (p[j] == '"') {
                j++;
                break;
            }
        }
    } else if (((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z') || ch == '*') {
        for (j++; j < n && ((cls[p[j]] & C_METHOD) || p[j] == ':' || p[j] == '/'); j++)
            ;
    } else if (ch == ':') {
        for (j++; j < n && p[j] != ':'; j++)
            if (!((p[j] | 0x20) >= 'a' && (p[j] | 0x20) <= 'z') && !(p[j] >= '0' && p[j] <= '9') &&
                p[j] != '+' && p[j] != '/' && p[j] != '=')
                return -1;
        if (j++ >= n)
            return -1;
    } else if (ch == '?') {
        if (j + 1 >= n || (p[j + 1] != '0' && p[j + 1] != '1'))
            return -1;
        *kind = 'b';
        *num = p[j + 1] - '0';
        j += 2;
    } else {
        return -1;
    }
    *i = j;
    return 0;
}

/* ";key[=item]" parameters after an item: skipped (RFC 9218 defines none). */
static int sf_params(const uint8_t *p, size_t n, size_t *i)
{
    size_t j = *i;
    while (j < n && p[j] == ';') {
        j++;
        while (j < n && p[j] == ' ')
            j++;
        size_t k = sf_key(p, n, j);
        if (k == 0)
            return -1;
        j += k;
        if (j < n && p[j] == '=') {
            int kind;
            int64_t num;
            j++;
            if (sf_bare(p, n, &j, &kind, &num) != 0)
                return -1;
        }
    }
    *i = j;
    return 0;
}

int kh_h2_fields_priority(const uint8_t *p, size_t n, uint8_t *urgency, uint8_t *incremental)
{
    int u = *urgency, inc = *incremental;
    size_t i = 0;
    while (i < n && p[i] == ' ')
        i++;
    while (i < n) {
        size_t k = sf_key(p, n, i);
        if (k == 0)
            return -1;
        const uint8_t *key = p + i;
        i += k;
        int kind = 'b';
        int64_t num = 1; /* a key alone is boolean true */
        if (i < n && p[i] == '=') {
            i++;
            if (sf_bare(p, n, &i, &kind, &num) != 0) /* (inner lists are not read) */
                return -1;
        }
        if (sf_params(p, n, &i) != 0)
            return -1;
        /* the last value of a key counts; one of the wrong type or range is ignored */
        if (k == 1 && key[0] == 'u' && kind == 'i' && num >= 0 && num <= 7)
            u = (int)num;
        else if (k == 1 && key[0] == 'i' && kind == 'b')
            inc = (int)num;
        while (i < n && (p[i] == ' ' || p[i] == '\t'))
            i++;
        if (i == n)
            break;
        if (p[i++] != ',')
            return -1;
        while (i < n && (p[i] == ' ' || p[i] == '\t'))
            i++;
        if (i == n)
            return -1; /* a trailing comma */
    }
    *urgency = (uint8_t)u;
    *incremental = (uint8_t)inc;
    return 0;
}
