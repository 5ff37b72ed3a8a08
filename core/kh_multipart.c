/* kh_multipart.c: the multipart/form-data state machine (kh_multipart.h has the contract).
 * Owns:  nothing beyond the kh_multipart struct; the header buffer is the caller's.
 * In:    chunks of a body at any cut, one kh_mp_next call per event.
 * Out:   events whose pointers go into the input, the delimiter or the header buffer.
 * Never: allocates or rescans: the only loop over data is memchr for CR plus a bounded compare
 *        of the delimiter at each CR, and a failed compare resumes after the bytes it matched
 *        (none of them can be CR: a boundary has none), so time is linear in the input. */
#include "kh_multipart.h"

#include <string.h>

enum {
    ST_PREAMBLE = 0, /* before the first delimiter */
    ST_AFTER_DELIM,  /* just after "\r\n--boundary": "--", or padding then CRLF */
    ST_CLOSE,        /* after "--boundary-": the second '-' */
    ST_PAD,          /* spaces/tabs after the delimiter */
    ST_LF,           /* the LF ending the delimiter line */
    ST_HEADERS,      /* accumulating the header block */
    ST_HEMIT,        /* emitting header fields from hbuf */
    ST_BODY,         /* part data, searching for the delimiter */
    ST_EPILOGUE,     /* after the close delimiter */
    ST_ERROR,
};

enum { FOUND = 100 };

static int is_bchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return 1;
    return c != 0 && strchr("'()+_,-./:=? ", c) != NULL;
}

static int is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int fail(kh_multipart *p, const char *why)
{
    p->state = ST_ERROR;
    p->error = why;
    return KH_MP_ERROR;
}

int kh_mp_init(kh_multipart *p, const char *boundary, size_t blen, char *hbuf,
               const kh_mp_limits *lim)
{
    memset(p, 0, sizeof *p);
    p->lim = *lim;
    p->hbuf = hbuf;
    p->hcap = (size_t)lim->max_header_bytes;
    if (blen == 0 || blen > KH_MP_BOUNDARY_MAX) {
        p->state = ST_ERROR;
        p->error = "the multipart boundary must be 1 to 70 characters";
        return -1;
    }
    for (size_t i = 0; i < blen; i++)
        if (!is_bchar((unsigned char)boundary[i])) {
            p->state = ST_ERROR;
            p->error = "the multipart boundary has a character RFC 2046 does not allow";
            return -1;
        }
    if (boundary[blen - 1] == ' ') {
        p->state = ST_ERROR;
        p->error = "the multipart boundary ends with a space";
        return -1;
    }
    memcpy(p->delim, "\r\n--", 4);
    memcpy(p->delim + 4, boundary, blen);
    p->dlen = blen + 4;
    p->matched = 2; /* the body may start with "--boundary": as if a CRLF came before it */
    p->state = ST_PREAMBLE;
    return 0;
}

/* The delimiter search from in[*off]: FOUND (consumed), KH_MP_DATA (p->data/len set, consumed:
 * bytes that are surely data), or KH_MP_NEED_MORE (all consumed; a partial match is held). */
static int search(kh_multipart *p, const char *in, size_t len, size_t *off)
{
    const char *d = p->delim;
    size_t dlen = p->dlen;
    if (p->matched) {
        size_t i = *off, m = p->matched;
        while (m < dlen && i < len && in[i] == d[m])
            m++, i++;
        *off = i;
        if (m == dlen) {
            p->matched = 0;
            return FOUND;
        }
        if (i == len) {
            p->matched = m;
            return KH_MP_NEED_MORE;
        }
        /* mismatch: the held bytes and those just matched are data; none is CR but the first,
         * so no delimiter starts inside them */
        p->matched = 0;
        p->data = d;
        p->len = m;
        return KH_MP_DATA;
    }
    const char *s = in + *off;
    size_t n = len - *off, pos = 0;
    while (pos < n) {
        const char *cr = memchr(s + pos, '\r', n - pos);
        if (cr == NULL) {
            pos = n;
            break;
        }
        size_t x = (size_t)(cr - s), m = 0, avail = n - x;
        while (m < dlen && m < avail && cr[m] == d[m])
            m++;
        if (m == dlen || m == avail) { /* a delimiter, or the start of one at the input's end */
            if (x > 0) {
                p->data = s;
                p->len = x;
                *off += x;
                return KH_MP_DATA;
            }
            *off += m;
            if (m == dlen)
                return FOUND;
            p->matched = m;
            return KH_MP_NEED_MORE;
        }
        pos = x + m; /* m >= 1: cr[0] matched */
    }
    if (pos == 0)
        return KH_MP_NEED_MORE;
    p->data = s;
    p->len = pos;
    *off += pos;
    return KH_MP_DATA;
}

