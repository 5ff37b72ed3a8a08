/* kh_h1_parse.c: strict RFC 9112 / RFC 9110 request-head parser, in-place chunked decoder (the
 * sum of the chunk sizes bounded by body_bytes), the HTTP2-Settings check of an h2c Upgrade,
 * and the Host/authority check (exported for other protocols' authority fields).
 * Owns:  nothing but two const tables (byte classes, error statuses); no state between calls
 *        except what the caller keeps in a kh_h1_chunked.
 * In:    the bytes received so far for one request head (prev_len says how many were already seen
 *        by a call that returned KH_EAGAIN); chunked body bytes in a writable buffer.
 * Out:   kh_str slices into the caller's buffer; framing facts; KH_H1_E* codes mapped to a status.
 * Never: allocates, reads at or past len, touches I/O or globals, accepts a lenient form
 *        (bare LF, obs-fold, CL+TE, ...) that another hop could read differently (RFC 9112 §11.2).
 *
 * How a result is defined (so that it cannot depend on how the bytes were split):
 * the head is a sequence of lines cut at LF. Some lines carry an *event*: a line ending in a bare
 * LF, a line whose LF would lie at or past its bound (header_bytes for every line; for the request
 * line also target_bytes + KH_H1_REQLINE_ROOM), the empty line that ends the head, or a request
 * line (always the first line) that ends in CRLF and is not a valid request line. Everything
 * else wrong with a line (a bad byte, a bad Content-Length, ...) is a *content error*.
 *   - No event in the bytes so far: KH_EAGAIN, even if a content error is already visible.
 *   - Otherwise: the first content error in a line before the first event; else the event's own
 *     result (EBARELF, ETARGETLEN / EHEADLEN, or the checks of the complete head).
 * Events are found by memchr for LF alone (and a full parse when the request line's LF is among
 * the new bytes), so a call with prev_len only looks at the new bytes, and every event stays an
 * event when more bytes arrive: each proper prefix of an input gives KH_EAGAIN or the same result
 * as the whole input, whatever prev_len (tests and the fuzzer check).
 * The cost of this rule: a bad header line is reported only once the head ends or overflows (a
 * slow peer is cut by header_bytes and the header timeout), and the parse of a complete head is
 * a single pass, with the rescue scan (settle_*) run only on the error path. A bad request line is
 * answered as soon as its CRLF arrives: an HTTP/0.9 request ("GET /\r\n", no version) would
 * otherwise wait for a blank line its client never sends. */
#include "kh_h1_parse.h"

#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* Room for method, two SP, "HTTP/1.1" and CRLF on top of target_bytes: a request line longer
 * than target_bytes + this is answered 414 before its end arrives. A method of up to 52 bytes
 * still fits beside a target of exactly target_bytes. */
#define KH_H1_REQLINE_ROOM 64
/* RFC 9112 §7.1: chunk-size has no upper bound; we take 16 hex digits (uint64) and cap the whole
 * size line, extensions included, so a peer cannot stream an endless extension. */
#define KH_H1_CHUNK_DIGITS 16
#define KH_H1_CHUNK_LINE 4096
/* RFC 9110 §8.6: a Content-Length must fit what a recipient can represent; 2^53 keeps it exact
 * in a Lua number. */
#define KH_H1_CL_MAX (UINT64_C(1) << 53)

/* ---- byte classes (one 256-byte table, one lookup per byte) ---- */

enum {
    C_TCHAR = 1 << 0,  /* RFC 9110 §5.6.2 tchar */
    C_VALUE = 1 << 1,  /* RFC 9110 §5.5 field-vchar / SP / HTAB, obs-text included */
    C_TARGET = 1 << 2, /* 0x21-0x7E except '?' and '#' (both handled by the scan) */
    C_HOST = 1 << 3,   /* RFC 3986 reg-name: unreserved / sub-delims ('%' checked apart) */
    C_HEX = 1 << 4,
    C_QDTEXT = 1 << 5, /* RFC 9110 §5.6.4 qdtext: HTAB SP 0x21 0x23-5B 0x5D-7E obs-text */
};

/* clang-format off */
#define T_ 0
#define TV (C_VALUE)                                        /* SP, HTAB */
#define TA (C_TCHAR | C_VALUE | C_TARGET | C_HOST | C_QDTEXT) /* ALPHA, '-', '.', '_', '~' */
#define TX (TA | C_HEX)                                     /* DIGIT, A-F, a-f */
#define TD (C_TCHAR | C_VALUE | C_TARGET | C_HOST | C_QDTEXT) /* tchar sub-delims: ! $ & ' * + */
#define TS (C_VALUE | C_TARGET | C_HOST | C_QDTEXT)         /* other sub-delims: ( ) , ; = */
#define TT (C_TCHAR | C_VALUE | C_TARGET | C_QDTEXT)        /* tchar, not host: % ^ ` | */
#define TP (C_VALUE | C_TARGET | C_QDTEXT)                  /* other VCHAR allowed in a target */
#define TO (C_VALUE | C_QDTEXT)                             /* obs-text */

