/* kh_h1_client.c: HTTP/1.1 response reader and request serializer for the outbound client
 * (RFC 9112 §4 status line, §6.3 message body length, §7.1 chunked via kh_h1_chunked_decode).
 * Owns:  nothing but a const byte-class table; per-response state lives in the caller's kh_h1c.
 * In:    response bytes not yet consumed; EOF; limits.
 * Out:   one event per call (head, body slice, done) or a KH_H1C_E* code; request head bytes.
 * Never: allocates, reads at or past len, touches I/O.
 *
 * How a head result is defined (so that it cannot depend on how the bytes were split): the head
 * is parsed only once its blank line ("\r\n\r\n") lies within header_bytes, or refused with
 * KH_H1C_EHEADLEN once header_bytes bytes are there without one. Until then KH_H1C_NEED_MORE.
 * The reader is strict where a lenient reading would let a response desynchronise a reused
 * connection (CL with TE, differing CLs, bad chunk sizes, bare LF, obs-fold) and lenient where
 * nothing is at stake (a status line without a reason phrase). */
#include "kh_h1_client.h"

#include <string.h>

/* Same bound as the request side: a Content-Length must stay exact in a Lua number. */
#define KH_H1C_CL_MAX (UINT64_C(1) << 53)

enum { S_HEAD = 0, S_BODY, S_DONE, S_ERROR };

/* RFC 9110 §5.6.2 tchar, as a 256-bit set (the header says: a const byte-class table) */
static const uint32_t TCHAR_SET[8] = {
    0x00000000u,                    /* 0x00-0x1f: controls */
    0x03ff6cfau,                    /* 0x20-0x3f: ! # $ % & ' * + - . 0-9 */
    0xc7fffffeu,                    /* 0x40-0x5f: A-Z ^ _ */
    0x57ffffffu,                    /* 0x60-0x7f: ` a-z | ~ */
    0, 0, 0, 0,                     /* 0x80-0xff: none */
};

static int is_tchar(unsigned char c)
{
    return (TCHAR_SET[c >> 5] >> (c & 31)) & 1u;
}

/* RFC 9110 §5.5 field-vchar / SP / HTAB, obs-text included */
static int is_vchar_ws(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static unsigned char lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c | 0x20) : c;
}

static int ieq(kh_str a, const char *lit)
{
    return kh_str_ieq_lower(a, lit, strlen(lit));
}

const char *kh_h1c_error_reason(int err)
{
    switch (err) {
    case KH_H1C_ESTATUS:
        return "malformed status line";
    case KH_H1C_EVERSION:
        return "not an HTTP/1.x response";
    case KH_H1C_EFIELD:
        return "malformed header line";
    case KH_H1C_EHEADLEN:
        return "response head too large";
    case KH_H1C_EFIELDS:
        return "too many response header fields";
    case KH_H1C_EFRAMING:
        return "ambiguous framing (Content-Length / Transfer-Encoding)";
    case KH_H1C_EBADCL:
        return "invalid Content-Length";
    case KH_H1C_ECHUNK:
        return "bad chunked encoding";
    case KH_H1C_EBODYLEN:
        return "response body too large";
    case KH_H1C_EINTERIM:
        return "unexpected interim responses";
    case KH_H1C_EMIDHEAD:
        return "closed mid-head";
    case KH_H1C_EMIDBODY:
        return "closed mid-body";
    case KH_H1C_ENORESP:
        return "closed before response";
    case KH_H1C_EREQ:
        return "invalid request";
    default:
        return kh_strerror(err);
    }
}

void kh_h1c_init(kh_h1c *r, const kh_h1c_limits *lim, kh_h1_field *fields, int head_request)
{
    memset(r, 0, sizeof(*r));
    r->lim = *lim;
    r->head.fields = fields;
    r->no_body = head_request ? 1 : 0;
}

int kh_h1c_started(const kh_h1c *r)
{
    return r->state != S_HEAD || r->interim > 0 || r->seen;
}