/* Accumulates header bytes up to and including the blank line. 1: the block is complete. */
static int headers_in(kh_multipart *p, const char *in, size_t len, size_t *off)
{
    while (*off < len) {
        const char *s = in + *off;
        size_t n = len - *off;
        const char *lf = memchr(s, '\n', n);
        size_t take = lf ? (size_t)(lf - s) + 1 : n;
        if (take > p->hcap - p->hlen) {
            fail(p, "a multipart part's header block is too large");
            return -1;
        }
        memcpy(p->hbuf + p->hlen, s, take);
        p->hlen += take;
        *off += take;
        if (lf) {
            size_t h = p->hlen;
            if ((h == 2 && p->hbuf[0] == '\r') ||
                (h >= 4 && memcmp(p->hbuf + h - 4, "\r\n\r\n", 4) == 0))
                return 1;
            if (h >= 2 && p->hbuf[h - 2] != '\r') {
                fail(p, "a multipart header line ends with a bare LF");
                return -1;
            }
        }
    }
    return 0;
}

/* The next header field from hbuf, or the end of the headers. */
static int header_emit(kh_multipart *p)
{
    const char *b = p->hbuf + p->hpos;
    size_t n = p->hlen - p->hpos;
    const char *cr = memchr(b, '\r', n);
    if (cr == NULL || (size_t)(cr - b) + 1 >= n || cr[1] != '\n')
        return fail(p, "a multipart header line has a bare CR");
    size_t line = (size_t)(cr - b);
    p->hpos += line + 2;
    if (line == 0) {
        p->state = ST_BODY;
        p->part_bytes = 0;
        return KH_MP_HEADERS_END;
    }
    if (b[0] == ' ' || b[0] == '\t')
        return fail(p, "a multipart header is folded (obs-fold)");
    size_t i = 0;
    while (i < line && is_tchar((unsigned char)b[i]))
        i++;
    if (i == 0 || i == line || b[i] != ':')
        return fail(p, "a multipart header line is not 'name: value'");
    p->name = b;
    p->name_len = i;
    size_t v = i + 1, e = line;
    while (v < e && (b[v] == ' ' || b[v] == '\t'))
        v++;
    while (e > v && (b[e - 1] == ' ' || b[e - 1] == '\t'))
        e--;
    for (size_t k = v; k < e; k++) {
        unsigned char c = (unsigned char)b[k];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return fail(p, "a multipart header value has a control character");
    }
    p->value = b + v;
    p->value_len = e - v;
    return KH_MP_HEADER;
}

static int step(kh_multipart *p, const char *in, size_t len, size_t *off)
{
    for (;;) {
        switch (p->state) {
        case ST_ERROR:
            return KH_MP_ERROR;
        case ST_EPILOGUE:
            *off = len;
            return KH_MP_NEED_MORE;
        case ST_PREAMBLE: {
            int r = search(p, in, len, off);
            if (r == FOUND) {
                p->state = ST_AFTER_DELIM;
                continue;
            }
            if (r == KH_MP_DATA)
                continue; /* the preamble is ignored */
            return r;
        }
        case ST_BODY: {
            int r = search(p, in, len, off);
            if (r == FOUND) {
                p->state = ST_AFTER_DELIM;
                return KH_MP_PART_END;
            }
            if (r == KH_MP_DATA) {
                p->part_bytes += p->len;
                if (p->part_bytes > p->lim.max_part_bytes)
                    return fail(p, "a multipart part is too large");
            }
            return r;
        }
        case ST_HEMIT:
            return header_emit(p);
        case ST_HEADERS: {
            int r = headers_in(p, in, len, off);
            if (r < 0)
                return KH_MP_ERROR;
            if (r == 0)
                return KH_MP_NEED_MORE;
            p->state = ST_HEMIT;
            p->hpos = 0;
            continue;
        }
        default:
            break;
        }
        /* the delimiter line, a byte at a time */
        if (*off == len)
            return KH_MP_NEED_MORE;
        char c = in[(*off)++];
        switch (p->state) {
        case ST_AFTER_DELIM:
            if (c == '-')
                p->state = ST_CLOSE;
            else if (c == ' ' || c == '\t')
                p->state = ST_PAD;
            else if (c == '\r')
                p->state = ST_LF;
            else
                return fail(p, "a multipart delimiter is followed by something else than CRLF");
            break;
        case ST_CLOSE:
            if (c != '-')
                return fail(p, "a multipart delimiter is followed by a single '-'");
            p->state = ST_EPILOGUE;
            return KH_MP_DONE;
        case ST_PAD:
            if (c == '\r')
                p->state = ST_LF;
            else if (c != ' ' && c != '\t')
                return fail(p, "a multipart delimiter is followed by something else than CRLF");
            break;
        case ST_LF:
            if (c != '\n')
                return fail(p, "a multipart delimiter line ends with a bare CR");
            if (++p->parts > p->lim.max_parts)
                return fail(p, "too many multipart parts");
            p->hlen = 0;
            p->state = ST_HEADERS;
            break;
        }
    }
}

int kh_mp_next(kh_multipart *p, const char *in, size_t len, size_t *off)
{
    if (*off > len)
        return fail(p, "kh_mp_next: offset past the input");
    size_t start = *off;
    int r = step(p, in, len, off);
    p->total += *off - start;
    if (r != KH_MP_ERROR && p->total > p->lim.max_total_bytes)
        return fail(p, "the multipart body is too large");
    return r;
}

int kh_mp_finish(kh_multipart *p)
{
    if (p->state == ST_EPILOGUE)
        return 0;
    if (p->state != ST_ERROR)
        fail(p, p->state == ST_PREAMBLE ? "the body has no multipart delimiter"
                                        : "the multipart body ends before its close delimiter");
    return -1;
}