static const uint8_t cls[256] = {
    /* 0x00 */ T_, T_, T_, T_, T_, T_, T_, T_, T_, TV | C_QDTEXT, T_, T_, T_, T_, T_, T_,
    /* 0x10 */ T_, T_, T_, T_, T_, T_, T_, T_, T_, T_, T_, T_, T_, T_, T_, T_,
    /* 0x20  SP !  "  #  $  %  &  '  (  )  *  +  ,  -  .  / */
    TV | C_QDTEXT, TD, C_VALUE | C_TARGET, C_TCHAR | C_VALUE | C_QDTEXT, TD, TT, TD, TD, TS, TS, TD,
    TD, TS, TA, TA, TP,
    /* 0x30  0-9 : ; < = > ? */
    TX, TX, TX, TX, TX, TX, TX, TX, TX, TX, TP, TS, TP, TS, TP, C_VALUE | C_QDTEXT,
    /* 0x40  @ A-O */
    TP, TX, TX, TX, TX, TX, TX, TA, TA, TA, TA, TA, TA, TA, TA, TA,
    /* 0x50  P-Z [ \ ] ^ _ */
    TA, TA, TA, TA, TA, TA, TA, TA, TA, TA, TA, TP, C_VALUE | C_TARGET, TP, TT, TA,
    /* 0x60  ` a-o */
    TT, TX, TX, TX, TX, TX, TX, TA, TA, TA, TA, TA, TA, TA, TA, TA,
    /* 0x70  p-z { | } ~ DEL */
    TA, TA, TA, TA, TA, TA, TA, TA, TA, TA, TA, TP, TT, TP, TA, T_,
    /* 0x80-0xFF obs-text */
    TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO,
    TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO,
    TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO,
    TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO,
    TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO,
    TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO,
    TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO,
    TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO, TO,
};
/* clang-format on */

#define IS(c, k) (cls[(uint8_t)(c)] & (k))

/* Advance p over bytes of class k, stopping before end. Unrolled by 8 with one bound check per
 * round, as picohttpparser does without SSE. */
static inline const char *skip_class(const char *p, const char *end, uint8_t k)
{
    while (end - p >= 8) {
        if (!IS(p[0], k))
            return p;
        if (!IS(p[1], k))
            return p + 1;
        if (!IS(p[2], k))
            return p + 2;
        if (!IS(p[3], k))
            return p + 3;
        if (!IS(p[4], k))
            return p + 4;
        if (!IS(p[5], k))
            return p + 5;
        if (!IS(p[6], k))
            return p + 6;
        if (!IS(p[7], k))
            return p + 7;
        p += 8;
    }
    while (p < end && IS(*p, k))
        p++;
    return p;
}

/* Advance p over field-value bytes (C_VALUE: HTAB, SP, VCHAR, obs-text), stopping before end:
 * with SSE2 (every x86-64) 16 bytes a round, one compare for each excluded range; the table
 * loop takes the tail. A browser's request is mostly values (User-Agent, Accept...): 7,825 ->
 * 7,028 instructions per request with HEADERS=browser, 4,352 -> 4,248 with h2load's two fields
 * (REQUESTS=20000 CONNS=64 bench/callgrind.sh). */
static inline const char *skip_value(const char *p, const char *end)
{
#ifdef __SSE2__
    const __m128i sp = _mm_set1_epi8(0x20), ht = _mm_set1_epi8('\t'), del = _mm_set1_epi8(0x7f);
    const __m128i zero = _mm_setzero_si128();
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        /* 0x00-0x1F but HTAB (the signed compare below 0x20 also takes 0x80-0xFF: masked out),
         * and DEL */
        __m128i ctl = _mm_andnot_si128(_mm_cmplt_epi8(v, zero), _mm_cmplt_epi8(v, sp));
        ctl = _mm_andnot_si128(_mm_cmpeq_epi8(v, ht), ctl);
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_or_si128(ctl, _mm_cmpeq_epi8(v, del)));
        if (m)
            return p + __builtin_ctz(m);
        p += 16;
    }
#endif
    return skip_class(p, end, C_VALUE);
}

int kh_h1_value_bytes_ok(const char *p, size_t n)
{
    return skip_value(p, p + n) == p + n;
}


/* Case-insensitive compare of n bytes against lower-case letters, digits, '-', ':' and '/'.
 * For every byte the parser lets reach here (a tchar, a field-value byte, a target byte),
 * c | 0x20 equals such a character only when c is that character or its upper case: the other
 * candidates are CTLs, which never get here. Word-wise, so a match costs two or three loads
 * (a byte loop here was 15% of a typical parse). n is a constant at every call site. */
static inline int name_is(const char *p, const char *lower, size_t n)
{
    if (n >= 8) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8)
            if ((kh_load_u64(p + i) | UINT64_C(0x2020202020202020)) != kh_load_u64(lower + i))
                return 0;
        return i == n || (kh_load_u64(p + n - 8) | UINT64_C(0x2020202020202020)) ==
                             kh_load_u64(lower + n - 8);
    }
    if (n >= 4)
        return (kh_load_u32(p) | 0x20202020u) == kh_load_u32(lower) &&
               (kh_load_u32(p + n - 4) | 0x20202020u) == kh_load_u32(lower + n - 4);
    for (size_t i = 0; i < n; i++)
        if (((uint8_t)p[i] | 0x20) != (uint8_t)lower[i])
            return 0;
    return 1;
}

static inline int is_ws(char c)
{
    return c == ' ' || c == '\t';
}

/* ---- the event rule (see the top of the file) ---- */

typedef struct scan {
    const char *buf;
    size_t len;
    size_t hb;     /* lim->header_bytes: no LF at or past this index */
    size_t bound;  /* the current line's LF must lie below this index */
    size_t end;    /* min(len, bound): where the current line's scan stops */
    int bound_err; /* KH_H1_EHEADLEN, or KH_H1_ETARGETLEN on the request line */
    int in_rl;     /* scanning the request line: its CRLF is an event for its content errors */
} scan;

static void set_bound(scan *s, size_t bound, int err)
{
    s->bound = bound;
    s->bound_err = err;
    s->end = KH_MIN(s->len, bound);
}

/* The current line has not ended within [.., end): its LF is either still to come or past
 * the bound, and the bytes already say which. */