/* Content-Length: 1*DIGIT, or a list of identical values ("42, 42", RFC 9110 §8.6). */
static int parse_cl(kh_str v, uint64_t *out)
{
    uint64_t first = 0;
    int have = 0;
    size_t i = 0;
    while (i <= v.len) {
        while (i < v.len && (v.ptr[i] == ' ' || v.ptr[i] == '\t'))
            i++;
        uint64_t n = 0;
        size_t digits = 0;
        while (i < v.len && v.ptr[i] >= '0' && v.ptr[i] <= '9') {
            n = n * 10 + (uint64_t)(v.ptr[i] - '0');
            if (n > KH_H1C_CL_MAX)
                return -1;
            i++;
            digits++;
        }
        if (digits == 0)
            return -1;
        while (i < v.len && (v.ptr[i] == ' ' || v.ptr[i] == '\t'))
            i++;
        if (have && n != first)
            return -2;
        first = n;
        have = 1;
        if (i == v.len)
            break;
        if (v.ptr[i] != ',')
            return -1;
        i++;
    }
    *out = first;
    return 0;
}

/* Walks a comma-separated token list, calling fn on each non-empty element (trimmed). */
static void each_token(kh_str v, void (*fn)(kh_str, void *), void *ud)
{
    size_t i = 0;
    while (i < v.len) {
        size_t s = i;
        while (i < v.len && v.ptr[i] != ',')
            i++;
        size_t e = i;
        while (s < e && (v.ptr[s] == ' ' || v.ptr[s] == '\t'))
            s++;
        while (e > s && (v.ptr[e - 1] == ' ' || v.ptr[e - 1] == '\t'))
            e--;
        if (e > s)
            fn((kh_str){v.ptr + s, e - s}, ud);
        i++;
    }
}

static void conn_token(kh_str t, void *ud)
{
    unsigned *flags = ud;
    if (ieq(t, "close"))
        *flags |= KH_H1C_F_CONN_CLOSE;
    else if (ieq(t, "keep-alive"))
        *flags |= KH_H1C_F_CONN_KEEPALIVE;
}

typedef struct te_state {
    int count;       /* codings seen */
    int chunked_at;  /* index of the last "chunked", -1 if none */
    int chunked_n;   /* how many "chunked" */
} te_state;

static void te_token(kh_str t, void *ud)
{
    te_state *te = ud;
    if (ieq(t, "chunked")) {
        te->chunked_at = te->count;
        te->chunked_n++;
    }
    te->count++;
}

