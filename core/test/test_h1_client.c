/* test_h1_client.c: unit tests of the HTTP/1.1 response reader and request serializer.
 * Owns:  the case tables.
 * In:    kh_h1_client.h only (tested through the interface).
 * Out:   TAP. Every response case runs whole, in two pieces split at every point, and byte by
 *        byte, through a driver that keeps unconsumed bytes as a real connection buffer does;
 *        the whole-input run also uses a guarded copy (kh_test_guarded_copy) so an over-read
 *        faults. Each run must give the same verdict, status, body, leftover and reusability.
 * Never: depends on the order of the cases. */
#include "kh_h1_client.h"
#include "kh_test.h"

#define MAXF 16
#define OK 0

static const kh_h1c_limits lim_def = {16384, 100, 1u << 20};
static const kh_h1c_limits lim_small = {64, 3, 10};

typedef struct rcase {
    const char *name;
    const char *in;
    int head_req;   /* request was HEAD */
    int eof;        /* the peer closes after the input */
    const kh_h1c_limits *lim;
    int want_err;   /* OK or a KH_H1C_E* code */
    int status;
    const char *body;
    int reusable;
    size_t leftover; /* bytes after the response (pipelined / lies) */
    int interim;
} rcase;

#define H "HTTP/1.1 200 OK\r\n"