static ssize_t incomplete(const scan *s)
{
    return s->len >= s->bound ? s->bound_err : KH_EAGAIN;
}

/* A content error err sits in a complete line that ended just before q. Report it only if an
 * event follows (bare LF, the empty line, or header_bytes reached); otherwise wait. */
static ssize_t settle_rest(const scan *s, size_t q, int err)
{
    if (s->in_rl)
        return err; /* the request line ended in CRLF just before q: that is the event */
    size_t end = KH_MIN(s->len, s->hb);
    while (q < end) {
        const char *lf = memchr(s->buf + q, '\n', end - q);
        if (lf == NULL)
            break;
        size_t e = (size_t)(lf - s->buf); /* e >= 2: q follows an earlier LF */
        if (s->buf[e - 1] != '\r' || s->buf[e - 2] == '\n')
            return err;
        q = e + 1;
    }
    return s->len >= s->hb ? err : KH_EAGAIN;
}

/* A content error err was seen at index from of the current line. The line's own events come
 * first: its LF past the bound, or a bare LF ending it. */
static ssize_t settle_line(const scan *s, size_t from, int err)
{
    const char *lf = from < s->end ? memchr(s->buf + from, '\n', s->end - from) : NULL;
    if (lf == NULL)
        return incomplete(s);
    size_t e = (size_t)(lf - s->buf); /* e >= 1: no line starts with LF */
    if (s->buf[e - 1] != '\r')
        return KH_H1_EBARELF;
    return settle_rest(s, e + 1, err);
}

/* A scan stopped at index p on a byte the grammar does not allow there. err_eol is the content
 * error when that byte is the CR of a proper CRLF (the line ended too early). */
static ssize_t stop_at(const scan *s, size_t p, int err_other, int err_eol)
{
    if (p >= s->end)
        return incomplete(s);
    char c = s->buf[p];
    if (c == '\n')
        return KH_H1_EBARELF; /* an unexpected byte would have stopped the scan at the CR */
    if (c == '\r') {
        if (p + 1 >= s->end)
            return incomplete(s);
        if (s->buf[p + 1] == '\n')
            return settle_rest(s, p + 2, err_eol);
        return settle_line(s, p + 1, KH_H1_EBARECR);
    }
    return settle_line(s, p, err_other);
}

/* ---- field values ---- */

/* RFC 3986 §3.2.2 host [ ":" port ], as used by Host (RFC 9110 §7.2) and the authority of
 * absolute-form and authority-form targets. Plausible, not resolvable: reg-name characters with
 * well-formed %XX, or a bracketed IPv6 literal of hex digits, ':' and '.'; port up to 65535. */
static int host_ok(const char *p, size_t n, int need_port)
{
    size_t i = 0;
    if (n == 0)
        return 0;
    if (p[0] == '[') {
        for (i = 1; i < n && (IS(p[i], C_HEX) || p[i] == ':' || p[i] == '.'); i++)
            ;
        if (i == 1 || i >= n || p[i] != ']')
            return 0;
        i++;
    } else {
        for (;;) {
            i = (size_t)(skip_class(p + i, p + n, C_HOST) - p);
            if (i + 2 < n && p[i] == '%' && IS(p[i + 1], C_HEX) && IS(p[i + 2], C_HEX))
                i += 3;
            else
                break;
        }
        if (i == 0)
            return 0; /* ":80": a port without a host */
    }
    if (i == n)
        return !need_port;
    if (p[i] != ':')
        return 0;
    i++;
    if (i == n)
        return !need_port; /* RFC 3986: port = *DIGIT, may be empty */
    if (n - i > 5)
        return 0;
    unsigned port = 0;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        port = port * 10 + (unsigned)(p[i] - '0');
    }
    return port <= 65535;
}

/* RFC 9110 §8.6: Content-Length = 1*DIGIT. A list of identical values ("5, 5", left by a proxy
 * that merged duplicate lines) is accepted per RFC 9112 §6.3 point 5; differing values are a
 * framing error. Empty list elements are refused: a CL is no place for leniency. */
static int parse_cl(const char *p, size_t n, uint64_t *out)
{
    size_t i = 0;
    int have = 0;
    uint64_t first = 0;
    for (;;) {
        uint64_t v = 0;
        size_t d0 = i;
        while (i < n && p[i] >= '0' && p[i] <= '9') {
            v = v * 10 + (uint64_t)(p[i] - '0');
            if (v > KH_H1_CL_MAX) /* checked per digit, so v * 10 + 9 never wraps */
                return KH_H1_EBADCL;
            i++;
        }
        if (i == d0)
            return KH_H1_EBADCL;
        if (have && v != first)
            return KH_H1_EFRAMING;
        first = v;
        have = 1;
        while (i < n && is_ws(p[i]))
            i++;
        if (i == n)
            break;
        if (p[i] != ',')
            return KH_H1_EBADCL;
        i++;
        while (i < n && is_ws(p[i]))
            i++;
    }
    *out = first;
    return 0;
}

/* Facts gathered from Transfer-Encoding lines, judged once the head is complete (a later line
 * may append codings: RFC 9110 §5.3 lets lines combine into one list). */
typedef struct te_facts {
    unsigned present; /* TE lines seen */
    unsigned chunked; /* how many "chunked" codings */
    unsigned other;   /* codings we do not implement */
    int last_chunked; /* the last coding so far is chunked */
} te_facts;

/* RFC 9112 §6.1: Transfer-Encoding = #transfer-coding. Codings are bare tokens here: we
 * implement no coding that takes parameters, and a ';' is refused as malformed (400). Empty list
 * elements are skipped (RFC 9110 §5.6.1.2), but the line must name at least one coding. */