/* Parses a complete head buf[0..n) (n includes the blank line). */
static int parse_head(kh_h1c *r, const char *buf, size_t n)
{
    kh_h1c_head *h = &r->head;
    size_t i = 0;

    /* status-line = HTTP-version SP status-code SP [ reason-phrase ] (no SP tolerated) */
    if (n < 14 || memcmp(buf, "HTTP/", 5) != 0)
        return KH_H1C_ESTATUS;
    if (buf[5] < '0' || buf[5] > '9' || buf[6] != '.' || buf[7] < '0' || buf[7] > '9')
        return KH_H1C_ESTATUS;
    if (buf[5] != '1')
        return KH_H1C_EVERSION;
    h->minor_version = buf[7] - '0';
    if (buf[8] != ' ')
        return KH_H1C_ESTATUS;
    for (i = 9; i < 12; i++)
        if (buf[i] < '0' || buf[i] > '9')
            return KH_H1C_ESTATUS;
    h->status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
    if (h->status < 100)
        return KH_H1C_ESTATUS;
    i = 12;
    size_t rs = i;
    if (buf[i] == ' ') {
        rs = ++i;
        while (buf[i] != '\r' && buf[i] != '\n') {
            if (!is_vchar_ws((unsigned char)buf[i]))
                return KH_H1C_ESTATUS;
            i++;
        }
    }
    if (buf[i] != '\r' || buf[i + 1] != '\n')
        return KH_H1C_ESTATUS;
    h->reason = (kh_str){buf + rs, i - rs};
    i += 2;

    int have_cl = 0, have_te = 0, cl_conflict = 0;
    uint64_t cl = 0;
    te_state te = {0, -1, 0};
    h->num_fields = 0;
    h->flags = 0;
    /* field-line = field-name ":" OWS field-value OWS CRLF */
    while (!(buf[i] == '\r' && buf[i + 1] == '\n')) {
        size_t ns = i;
        while (is_tchar((unsigned char)buf[i]))
            i++;
        if (i == ns || buf[i] != ':')
            return KH_H1C_EFIELD; /* empty name, obs-fold (SP first), bad byte, SP before ':' */
        kh_str name = {buf + ns, i - ns};
        i++;
        while (buf[i] == ' ' || buf[i] == '\t')
            i++;
        size_t vs = i;
        while (buf[i] != '\r' && buf[i] != '\n') {
            if (!is_vchar_ws((unsigned char)buf[i]))
                return KH_H1C_EFIELD;
            i++;
        }
        if (buf[i] != '\r' || buf[i + 1] != '\n')
            return KH_H1C_EFIELD;
        size_t ve = i;
        while (ve > vs && (buf[ve - 1] == ' ' || buf[ve - 1] == '\t'))
            ve--;
        kh_str value = {buf + vs, ve - vs};
        i += 2;
        if (h->num_fields >= r->lim.header_fields)
            return KH_H1C_EFIELDS;
        h->fields[h->num_fields].name = name;
        h->fields[h->num_fields].value = value;
        h->num_fields++;

        unsigned char c0 = lower((unsigned char)name.ptr[0]);
        if (c0 == 'c' && ieq(name, "content-length")) {
            uint64_t v = 0;
            int e = parse_cl(value, &v);
            if (e == -1)
                return KH_H1C_EBADCL;
            if (e == -2 || (have_cl && v != cl))
                cl_conflict = 1;
            cl = v;
            have_cl = 1;
        } else if (c0 == 't' && ieq(name, "transfer-encoding")) {
            have_te = 1;
            each_token(value, te_token, &te);
        } else if (c0 == 'c' && ieq(name, "connection")) {
            each_token(value, conn_token, &h->flags);
        }
    }

    /* RFC 9112 §6.3 */
    h->content_length = 0;
    if (cl_conflict)
        return KH_H1C_EFRAMING;
    if (have_te) {
        /* CL with TE is a smuggling vector; so is TE in HTTP/1.0 and chunked applied twice; a
         * coding other than chunked would leave the body encoded in a way we do not decode */
        if (have_cl || h->minor_version == 0 || te.chunked_n != 1 || te.chunked_at != te.count - 1 ||
            te.count != 1)
            return KH_H1C_EFRAMING;
        h->body_kind = KH_H1C_BODY_CHUNKED;
    } else if (have_cl) {
        h->content_length = cl;
        h->body_kind = cl ? KH_H1C_BODY_LENGTH : KH_H1C_BODY_NONE;
    } else {
        h->body_kind = KH_H1C_BODY_CLOSE;
    }
    if (r->no_body || h->status < 200 || h->status == 204 || h->status == 304) {
        h->body_kind = KH_H1C_BODY_NONE;
        h->content_length = 0;
    }
    return 0;
}

/* Finds "\r\n\r\n" in buf[0..n); returns the head length (through it) or 0. */
static size_t head_end(const char *buf, size_t n)
{
    const char *p = buf, *end = buf + n;
    while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        if (p - buf >= 3 && p[-1] == '\r' && p[-2] == '\n' && p[-3] == '\r')
            return (size_t)(p + 1 - buf);
        p++;
    }
    return 0;
}

static int fail(kh_h1c *r, int err)
{
    r->state = S_ERROR;
    return err;
}

static int chunk_err(int e)
{
    switch (e) {
    case KH_H1_EBODYLEN:
        return KH_H1C_EBODYLEN;
    case KH_H1_EHEADLEN:
        return KH_H1C_EHEADLEN;
    case KH_H1_EFIELDS:
        return KH_H1C_EFIELDS;
    default:
        return KH_H1C_ECHUNK;
    }
}

static void finish(kh_h1c *r)
{
    const kh_h1c_head *h = &r->head;
    r->state = S_DONE;
    r->reusable = !(h->flags & KH_H1C_F_CONN_CLOSE) &&
                  (h->minor_version >= 1 || (h->flags & KH_H1C_F_CONN_KEEPALIVE)) &&
                  h->body_kind != KH_H1C_BODY_CLOSE;
}