static const rcase rcases[] = {
    {"content-length", H "Content-Length: 5\r\n\r\nhello", 0, 0, NULL, OK, 200, "hello", 1, 0, 0},
    {"no reason phrase", "HTTP/1.1 204\r\n\r\n", 0, 0, NULL, OK, 204, "", 1, 0, 0},
    {"empty reason phrase", "HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n", 0, 0, NULL, OK, 404, "",
     1, 0, 0},
    {"chunked", H "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n",
     0, 0, NULL, OK, 200, "hello world", 1, 0, 0},
    {"chunked with trailer", H "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
     0, 0, NULL, OK, 200, "abc", 1, 0, 0},
    {"read until close", H "X: y\r\n\r\nall of it", 0, 1, NULL, OK, 200, "all of it", 0, 0, 0},
    {"read until close, empty", H "\r\n", 0, 1, NULL, OK, 200, "", 0, 0, 0},
    {"HEAD ignores Content-Length", H "Content-Length: 100\r\n\r\n", 1, 0, NULL, OK, 200, "", 1,
     0, 0},
    {"HEAD ignores chunked", H "Transfer-Encoding: chunked\r\n\r\n", 1, 0, NULL, OK, 200, "", 1,
     0, 0},
    {"304 has no body", "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", 0, 0, NULL, OK,
     304, "", 1, 0, 0},
    {"204 has no body, rest is left over", "HTTP/1.1 204 No Content\r\n\r\nxyz", 0, 0, NULL, OK,
     204, "", 1, 3, 0},
    {"1xx skipped", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" H
                    "Content-Length: 2\r\n\r\nok",
     0, 0, NULL, OK, 200, "ok", 1, 0, 2},
    {"pipelined leftover", H "Content-Length: 2\r\n\r\nokHTTP/1.1", 0, 0, NULL, OK, 200, "ok", 1,
     8, 0},
    {"Connection: close", H "Connection: close\r\nContent-Length: 1\r\n\r\nx", 0, 0, NULL, OK, 200,
     "x", 0, 0, 0},
    {"HTTP/1.0 not reusable", "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", 0, 0, NULL, OK,
     200, "x", 0, 0, 0},
    {"HTTP/1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx",
     0, 0, NULL, OK, 200, "x", 1, 0, 0},
    {"duplicate equal CL", H "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 0, 0, NULL, OK,
     200, "abc", 1, 0, 0},
    {"CL list of equal values", H "Content-Length: 3, 3\r\n\r\nabc", 0, 0, NULL, OK, 200, "abc",
     1, 0, 0},
    {"OWS around value", H "Content-Length:   2  \r\n\r\nab", 0, 0, NULL, OK, 200, "ab", 1, 0, 0},
    /* lies and broken framing */
    {"closed mid-body (CL)", H "Content-Length: 10\r\n\r\nhello", 0, 1, NULL, KH_H1C_EMIDBODY, 0, NULL, 0, 0, 0},
    {"closed mid-body (chunked)", H "Transfer-Encoding: chunked\r\n\r\n5\r\nhel", 0, 1, NULL,
     KH_H1C_EMIDBODY, 0, NULL, 0, 0, 0},
    {"closed mid-head", H "Content-Le", 0, 1, NULL, KH_H1C_EMIDHEAD, 0, NULL, 0, 0, 0},
    {"closed before response", "", 0, 1, NULL, KH_H1C_ENORESP, 0, NULL, 0, 0, 0},
    {"closed after 1xx", "HTTP/1.1 100 Continue\r\n\r\n", 0, 1, NULL, KH_H1C_EMIDHEAD, 0, NULL, 0, 0, 0},
    {"differing CLs", H "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 0, 0, NULL,
     KH_H1C_EFRAMING, 0, NULL, 0, 0, 0},
    {"differing CL list", H "Content-Length: 3, 4\r\n\r\nabcd", 0, 0, NULL, KH_H1C_EFRAMING, 0, NULL, 0, 0, 0},
    {"CL with TE", H "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 0, 0, NULL,
     KH_H1C_EFRAMING, 0, NULL, 0, 0, 0},
    {"TE gzip", H "Transfer-Encoding: gzip\r\n\r\n", 0, 0, NULL, KH_H1C_EFRAMING, 0, NULL, 0, 0, 0},
    {"TE chunked twice", H "Transfer-Encoding: chunked, chunked\r\n\r\n", 0, 0, NULL,
     KH_H1C_EFRAMING, 0, NULL, 0, 0, 0},
    {"TE in HTTP/1.0", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 0, 0, NULL,
     KH_H1C_EFRAMING, 0, NULL, 0, 0, 0},
    {"bad CL", H "Content-Length: 1x\r\n\r\n", 0, 0, NULL, KH_H1C_EBADCL, 0, NULL, 0, 0, 0},
    {"negative CL", H "Content-Length: -1\r\n\r\n", 0, 0, NULL, KH_H1C_EBADCL, 0, NULL, 0, 0, 0},
    {"huge CL", H "Content-Length: 99999999999999999999\r\n\r\n", 0, 0, NULL, KH_H1C_EBADCL, 0, NULL, 0, 0, 0},
    {"bad chunk size", H "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 0, 0, NULL, KH_H1C_ECHUNK, 0, NULL, 0, 0, 0},
    {"chunk data overrun", H "Transfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", 0, 0, NULL,
     KH_H1C_ECHUNK, 0, NULL, 0, 0, 0},
    {"HTTP/2 status line", "HTTP/2 200\r\n\r\n", 0, 0, NULL, KH_H1C_ESTATUS, 0, NULL, 0, 0, 0},
    {"HTTP/2.0", "HTTP/2.0 200 OK\r\n\r\n", 0, 0, NULL, KH_H1C_EVERSION, 0, NULL, 0, 0, 0},
    {"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n", 0, 0, NULL, KH_H1C_ESTATUS, 0, NULL, 0, 0, 0},
    {"status 2 digits", "HTTP/1.1 20 OK\r\n\r\n", 0, 0, NULL, KH_H1C_ESTATUS, 0, NULL, 0, 0, 0},
    {"status 099", "HTTP/1.1 099 OK\r\n\r\n", 0, 0, NULL, KH_H1C_ESTATUS, 0, NULL, 0, 0, 0},
    {"obs-fold", H "X: a\r\n b\r\n\r\n", 0, 0, NULL, KH_H1C_EFIELD, 0, NULL, 0, 0, 0},
    {"space before colon", H "X : a\r\n\r\n", 0, 0, NULL, KH_H1C_EFIELD, 0, NULL, 0, 0, 0},
    {"bare LF in head", H "X: a\nY: b\r\n\r\n", 0, 0, NULL, KH_H1C_EFIELD, 0, NULL, 0, 0, 0},
    {"NUL in value", H "X: a\001b\r\n\r\n", 0, 0, NULL, KH_H1C_EFIELD, 0, NULL, 0, 0, 0},
    {"101 refused", "HTTP/1.1 101 Switching Protocols\r\n\r\n", 0, 0, NULL, KH_H1C_EINTERIM, 0, NULL, 0, 0, 0},
    /* limits */
    {"head too large", H "X: 01234567890123456789012345678901234567890\r\n\r\n", 0, 0, &lim_small,
     KH_H1C_EHEADLEN, 0, NULL, 0, 0, 0},
    {"head never ends", H "X: 01234567890123456789012345678901234567890123456789", 0, 0,
     &lim_small, KH_H1C_EHEADLEN, 0, NULL, 0, 0, 0},
    {"too many fields", H "A: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", 0, 0, &lim_small,
     KH_H1C_EFIELDS, 0, NULL, 0, 0, 0},
    {"CL past body limit", H "Content-Length: 11\r\n\r\n", 0, 0, &lim_small, KH_H1C_EBODYLEN, 0, NULL, 0, 0, 0},
    {"head at header_bytes", H "X: 0123456789012345678901234567890123456789\r\n\r\n", 0, 1,
     &lim_small, OK, 200, "", 0, 0, 0},
    {"CL at body limit", H "Content-Length: 10\r\n\r\n0123456789", 0, 0, &lim_small, OK, 200,
     "0123456789", 1, 0, 0},
    {"chunked past body limit", H "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n", 0, 0,
     &lim_small, KH_H1C_EBODYLEN, 0, NULL, 0, 0, 0},
    {"close-delimited past body limit", H "\r\n01234567890", 0, 1, &lim_small, KH_H1C_EBODYLEN, 0, NULL, 0, 0, 0},
};

typedef struct result {
    int err;
    int status;
    char body[256];
    size_t body_len;
    int reusable;
    size_t leftover;
    int interim;
    int heads;
} result;

/* Feeds in[0..len) in pieces: the first piece ends at split (then step bytes at a time), keeping
 * the unconsumed bytes in a buffer as a connection does. */
static void drive(const rcase *c, char *in, size_t len, size_t split, size_t step, int guarded,
                  result *out)
{
    static char bufstore[4096];
    /* guarded: the reader works on the input itself (a guarded copy), advancing a pointer as a
     * zero-copy caller does, so an over-read past the end faults */
    char *buf = guarded ? in : bufstore;
    static kh_h1_field fields[MAXF];
    kh_h1c r;
    size_t have = 0, fed = 0;
    memset(out, 0, sizeof(*out));
    kh_h1c_init(&r, c->lim ? c->lim : &lim_def, fields, c->head_req);
    int done = 0, first = 1;
    while (!done) {
        size_t piece = first ? split : step;
        first = 0;
        if (piece > len - fed)
            piece = len - fed;
        if (!guarded)
            memcpy(buf + have, in + fed, piece);
        have += piece;
        fed += piece;
        for (;;) {
            int ev;
            kh_str data;
            ssize_t n = kh_h1c_feed(&r, buf, have, &ev, &data);
            if (n < 0) {
                out->err = (int)n;
                return;
            }
            if (ev == KH_H1C_HEAD) {
                out->status = r.head.status;
                out->heads++;
                if (r.head.num_fields > 0 && r.head.fields != fields)
                    out->err = -1;
            } else if (ev == KH_H1C_DATA) {
                if (out->body_len + data.len <= sizeof(out->body))
                    memcpy(out->body + out->body_len, data.ptr, data.len);
                out->body_len += data.len;
            }
            if (guarded)
                buf += n;
            else
                memmove(buf, buf + n, have - (size_t)n);
            have -= (size_t)n;
            if (ev == KH_H1C_DONE) {
                done = 1;
                break;
            }
            if (ev == KH_H1C_NEED_MORE)
                break;
        }
        if (!done && fed == len) {
            if (!c->eof) {
                out->err = 1; /* ran out of input without an end: the case is wrong */
                return;
            }
            int e = kh_h1c_eof(&r);
            if (e != KH_H1C_DONE) {
                out->err = e;
                return;
            }
            done = 1;
        }
    }
    out->reusable = r.reusable;
    out->leftover = have + (len - fed);
    out->interim = r.interim;
}

static int same(const result *a, const result *b)
{
    if (a->err != 0 || b->err != 0) /* body bytes before an error may differ with the split */
        return a->err == b->err;
    return a->err == b->err && a->status == b->status && a->body_len == b->body_len &&
           memcmp(a->body, b->body, KH_MIN(a->body_len, sizeof(a->body))) == 0 &&
           a->reusable == b->reusable && a->leftover == b->leftover && a->heads == b->heads;
}

static void test_responses(void)
{
    for (size_t i = 0; i < KH_ARRAY_LEN(rcases); i++) {
        const rcase *c = &rcases[i];
        size_t len = strlen(c->in);
        void *base;
        size_t map_len;
        char *g = kh_test_guarded_copy(c->in, len, &base, &map_len);
        result whole;
        drive(c, g, len, len, 1, 1, &whole);
        kh_test_guarded_free(base, map_len);
        if (c->want_err != OK) {
            kh_is_int(whole.err, c->want_err, "%s: error %s", c->name, kh_h1c_error_reason(c->want_err));
        } else {
            kh_is_int(whole.err, 0, "%s: no error", c->name);
            kh_is_int(whole.status, c->status, "%s: status", c->name);
            kh_is_str(whole.body, whole.body_len, c->body, "%s: body", c->name);
            kh_is_int(whole.reusable, c->reusable, "%s: reusable", c->name);
            kh_is_int(whole.leftover, c->leftover, "%s: leftover", c->name);
            kh_is_int(whole.interim, c->interim, "%s: interim heads skipped", c->name);
        }
        char copy[4096];
        memcpy(copy, c->in, len);
        int splits_ok = 1;
        for (size_t s = 0; s <= len; s++) {
            result part;
            drive(c, copy, len, s, len, 0, &part);
            if (!same(&part, &whole)) {
                splits_ok = 0;
                printf("#   split at %zu differs (err %d vs %d)\n", s, part.err, whole.err);
                break;
            }
        }
        kh_ok(splits_ok, "%s: same result at every split point", c->name);
        result bytes;
        drive(c, copy, len, 1, 1, 0, &bytes);
        kh_ok(same(&bytes, &whole), "%s: same result byte by byte", c->name);
    }
}

static void test_too_many_interim(void)
{
    char in[2048];
    size_t n = 0;
    for (int i = 0; i <= KH_H1C_MAX_INTERIM; i++)
        n += (size_t)snprintf(in + n, sizeof(in) - n, "HTTP/1.1 100 Continue\r\n\r\n");
    n += (size_t)snprintf(in + n, sizeof(in) - n, H "Content-Length: 0\r\n\r\n");
    rcase c = {"interim flood", in, 0, 0, NULL, KH_H1C_EINTERIM, 0, NULL, 0, 0, 0};
    result r;
    drive(&c, in, n, n, 1, 0, &r);
    kh_is_int(r.err, KH_H1C_EINTERIM, "more than KH_H1C_MAX_INTERIM 1xx heads refused");
}

static void test_started(void)
{
    kh_h1_field f[4];
    kh_h1c r;
    kh_h1c_limits lim = lim_def;
    kh_h1c_init(&r, &lim, f, 0);
    kh_ok(!kh_h1c_started(&r), "fresh reader has not started");
    kh_is_int(kh_h1c_eof(&r), KH_H1C_ENORESP, "EOF at once: closed before response");
    kh_h1c_init(&r, &lim, f, 0);
    char b[] = "HT";
    int ev;
    kh_str d;
    kh_is_int(kh_h1c_feed(&r, b, 2, &ev, &d), 0, "two bytes: nothing consumed");
    kh_ok(kh_h1c_started(&r), "started after a byte");
}

static void test_head_slices(void)
{
    char in[] = H "Content-Type: text/plain\r\nX-Empty:\r\nContent-Length: 0\r\n\r\n";
    kh_h1_field f[8];
    kh_h1c r;
    kh_h1c_init(&r, &lim_def, f, 0);
    int ev;
    kh_str d;
    ssize_t n = kh_h1c_feed(&r, in, strlen(in), &ev, &d);
    kh_is_int(n, strlen(in), "head consumed whole");
    kh_is_int(ev, KH_H1C_HEAD, "head event");
    kh_is_int(r.head.num_fields, 3, "three fields");
    kh_is_str(r.head.reason.ptr, r.head.reason.len, "OK", "reason phrase");
    kh_is_str(f[0].name.ptr, f[0].name.len, "Content-Type", "name case kept");
    kh_is_str(f[0].value.ptr, f[0].value.len, "text/plain", "value");
    kh_is_int(f[1].value.len, 0, "empty value");
    n = kh_h1c_feed(&r, in + n, 0, &ev, &d);
    kh_is_int(ev, KH_H1C_DONE, "CL 0: done without more bytes");
    kh_ok(r.reusable, "reusable");
}

static void test_serializer(void)
{
    char out[512];
    const char *outp = out;
    kh_h1_field f[2] = {{KH_STR_LIT("Accept"), KH_STR_LIT("*/*")},
                        {KH_STR_LIT("X-A"), KH_STR_LIT("b c")}};
    const char *bad;
    ssize_t n = kh_h1c_write_request(out, sizeof(out), KH_STR_LIT("GET"), KH_STR_LIT("/p?q=1"),
                                     KH_STR_LIT("example.com:8080"), f, 2, -1, &bad);
    kh_is_str(outp, n > 0 ? (size_t)n : 0,
              "GET /p?q=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\nX-A: b c\r\n\r\n",
              "GET head");
    n = kh_h1c_write_request(out, sizeof(out), KH_STR_LIT("POST"), KH_STR_LIT("/"),
                             KH_STR_LIT("h"), NULL, 0, 12, &bad);
    kh_is_str(outp, n > 0 ? (size_t)n : 0, "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\n\r\n",
              "POST with a body length");
    n = kh_h1c_write_request(out, sizeof(out), KH_STR_LIT("PUT"), KH_STR_LIT("/"),
                             KH_STR_LIT("h"), NULL, 0, -1, &bad);
    kh_is_str(outp, n > 0 ? (size_t)n : 0, "PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
              "PUT without a body says Content-Length: 0");
    kh_h1_field host[1] = {{KH_STR_LIT("host"), KH_STR_LIT("other")}};
    n = kh_h1c_write_request(out, sizeof(out), KH_STR_LIT("GET"), KH_STR_LIT("/"),
                             KH_STR_LIT("h"), host, 1, -1, &bad);
    kh_is_str(outp, n > 0 ? (size_t)n : 0, "GET / HTTP/1.1\r\nhost: other\r\n\r\n",
              "a Host field replaces the default");
    n = kh_h1c_write_request(out, 10, KH_STR_LIT("GET"), KH_STR_LIT("/"), KH_STR_LIT("h"), NULL,
                             0, -1, &bad);
    kh_is_int(n, strlen("GET / HTTP/1.1\r\nHost: h\r\n\r\n"), "small buffer: the needed length");

    kh_h1_field inj[1] = {{KH_STR_LIT("X"), KH_STR_LIT("a\r\nEvil: 1")}};
    kh_is_int(kh_h1c_write_request(out, sizeof(out), KH_STR_LIT("GET"), KH_STR_LIT("/"),
                                   KH_STR_LIT("h"), inj, 1, -1, &bad),
              KH_H1C_EREQ, "CRLF in a value refused");
    kh_ok(bad && strcmp(bad, "header value") == 0, "names the header value");
    kh_h1_field nm[1] = {{KH_STR_LIT("X Y"), KH_STR_LIT("a")}};
    kh_is_int(kh_h1c_write_request(out, sizeof(out), KH_STR_LIT("GET"), KH_STR_LIT("/"),
                                   KH_STR_LIT("h"), nm, 1, -1, &bad),
              KH_H1C_EREQ, "space in a name refused");
    kh_h1_field te[1] = {{KH_STR_LIT("Transfer-Encoding"), KH_STR_LIT("chunked")}};
    kh_is_int(kh_h1c_write_request(out, sizeof(out), KH_STR_LIT("POST"), KH_STR_LIT("/"),
                                   KH_STR_LIT("h"), te, 1, 3, &bad),
              KH_H1C_EREQ, "Transfer-Encoding refused (the client owns framing)");
    kh_is_int(kh_h1c_write_request(out, sizeof(out), KH_STR_LIT("GET"), KH_STR_LIT("/a b"),
                                   KH_STR_LIT("h"), NULL, 0, -1, &bad),
              KH_H1C_EREQ, "space in the target refused");
    kh_is_int(kh_h1c_write_request(out, sizeof(out), KH_STR_LIT("G(T"), KH_STR_LIT("/"),
                                   KH_STR_LIT("h"), NULL, 0, -1, &bad),
              KH_H1C_EREQ, "non-token method refused");
    kh_is_int(kh_h1c_write_request(out, sizeof(out), KH_STR_LIT("GET"), KH_STR_LIT("/"),
                                   KH_STR_LIT("h\r\nX: 1"), NULL, 0, -1, &bad),
              KH_H1C_EREQ, "CRLF in the host refused");
}

int main(void)
{
    test_responses();
    test_too_many_interim();
    test_started();
    test_head_slices();
    test_serializer();
    return kh_test_done();
}