static int parse_te(const char *p, size_t n, te_facts *te)
{
    size_t i = 0;
    int any = 0;
    te->present++;
    while (i < n) {
        size_t t0 = i;
        while (i < n && IS(p[i], C_TCHAR))
            i++;
        size_t tl = i - t0;
        if (tl) {
            any = 1;
            if (tl == 7 && name_is(p + t0, "chunked", 7)) {
                te->chunked++;
                te->last_chunked = 1;
            } else {
                te->other++;
                te->last_chunked = 0;
            }
        }
        while (i < n && is_ws(p[i]))
            i++;
        if (i == n)
            break;
        if (p[i] != ',')
            return KH_H1_EFRAMING;
        i++;
        while (i < n && is_ws(p[i]))
            i++;
    }
    return any ? 0 : KH_H1_EFRAMING;
}

/* RFC 9110 §7.6.1: Connection = #connection-option. Unknown options are ignored. */
static unsigned parse_connection(const char *p, size_t n)
{
    unsigned f = 0;
    size_t i = 0;
    /* The usual values are a single option. */
    if (n == 10 && name_is(p, "keep-alive", 10))
        return KH_H1_F_CONN_KEEPALIVE;
    if (n == 5 && name_is(p, "close", 5))
        return KH_H1_F_CONN_CLOSE;
    while (i < n) {
        while (i < n && (is_ws(p[i]) || p[i] == ','))
            i++;
        size_t t0 = i;
        while (i < n && p[i] != ',' && !is_ws(p[i]))
            i++;
        size_t tl = i - t0;
        if (tl == 5 && name_is(p + t0, "close", 5))
            f |= KH_H1_F_CONN_CLOSE;
        else if (tl == 10 && name_is(p + t0, "keep-alive", 10))
            f |= KH_H1_F_CONN_KEEPALIVE;
        else if (tl == 7 && name_is(p + t0, "upgrade", 7))
            f |= KH_H1_F_CONN_UPGRADE;
    }
    return f;
}

/* ---- the request line's target ---- */

static int target_form(kh_h1_head *h, const char *t, size_t n, const char *q)
{
    const char *end = t + n;
    h->query = q ? (kh_str){q + 1, (size_t)(end - q - 1)} : (kh_str){NULL, 0};
    const char *pend = q ? q : end;
    int connect = h->method.len == 7 && memcmp(h->method.ptr, "CONNECT", 7) == 0;
    if (t[0] == '/' && !connect) {
        h->target_form = KH_H1_ORIGIN_FORM; /* RFC 9112 §3.2.1 */
        h->path = (kh_str){t, (size_t)(pend - t)};
        return 0;
    }
    if (connect) {
        /* RFC 9112 §3.2.3: CONNECT takes authority-form only, and it needs a port. */
        if (q || !host_ok(t, n, 1))
            return KH_H1_ETARGET;
        h->target_form = KH_H1_AUTHORITY_FORM;
        h->authority = (kh_str){t, n};
        h->path = (kh_str){NULL, 0};
        return 0;
    }
    if (n == 1 && t[0] == '*') {
        /* RFC 9112 §3.2.4: asterisk-form is for a server-wide OPTIONS only. */
        if (!(h->method.len == 7 && memcmp(h->method.ptr, "OPTIONS", 7) == 0))
            return KH_H1_ETARGET;
        h->target_form = KH_H1_ASTERISK_FORM;
        h->path = (kh_str){t, 1};
        return 0;
    }
    /* RFC 9112 §3.2.2 absolute-form; the scheme is case-insensitive (RFC 3986 §3.1). */
    size_t skip;
    if (n >= 7 && name_is(t, "http://", 7))
        skip = 7;
    else if (n >= 8 && name_is(t, "https://", 8))
        skip = 8;
    else
        return KH_H1_ETARGET;
    const char *a = t + skip, *ae = a;
    while (ae < pend && *ae != '/')
        ae++;
    /* RFC 9110 §4.2.1: an empty host is invalid; §4.2.4: so is userinfo ('@' fails host_ok). */
    if (!host_ok(a, (size_t)(ae - a), 0))
        return KH_H1_ETARGET;
    h->target_form = KH_H1_ABSOLUTE_FORM;
    h->authority = (kh_str){a, (size_t)(ae - a)};
    /* No path: RFC 9112 §3.2.2 says "/" then. The second '/' of "://" is one, and keeps the
     * promise that every slice points into buf (a caller may rebase them after a copy). */
    h->path = ae < pend ? (kh_str){ae, (size_t)(pend - ae)} : (kh_str){a - 1, 1};
    return 0;
}

/* ---- the head ---- */

/* Used when prev_len says the bytes up to prev_len held no event: look for one in the new bytes
 * only. Returns KH_EAGAIN, or 0 when an event exists and the full parse must run. */
static ssize_t find_event(const scan *s, size_t rl, size_t b1, size_t prev_len)
{
    const char *buf = s->buf;
    size_t q = prev_len;
    if (prev_len < b1) {
        /* The request line's LF may still be missing, and its bound is tighter. This rescans at
         * most target_bytes + KH_H1_REQLINE_ROOM bytes, and only while the line is that short. */
        size_t end1 = KH_MIN(s->len, b1);
        const char *lf = memchr(buf + rl, '\n', end1 - rl);
        if (lf == NULL)
            return s->len >= b1 ? 0 : KH_EAGAIN;
        size_t e1 = (size_t)(lf - buf);
        if (buf[e1 - 1] != '\r' || e1 >= prev_len)
            return 0; /* a bare LF, or the request line just ended: it may be an event */
        q = KH_MAX(q, e1 + 1);
    }
    size_t end = KH_MIN(s->len, s->hb);
    while (q < end) {
        const char *lf = memchr(buf + q, '\n', end - q);
        if (lf == NULL)
            break;
        size_t e = (size_t)(lf - buf);
        if (buf[e - 1] != '\r' || buf[e - 2] == '\n')
            return 0;
        q = e + 1;
    }
    return s->len >= s->hb ? 0 : KH_EAGAIN;
}