ssize_t kh_h1c_feed(kh_h1c *r, char *buf, size_t len, int *ev, kh_str *data)
{
    size_t off = 0;
    *ev = KH_H1C_NEED_MORE;
    data->ptr = NULL;
    data->len = 0;

    switch (r->state) {
    case S_ERROR:
        return KH_H1C_ESTATUS; /* misuse: the caller closes after an error */
    case S_DONE:
        *ev = KH_H1C_DONE;
        return 0;
    case S_HEAD:
        for (;;) {
            size_t avail = len - off;
            size_t scan = KH_MIN(avail, r->lim.header_bytes);
            size_t hl = head_end(buf + off, scan);
            if (hl == 0) {
                if (avail > 0)
                    r->seen = 1;
                if (avail >= r->lim.header_bytes)
                    return fail(r, KH_H1C_EHEADLEN);
                return (ssize_t)off; /* 1xx heads already skipped are consumed */
            }
            int e = parse_head(r, buf + off, hl);
            if (e < 0)
                return fail(r, e);
            off += hl;
            if (r->head.status >= 200)
                break;
            if (r->head.status == 101 || ++r->interim > KH_H1C_MAX_INTERIM)
                return fail(r, KH_H1C_EINTERIM);
            r->head.status = 0;
            r->head.num_fields = 0;
        }
        if (r->head.content_length > r->lim.body_bytes)
            return fail(r, KH_H1C_EBODYLEN);
        r->remaining = r->head.content_length;
        r->state = S_BODY;
        *ev = KH_H1C_HEAD;
        return (ssize_t)off;
    case S_BODY:
        break;
    }

    switch (r->head.body_kind) {
    case KH_H1C_BODY_NONE:
        finish(r);
        *ev = KH_H1C_DONE;
        return 0;
    case KH_H1C_BODY_LENGTH: {
        if (r->remaining == 0) {
            finish(r);
            *ev = KH_H1C_DONE;
            return 0;
        }
        size_t n = (size_t)KH_MIN(r->remaining, (uint64_t)len);
        if (n == 0)
            return 0;
        r->remaining -= n;
        r->received += n;
        *data = (kh_str){buf, n};
        *ev = KH_H1C_DATA;
        return (ssize_t)n;
    }
    case KH_H1C_BODY_CLOSE:
        if (len == 0)
            return 0;
        if (r->received + len > r->lim.body_bytes)
            return fail(r, KH_H1C_EBODYLEN);
        r->received += len;
        *data = (kh_str){buf, len};
        *ev = KH_H1C_DATA;
        return (ssize_t)len;
    default: { /* chunked */
        if (r->chunk.done) {
            finish(r);
            *ev = KH_H1C_DONE;
            return 0;
        }
        if (len == 0)
            return 0;
        kh_h1_limits cl = {r->lim.header_bytes, r->lim.header_fields, 0, r->lim.body_bytes};
        size_t out = 0;
        ssize_t used = kh_h1_chunked_decode(&r->chunk, buf, len, &out, &cl);
        if (used < 0)
            return fail(r, chunk_err((int)used));
        r->received += out;
        if (out > 0) {
            *data = (kh_str){buf, out};
            *ev = KH_H1C_DATA;
        } else if (r->chunk.done) {
            finish(r);
            *ev = KH_H1C_DONE;
        }
        return used;
    }
    }
}

int kh_h1c_eof(kh_h1c *r)
{
    switch (r->state) {
    case S_DONE:
        return KH_H1C_DONE;
    case S_HEAD:
        r->state = S_ERROR;
        return r->seen || r->interim > 0 ? KH_H1C_EMIDHEAD : KH_H1C_ENORESP;
    case S_BODY:
        if (r->head.body_kind == KH_H1C_BODY_CLOSE) {
            finish(r);
            r->reusable = 0;
            return KH_H1C_DONE;
        }
        if (r->head.body_kind == KH_H1C_BODY_NONE ||
            (r->head.body_kind == KH_H1C_BODY_LENGTH && r->remaining == 0) ||
            (r->head.body_kind == KH_H1C_BODY_CHUNKED && r->chunk.done)) {
            finish(r);
            r->reusable = 0;
            return KH_H1C_DONE;
        }
        r->state = S_ERROR;
        return KH_H1C_EMIDBODY;
    default:
        return KH_H1C_EMIDBODY;
    }
}