ssize_t kh_h1_parse_request(const char *buf, size_t len, size_t prev_len, kh_h1_head *out,
                            const kh_h1_limits *lim)
{
    scan s = {.buf = buf, .len = len, .hb = lim->header_bytes, .in_rl = 1};
    size_t hb = lim->header_bytes, rl = 0, p;

    if (len == 0)
        return KH_EAGAIN;

    /* RFC 9112 §2.2: skip empty lines before the request line. They count against header_bytes,
     * so a flood of them ends in 431, and a stray CR or LF among them is refused at once. */
    while (rl < len && (buf[rl] == '\r' || buf[rl] == '\n')) {
        if (rl >= hb)
            return KH_H1_EHEADLEN; /* the empty lines took all of the room: 431 whatever follows
                                    * (as the same bytes cut at hb say; fuzz_h1_parse) */
        if (buf[rl] == '\n')
            return KH_H1_EBARELF;
        if (rl + 1 >= KH_MIN(len, hb))
            return len >= hb ? KH_H1_EHEADLEN : KH_EAGAIN;
        if (buf[rl + 1] != '\n')
            return KH_H1_EBARECR;
        rl += 2;
    }

    /* The request line has its own bound so that a huge target gets 414 before it ends. */
    size_t room = lim->target_bytes > SIZE_MAX - KH_H1_REQLINE_ROOM
                      ? SIZE_MAX
                      : lim->target_bytes + KH_H1_REQLINE_ROOM;
    if (rl < hb && room < hb - rl)
        set_bound(&s, rl + room, KH_H1_ETARGETLEN);
    else
        set_bound(&s, hb, KH_H1_EHEADLEN);

    if (prev_len > rl && prev_len <= len) {
        ssize_t r = find_event(&s, rl, s.bound, prev_len);
        if (r != 0)
            return r;
    }

    /* ---- request-line = method SP request-target SP HTTP-version CRLF (RFC 9112 §3) ---- */
    const char *end = buf + s.end;
    p = (size_t)(skip_class(buf + rl, end, C_TCHAR) - buf);
    if (p >= s.end)
        return incomplete(&s);
    if (buf[p] != ' ' || p == rl)
        return stop_at(&s, p, KH_H1_EMETHOD, KH_H1_EBADREQ);
    out->method = (kh_str){buf + rl, p - rl};
    p++;

    size_t t0 = p;
    const char *q = NULL;
    for (;;) {
        p = (size_t)(skip_class(buf + p, end, C_TARGET) - buf);
        if (p < s.end && buf[p] == '?') {
            if (q == NULL)
                q = buf + p;
            p++;
            continue;
        }
        break;
    }
    if (p >= s.end)
        return incomplete(&s);
    /* RFC 9112 §3.2: no fragment in a request-target; one SP exactly, so an empty target or a
     * second SP is an invalid target. */
    if (buf[p] != ' ' || p == t0)
        return stop_at(&s, p, KH_H1_ETARGET, KH_H1_EBADREQ);
    size_t tlen = p - t0;
    if (tlen > lim->target_bytes)
        return settle_line(&s, p, KH_H1_ETARGETLEN); /* RFC 9112 §3: 414 */
    out->target = (kh_str){buf + t0, tlen};
    out->authority = (kh_str){NULL, 0};
    int err = target_form(out, buf + t0, tlen, q);
    if (err)
        return settle_line(&s, p, err);
    p++;

    /* HTTP-version = "HTTP/" DIGIT "." DIGIT, case-sensitive (RFC 9112 §2.3). */
    int major, minor;
    if (s.end - p >= 10 && buf[p + 8] == '\r' && buf[p + 9] == '\n' &&
        memcmp(buf + p, "HTTP/", 5) == 0 && buf[p + 6] == '.' &&
        (unsigned)(buf[p + 5] - '0') <= 9 && (unsigned)(buf[p + 7] - '0') <= 9) {
        major = buf[p + 5] - '0';
        minor = buf[p + 7] - '0';
        p += 10;
    } else {
        const char *lf = memchr(buf + p, '\n', s.end - p);
        if (lf == NULL)
            return incomplete(&s);
        size_t e = (size_t)(lf - buf);
        if (buf[e - 1] != '\r')
            return KH_H1_EBARELF;
        if (memchr(buf + p, '\r', e - 1 - p) != NULL)
            return settle_rest(&s, e + 1, KH_H1_EBARECR);
        /* Any version that does not match the fast path above is malformed. */
        return settle_rest(&s, e + 1, KH_H1_EBADVERSION);
    }
    if (major != 1)
        return settle_rest(&s, p, KH_H1_EVERSION); /* RFC 9110 §15.6.6: 505 */
    minor = minor >= 1;

    /* ---- header lines: field-name ":" OWS field-value OWS CRLF (RFC 9112 §5) ---- */
    s.in_rl = 0;
    set_bound(&s, hb, KH_H1_EHEADLEN);
    end = buf + s.end;
    size_t nf = 0, maxf = lim->header_fields;
    kh_h1_field *fields = out->fields;
    unsigned flags = 0;
    int have_host = 0, have_cl = 0;
    uint64_t cl = 0;
    te_facts te = {0, 0, 0, 0};
    out->host = (kh_str){NULL, 0};
    out->upgrade = (kh_str){NULL, 0};

    for (;;) {
        if (p >= s.end)
            return incomplete(&s);
        char c = buf[p];
        if (c == '\r') {
            if (p + 1 >= s.end)
                return incomplete(&s);
            if (buf[p + 1] == '\n') {
                p += 2;
                break;
            }
            return settle_line(&s, p + 1, KH_H1_EBARECR);
        }
        if (c == '\n')
            return KH_H1_EBARELF;
        if (nf == maxf)
            return settle_line(&s, p, KH_H1_EFIELDS);
        if (is_ws(c))
            return settle_line(&s, p, KH_H1_EOBSFOLD); /* RFC 9112 §5.2: reject obs-fold */

        size_t n0 = p;
        p = (size_t)(skip_class(buf + p, end, C_TCHAR) - buf);
        if (p >= s.end)
            return incomplete(&s);
        if (buf[p] != ':') {
            if (is_ws(buf[p]) && p > n0) {
                /* RFC 9112 §5.1: whitespace before the colon is a 400, never stripped. */
                size_t w = p;
                while (w < s.end && is_ws(buf[w]))
                    w++;
                int colon = w < s.end && buf[w] == ':';
                return settle_line(&s, p, colon ? KH_H1_EWSCOLON : KH_H1_EFIELDNAME);
            }
            return stop_at(&s, p, KH_H1_EFIELDNAME, KH_H1_EFIELDNAME);
        }
        if (p == n0)
            return settle_line(&s, p, KH_H1_EFIELDNAME);
        size_t nlen = p - n0;
        p++;
        while (p < s.end && is_ws(buf[p]))
            p++;
        size_t v0 = p;
        p = (size_t)(skip_value(buf + p, end) - buf);
        if (p >= s.end || buf[p] != '\r')
            return stop_at(&s, p, KH_H1_EFIELDVALUE, KH_H1_EFIELDVALUE);
        if (p + 1 >= s.end)
            return incomplete(&s);
        if (buf[p + 1] != '\n')
            return settle_line(&s, p + 1, KH_H1_EBARECR);
        size_t v1 = p;
        while (v1 > v0 && is_ws(buf[v1 - 1]))
            v1--;
        p += 2;

        const char *name = buf + n0, *val = buf + v0;
        size_t vlen = v1 - v0;
        fields[nf].name = (kh_str){name, nlen};
        fields[nf].value = (kh_str){val, vlen};
        nf++;

        /* The headers that change how the message is read, found by length first. */
        err = 0;
        switch (nlen) {
        case 4:
            if (name_is(name, "host", 4)) {
                /* RFC 9112 §3.2: one Host line, with a valid value, else 400. An empty value
                 * is what RFC 9110 §7.2 asks for when the target has no authority. */
                if (have_host || (vlen != 0 && !host_ok(val, vlen, 0)))
                    err = KH_H1_ENOHOST;
                have_host = 1;
                out->host = (kh_str){val, vlen};
            }
            break;
        case 6:
            if (name_is(name, "expect", 6)) {
                /* RFC 9110 §10.1.1: 100-continue is the only expectation; 417 for others.
                 * An HTTP/1.0 request's 100-continue MUST be ignored. */
                if (vlen == 12 && name_is(val, "100-continue", 12)) {
                    if (minor)
                        flags |= KH_H1_F_EXPECT_CONTINUE;
                } else {
                    err = KH_H1_EEXPECT;
                }
            }
            break;
        case 7:
            if (name_is(name, "upgrade", 7) && !(flags & KH_H1_F_HAS_UPGRADE)) {
                flags |= KH_H1_F_HAS_UPGRADE;
                out->upgrade = (kh_str){val, vlen};
            }
            break;
        case 10:
            if (name_is(name, "connection", 10))
                flags |= parse_connection(val, vlen);
            break;
        case 14:
            if (name_is(name, "content-length", 14)) {
                uint64_t v = 0;
                err = parse_cl(val, vlen, &v);
                if (!err && have_cl && v != cl)
                    err = KH_H1_EFRAMING; /* RFC 9112 §6.3 point 5 */
                have_cl = 1;
                cl = v;
            }
            break;
        case 17:
            if (name_is(name, "transfer-encoding", 17))
                err = parse_te(val, vlen, &te);
            break;
        default:
            break;
        }
        if (err)
            return settle_rest(&s, p, err);
    }

    /* ---- the complete head: framing (RFC 9112 §6), then Host ----
     * Order: what makes the body length unknowable is a 400 first (RFC 9112 §6.3 points 3-4);
     * only a request whose framing is sound but uses a coding we lack gets 501 (RFC 9112 §6.1).
     * So "gzip" alone is 400 (final coding not chunked), "gzip, chunked" is 501. */
    out->body_kind = KH_H1_BODY_NONE;
    out->content_length = 0;
    if (te.present) {
        if (have_cl)
            return KH_H1_EFRAMING; /* §6.3 point 3: CL and TE together smell of smuggling */
        if (!minor)
            return KH_H1_EFRAMING; /* §6.1: TE in HTTP/1.0 means faulty framing */
        if (!te.last_chunked || te.chunked > 1)
            return KH_H1_EFRAMING; /* §6.3 point 4; §7: chunked at most once */
        if (te.other)
            return KH_H1_ETE;
        out->body_kind = KH_H1_BODY_CHUNKED;
    } else if (have_cl) {
        out->body_kind = KH_H1_BODY_LENGTH;
        out->content_length = cl;
    }
    if (minor && !have_host)
        return KH_H1_ENOHOST;

    out->minor_version = minor;
    out->flags = flags;
    out->num_fields = nf;
    return (ssize_t)p;
}

/* ---- chunked body (RFC 9112 §7.1) ---- */

enum {
    CS_SIZE = 0,     /* chunk-size digits (zeroed struct starts here) */
    CS_SIZE_BWS,     /* BWS after size or ext value: only ';' may follow */
    CS_EXT_NAME0,    /* after ';': BWS, then the name */
    CS_EXT_NAME,     /* in chunk-ext-name */
    CS_EXT_NAME_BWS, /* BWS after the name: '=' or ';' */
    CS_EXT_VAL0,     /* after '=': BWS, then token or quoted-string */
    CS_EXT_TOKEN,
    CS_EXT_QUOTED,
    CS_EXT_QESC, /* after '\' in a quoted-string */
    CS_EXT_QEND, /* after the closing quote */
    CS_SIZE_LF,  /* CR of the size line seen */
    CS_DATA,
    CS_DATA_CR,
    CS_DATA_LF,
    CS_TR_START, /* start of a trailer line, or of the final CRLF */
    CS_TR_NAME,
    CS_TR_VALUE,
    CS_TR_LF,
    CS_END_LF,
    CS_DONE,
};

static int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

ssize_t kh_h1_chunked_decode(kh_h1_chunked *d, char *buf, size_t len, size_t *out_len,
                             const kh_h1_limits *lim)
{
    size_t r = 0, w = 0;
    uint32_t st = d->state;

    *out_len = 0;
    if (st == CS_DONE)
        return 0;
    while (r < len) {
        if (st == CS_DATA) {
            size_t n = (size_t)KH_MIN(d->remaining, (uint64_t)(len - r));
            if (w != r)
                memmove(buf + w, buf + r, n);
            w += n;
            r += n;
            d->remaining -= n;
            if (d->remaining == 0)
                st = CS_DATA_CR;
            continue;
        }
        uint8_t c = (uint8_t)buf[r++];
        if (st < CS_SIZE_LF && ++d->line_bytes > KH_H1_CHUNK_LINE)
            return KH_H1_ECHUNK;
        if (st >= CS_TR_START && ++d->trailer_bytes > lim->header_bytes)
            return KH_H1_EHEADLEN;
        switch (st) {
        case CS_SIZE: {
            int v = hexval(c);
            if (v >= 0) {
                if (++d->hex_digits > KH_H1_CHUNK_DIGITS)
                    return KH_H1_ECHUNK;
                d->remaining = (d->remaining << 4) | (uint64_t)v;
            } else if (d->hex_digits == 0) {
                return KH_H1_ECHUNK;
            } else if (c == ';') {
                st = CS_EXT_NAME0;
            } else if (is_ws((char)c)) {
                st = CS_SIZE_BWS;
            } else if (c == '\r') {
                st = CS_SIZE_LF;
            } else {
                return KH_H1_ECHUNK;
            }
            break;
        }
        case CS_SIZE_BWS:
            /* chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] ):
             * whitespace may only lead to ';', never to the line end. */
            if (c == ';')
                st = CS_EXT_NAME0;
            else if (!is_ws((char)c))
                return KH_H1_ECHUNK;
            break;
        case CS_EXT_NAME0:
            if (IS(c, C_TCHAR))
                st = CS_EXT_NAME;
            else if (!is_ws((char)c))
                return KH_H1_ECHUNK;
            break;
        case CS_EXT_NAME:
            if (IS(c, C_TCHAR))
                break;
            if (c == '=')
                st = CS_EXT_VAL0;
            else if (c == ';')
                st = CS_EXT_NAME0;
            else if (is_ws((char)c))
                st = CS_EXT_NAME_BWS;
            else if (c == '\r')
                st = CS_SIZE_LF;
            else
                return KH_H1_ECHUNK;
            break;
        case CS_EXT_NAME_BWS:
            if (c == '=')
                st = CS_EXT_VAL0;
            else if (c == ';')
                st = CS_EXT_NAME0;
            else if (!is_ws((char)c))
                return KH_H1_ECHUNK;
            break;
        case CS_EXT_VAL0:
            if (IS(c, C_TCHAR))
                st = CS_EXT_TOKEN;
            else if (c == '"')
                st = CS_EXT_QUOTED;
            else if (!is_ws((char)c))
                return KH_H1_ECHUNK;
            break;
        case CS_EXT_TOKEN:
        case CS_EXT_QEND:
            if (st == CS_EXT_TOKEN && IS(c, C_TCHAR))
                break;
            if (c == ';')
                st = CS_EXT_NAME0;
            else if (is_ws((char)c))
                st = CS_SIZE_BWS;
            else if (c == '\r')
                st = CS_SIZE_LF;
            else
                return KH_H1_ECHUNK;
            break;
        case CS_EXT_QUOTED:
            if (c == '"')
                st = CS_EXT_QEND;
            else if (c == '\\')
                st = CS_EXT_QESC;
            else if (!IS(c, C_QDTEXT))
                return KH_H1_ECHUNK;
            break;
        case CS_EXT_QESC:
            /* quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text ) */
            if (!IS(c, C_VALUE))
                return KH_H1_ECHUNK;
            st = CS_EXT_QUOTED;
            break;
        case CS_SIZE_LF:
            if (c != '\n')
                return KH_H1_ECHUNK;
            /* a chunk that would take the body past body_bytes: refused now, before its data
             * (which could be any size up to 2^64) is read */
            if (d->remaining > lim->body_bytes - d->total)
                return KH_H1_EBODYLEN;
            d->total += d->remaining;
            st = d->remaining ? CS_DATA : CS_TR_START; /* size 0 is the last-chunk */
            break;
        case CS_DATA_CR:
            if (c != '\r')
                return KH_H1_ECHUNK;
            st = CS_DATA_LF;
            break;
        case CS_DATA_LF:
            if (c != '\n')
                return KH_H1_ECHUNK;
            st = CS_SIZE;
            d->hex_digits = 0;
            d->line_bytes = 0;
            break;
        case CS_TR_START:
            /* trailer-section = *( field-line CRLF ): checked like header lines, then dropped. */
            if (c == '\r') {
                st = CS_END_LF;
            } else if (c == '\n') {
                return KH_H1_EBARELF;
            } else if (is_ws((char)c)) {
                return KH_H1_EOBSFOLD;
            } else if (IS(c, C_TCHAR)) {
                if (++d->trailer_fields > lim->header_fields)
                    return KH_H1_EFIELDS;
                st = CS_TR_NAME;
            } else {
                return KH_H1_EFIELDNAME;
            }
            break;
        case CS_TR_NAME:
            if (IS(c, C_TCHAR))
                break;
            if (c == ':')
                st = CS_TR_VALUE;
            else if (is_ws((char)c))
                return KH_H1_EWSCOLON;
            else if (c == '\n')
                return KH_H1_EBARELF;
            else if (c == '\r')
                return KH_H1_EBARECR; /* a CR here is bare or ends a line without a colon */
            else
                return KH_H1_EFIELDNAME;
            break;
        case CS_TR_VALUE:
            if (IS(c, C_VALUE))
                break;
            if (c == '\r')
                st = CS_TR_LF;
            else if (c == '\n')
                return KH_H1_EBARELF;
            else
                return KH_H1_EFIELDVALUE;
            break;
        case CS_TR_LF:
            if (c != '\n')
                return KH_H1_EBARECR;
            st = CS_TR_START;
            break;
        case CS_END_LF:
            if (c != '\n')
                return KH_H1_EBARECR;
            st = CS_DONE;
            d->state = st;
            d->done = 1;
            *out_len = w;
            return (ssize_t)r;
        default:
            return KH_H1_ECHUNK;
        }
    }
    d->state = st;
    *out_len = w;
    return (ssize_t)r;
}