/* ---- request serializer ---- */

static int token_ok(kh_str s)
{
    if (s.len == 0)
        return 0;
    for (size_t i = 0; i < s.len; i++)
        if (!is_tchar((unsigned char)s.ptr[i]))
            return 0;
    return 1;
}

static int target_ok(kh_str s)
{
    if (s.len == 0)
        return 0;
    for (size_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c <= 0x20 || c == 0x7f)
            return 0;
    }
    return 1;
}

static int value_ok(kh_str s)
{
    for (size_t i = 0; i < s.len; i++)
        if (!is_vchar_ws((unsigned char)s.ptr[i]))
            return 0;
    return 1;
}

typedef struct wbuf {
    char *out;
    size_t cap, n;
} wbuf;

static void put(wbuf *w, const char *p, size_t len)
{
    if (len > 0 && w->n + len <= w->cap)
        memcpy(w->out + w->n, p, len);
    w->n += len;
}

static void puts_(wbuf *w, const char *s)
{
    put(w, s, strlen(s));
}

ssize_t kh_h1c_write_request(char *out, size_t cap, kh_str method, kh_str target, kh_str host,
                             const kh_h1_field *fields, size_t num_fields, int64_t body_len,
                             const char **bad)
{
    static const char *const owned[] = {"content-length", "transfer-encoding", "connection",
                                        "upgrade", "te", "keep-alive"};
    const char *dummy;
    if (bad == NULL)
        bad = &dummy;
    *bad = NULL;
    if (!token_ok(method)) {
        *bad = "method";
        return KH_H1C_EREQ;
    }
    if (!target_ok(target)) {
        *bad = "target";
        return KH_H1C_EREQ;
    }
    int has_host = 0;
    for (size_t i = 0; i < num_fields; i++) {
        if (!token_ok(fields[i].name)) {
            *bad = "header name";
            return KH_H1C_EREQ;
        }
        if (!value_ok(fields[i].value)) {
            *bad = "header value";
            return KH_H1C_EREQ;
        }
        for (size_t k = 0; k < KH_ARRAY_LEN(owned); k++)
            if (ieq(fields[i].name, owned[k])) {
                *bad = "header the client sets itself";
                return KH_H1C_EREQ;
            }
        if (ieq(fields[i].name, "host"))
            has_host = 1;
    }
    if (!has_host && (host.len == 0 || !value_ok(host))) {
        *bad = "host";
        return KH_H1C_EREQ;
    }

    wbuf w = {out, cap, 0};
    put(&w, method.ptr, method.len);
    put(&w, " ", 1);
    put(&w, target.ptr, target.len);
    puts_(&w, " HTTP/1.1\r\n");
    if (!has_host) {
        puts_(&w, "Host: ");
        put(&w, host.ptr, host.len);
        puts_(&w, "\r\n");
    }
    for (size_t i = 0; i < num_fields; i++) {
        put(&w, fields[i].name.ptr, fields[i].name.len);
        puts_(&w, ": ");
        put(&w, fields[i].value.ptr, fields[i].value.len);
        puts_(&w, "\r\n");
    }
    if (body_len == KH_H1C_BODY_CHUNKED_LEN) {
        puts_(&w, "Transfer-Encoding: chunked\r\n\r\n");
        return (ssize_t)w.n;
    }
    if (body_len < 0 && (kh_str_eq(method, "POST", 4) || kh_str_eq(method, "PUT", 3) ||
                          kh_str_eq(method, "PATCH", 5)))
        body_len = 0;
    if (body_len >= 0) {
        char num[24];
        size_t k = sizeof(num);
        uint64_t v = (uint64_t)body_len;
        do {
            num[--k] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        puts_(&w, "Content-Length: ");
        put(&w, num + k, sizeof(num) - k);
        puts_(&w, "\r\n");
    }
    puts_(&w, "\r\n");
    return (ssize_t)w.n;
}