/* ---- HTTP2-Settings (RFC 7540 §3.2.1) ---- */

static int b64url(uint8_t c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -1; /* '+', '/' and '=' are base64, not base64url without padding */
}

ssize_t kh_h1_h2_settings(kh_str value, uint8_t *out)
{
    /* 6 bytes are 48 bits, 8 characters: a whole number of entries is a multiple of 8 */
    if (value.len == 0 || value.len % 8 != 0 || value.len / 8 > KH_H1_H2_SETTINGS_MAX)
        return KH_H1_EH2SETTINGS;
    size_t n = 0;
    for (size_t i = 0; i < value.len; i += 4) {
        uint32_t acc = 0;
        for (size_t j = 0; j < 4; j++) {
            int v = b64url((uint8_t)value.ptr[i + j]);
            if (v < 0)
                return KH_H1_EH2SETTINGS;
            acc = acc << 6 | (uint32_t)v;
        }
        out[n++] = (uint8_t)(acc >> 16);
        out[n++] = (uint8_t)(acc >> 8);
        out[n++] = (uint8_t)acc;
    }
    for (size_t i = 0; i < n; i += 6) {
        uint32_t id = (uint32_t)out[i] << 8 | out[i + 1];
        uint32_t v = (uint32_t)out[i + 2] << 24 | (uint32_t)out[i + 3] << 16 |
                     (uint32_t)out[i + 4] << 8 | out[i + 5];
        switch (id) {
        case 0x2: /* ENABLE_PUSH */
        case 0x8: /* ENABLE_CONNECT_PROTOCOL */
        case 0x9: /* NO_RFC7540_PRIORITIES */
            if (v > 1)
                return KH_H1_EH2SETTINGS;
            break;
        case 0x4: /* INITIAL_WINDOW_SIZE */
            if (v > 0x7fffffffu)
                return KH_H1_EH2SETTINGS;
            break;
        case 0x5: /* MAX_FRAME_SIZE */
            if (v < 16384 || v > 16777215)
                return KH_H1_EH2SETTINGS;
            break;
        default:
            break;
        }
    }
    return (ssize_t)n;
}

int kh_h1_host_ok(kh_str value)
{
    return value.len != 0 && host_ok(value.ptr, value.len, 0);
}

/* ---- error table ---- */

static const struct {
    int status;
    const char *reason;
} errtab[] = {
    [0] = {400, "malformed request"},
    [1] = {400, "invalid method"},
    [2] = {400, "invalid request-target"},
    [3] = {505, "HTTP version not supported"},
    [4] = {400, "malformed HTTP version"},
    [5] = {400, "invalid field name"},
    [6] = {400, "whitespace before colon"},
    [7] = {400, "invalid character in field value"},
    [8] = {400, "obs-fold in header"},
    [9] = {400, "bare CR"},
    [10] = {400, "bare LF"},
    [11] = {400, "ambiguous message framing"},
    [12] = {400, "invalid Content-Length"},
    [13] = {501, "unsupported Transfer-Encoding"},
    [14] = {400, "missing, duplicate or invalid Host"},
    [15] = {414, "request-target too long"},
    [16] = {431, "request head too large"},
    [17] = {431, "too many header fields"},
    [18] = {417, "unsupported expectation"},
    [19] = {400, "invalid chunked encoding"},
    [20] = {413, "Request body too large"},
    [21] = {400, "invalid HTTP2-Settings"},
};

static int errindex(int err)
{
    int i = KH_H1_EBADREQ - err;
    return i >= 0 && i < (int)KH_ARRAY_LEN(errtab) ? i : -1;
}

int kh_h1_error_status(int err)
{
    int i = errindex(err);
    return i < 0 ? 400 : errtab[i].status;
}

const char *kh_h1_error_reason(int err)
{
    int i = errindex(err);
    return i < 0 ? "bad request" : errtab[i].reason;
}
